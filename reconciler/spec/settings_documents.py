"""The rules of the settings file (``settings.yaml``) that its schema
cannot say, each reported at its field, and the values they read: deploy
windows and freezes (docs/operating.md), notification receivers, approval
rules (docs/approval-rules.md) and model signers (docs/rollouts.md).

``documents`` calls these with its checker's ``add`` (report a problem at a
field), ``ok`` (no problem yet at or around a field) and ``whole`` (nor
inside it). Must not: read files.
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Iterator, Mapping
from datetime import tzinfo
from typing import Any

from reconciler.spec import signer_keys
from reconciler.spec.artifact_rules import Add, Check
from reconciler.spec.artifacts import ModelSigner
from reconciler.spec.model import NOTIFICATION_EVENTS, ApprovalRule, Freeze, Receiver, Window
from reconciler.spec.times import parse_time
from reconciler.spec.value_words import did_you_mean, show

DAY_NUMBERS = {"mon": 0, "tue": 1, "wed": 2, "thu": 3, "fri": 4, "sat": 5, "sun": 6}


def windows(spec: Mapping[str, Any], add: Add, ok: Check) -> tuple[Window, ...]:
    """``spec.windows`` after the schema: days of the week, a window that
    closes after it opens, a known time zone."""
    found: list[Window] = []
    entries = spec.get("windows")
    if not isinstance(entries, list) or not ok("spec.windows"):
        return ()
    for index, item in enumerate(entries):
        where: list[str | int] = ["spec", "windows", index]
        if not isinstance(item, dict):
            continue
        days: set[int] = set()
        for k, day in enumerate(item.get("days", ())):
            if not isinstance(day, str):
                continue
            number = DAY_NUMBERS.get(day.lower())
            if number is None:
                guess = did_you_mean(day, DAY_NUMBERS)
                hint = f"did you mean {guess}?" if guess else "write " + ", ".join(DAY_NUMBERS)
                add(
                    [*where, "days", k],
                    f"{show(day)} is not a day of the week; {hint}",
                )
            else:
                days.add(number)
        start, end = item.get("from"), item.get("to")
        begin = _minutes(start) if isinstance(start, str) else None
        finish = _minutes(end) if isinstance(end, str) else None
        if begin is not None and finish is not None and finish <= begin:
            add(
                [*where, "to"],
                f"the window closes at {end}, not after it opens at {start}: a window "
                "lies within one day; for a window past midnight write two windows "
                '(one to "24:00", one from "00:00" on the next days)',
            )
        zone_name = item.get("timezone")
        zone = None
        if isinstance(zone_name, str):
            zone = _zone(zone_name)
            if zone is None:
                add(
                    [*where, "timezone"],
                    f"unknown time zone {show(zone_name)}: write an IANA zone name "
                    "such as Europe/Berlin, America/New_York or UTC",
                )
        if zone is not None and begin is not None and finish is not None and days:
            assert isinstance(zone_name, str)
            found.append(Window(frozenset(days), begin, finish, zone_name, zone))
    return tuple(found)


def freezes(spec: Mapping[str, Any], add: Add, ok: Check) -> tuple[Freeze, ...]:
    """``spec.freezes`` after the schema: real times, and an end after the
    beginning."""
    found: list[Freeze] = []
    entries = spec.get("freezes")
    if not isinstance(entries, list) or not ok("spec.freezes"):
        return ()
    for index, item in enumerate(entries):
        if not isinstance(item, dict):
            continue
        moments: list[Any] = []
        for key in ("from", "to"):
            try:
                moments.append(parse_time(str(item.get(key))))
            except (ValueError, TypeError):
                if ok(f"spec.freezes[{index}].{key}"):
                    add(
                        ["spec", "freezes", index, key],
                        f"{show(item.get(key))} is not a real time: check the date and "
                        "the time of day (such as 2026-12-24T00:00:00Z)",
                    )
        if len(moments) == 2:
            if moments[1] <= moments[0]:
                add(
                    ["spec", "freezes", index, "to"],
                    f"the freeze ends at {item['to']}, not after it begins at "
                    f"{item['from']}: put to after from",
                )
            else:
                found.append(Freeze(moments[0], moments[1], item.get("reason", "")))
    return tuple(found)


def receivers(entries: Any, add: Add, ok: Check, whole: Check) -> tuple[Receiver, ...]:
    """``spec.notifications`` (docs/operating.md), after the schema:
    unique names and known event names, each problem naming the receiver."""
    if not isinstance(entries, list) or not ok("spec.notifications"):
        return ()
    receivers: list[Receiver] = []
    for at, name, entry in _named_entries(entries, "notifications", "receiver", add, whole):
        events = entry.get("events", NOTIFICATION_EVENTS)
        for position, event in enumerate(events):
            if event not in NOTIFICATION_EVENTS:
                add(
                    [*at, "events", position],
                    f"receiver {show(name)}: unknown event {show(event)}; "
                    f"use one of {', '.join(NOTIFICATION_EVENTS)}",
                )
        receivers.append(
            Receiver(
                name=name,
                url_env=entry["urlEnv"],
                format=entry.get("format", "json"),
                secret_env=entry.get("secretEnv"),
                events=tuple(dict.fromkeys(events)),
                rollouts=tuple(entry.get("rollouts", ())),
            )
        )
    return tuple(receivers)


def approval_rules(entries: Any, add: Add, ok: Check, whole: Check) -> tuple[ApprovalRule, ...]:
    """``spec.approvalRules`` (docs/approval-rules.md), after the schema:
    unique names, each rule covering nodes or settings, and no rule
    asking for more approvals than it has people."""
    if not isinstance(entries, list) or not ok("spec.approvalRules"):
        return ()
    rules: list[ApprovalRule] = []
    for at, name, entry in _named_entries(entries, "approvalRules", "approval rule", add, whole):
        nodes = entry.get("nodes")
        settings = entry.get("settings", False)
        if nodes is None and not settings:
            add(
                at,
                f"approval rule {show(name)} covers nothing: give nodes "
                "({selector: {...}} or {nodeIds: [...]}) or settings: true",
            )
            continue
        if nodes is not None and ("selector" in nodes) == ("nodeIds" in nodes):
            add(
                [*at, "nodes"],
                f"approval rule {show(name)}: give exactly one of selector "
                "(match nodes by labels) or nodeIds (list nodes by name)",
            )
            continue
        principals = tuple(dict.fromkeys(entry["principals"]))
        if entry["require"] > len(principals):
            add(
                [*at, "require"],
                f"approval rule {show(name)} requires {entry['require']} approvals but "
                f"names {len(principals)} principal{'s' if len(principals) != 1 else ''}: "
                "lower require or add principals",
            )
            continue
        selector = None if nodes is None else nodes.get("selector")
        node_ids = None if nodes is None else nodes.get("nodeIds")
        rules.append(
            ApprovalRule(
                name=name,
                principals=principals,
                require=entry["require"],
                selector=None if selector is None else tuple(sorted(selector.items())),
                node_ids=None if node_ids is None else tuple(dict.fromkeys(node_ids)),
                settings=bool(settings),
            )
        )
    return tuple(rules)


def model_signers(
    spec: Mapping[str, Any], add: Add, ok: Check, whole: Check
) -> tuple[ModelSigner, ...]:
    """``spec.modelSigners`` (docs/rollouts.md) after the schema: unique
    names, and every key an EC public key on P-256 or P-384."""
    entries = spec.get("modelSigners")
    if not isinstance(entries, list) or not ok("spec.modelSigners"):
        return ()
    signers: list[ModelSigner] = []
    for at, name, entry in _named_entries(entries, "modelSigners", "signer", add, whole):
        why = signer_keys.key_problem(entry["publicKey"])
        if why:
            add([*at, "publicKey"], f"signer {show(name)}: the key {why}")
            continue
        signers.append(ModelSigner(name, entry["publicKey"], tuple(entry.get("models", ("*",)))))
    return tuple(signers)


def _named_entries(
    entries: list[Any], field: str, what: str, add: Add, whole: Check
) -> Iterator[tuple[list[str | int], str, dict[str, Any]]]:
    """(path, name, entry) of each entry of ``spec.FIELD`` the schema took
    whole, the first of each name only; a name given twice is reported at
    the later entry, calling each a ``what``."""
    seen: dict[str, int] = {}
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or not whole(f"spec.{field}[{index}]"):
            continue  # the schema's problem is reported already
        at: list[str | int] = ["spec", field, index]
        name = entry["name"]
        if name in seen:
            add(
                [*at, "name"],
                f"{what} {show(name)} is named twice (also entry {seen[name] + 1}): "
                f"give every {what} its own name",
            )
            continue
        seen[name] = index
        yield at, name, entry


def _minutes(text: str) -> int | None:
    """Minutes after midnight of ``HH:MM`` (the schema checked the form)."""
    try:
        hours, minutes = text.split(":")
        return int(hours) * 60 + int(minutes)
    except ValueError:
        return None


def _zone(name: str) -> tzinfo | None:
    """The IANA zone ``name`` from the zone database (the ``tzdata`` package
    when the system has none), or None when there is no such zone."""
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return None
