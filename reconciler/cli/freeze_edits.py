"""``freeze`` and ``unfreeze`` as edits to ``reconciler.yaml``'s
``spec.freezes`` in a working tree (docs/rollouts.md, "Deploy windows and
freezes").

A freeze is added as one more item of the list; ending freezes rewrites
only their ``to`` values. Everything else in the file (comments, key order,
quoting, the other freezes) stays byte for byte, as the intent verbs keep a
rollout file: positions come from ruamel.yaml's round-trip composer, the
characters are replaced there, and both texts are re-read to prove that
nothing but the intended values changed. The result is checked as the
daemon reads it, so an edit never leaves a settings file it would refuse.

Must not: decide when batches start (the engine does), read the clock (the
caller passes ``now``), or touch Git.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from ruamel.yaml.nodes import MappingNode, Node, SequenceNode

from reconciler.cli.intent_edits import (
    Edit,
    flow_text,
    line_end,
    load_data,
    node_end,
    set_spec_fields,
)
from reconciler.spec.documents import parse_file
from reconciler.spec.errors import ReconcilerError
from reconciler.spec.paths import SETTINGS_PATH
from reconciler.spec.times import format_time, parse_time

# A reconciler.yaml written from nothing: every other setting keeps its default.
NEW_SETTINGS = "apiVersion: reconciler/v1\nkind: Settings\n"


@dataclass(frozen=True)
class SettingsFile:
    """``reconciler.yaml`` as found in a working tree (``text`` is empty when
    the file does not exist yet)."""

    root: Path
    text: str

    @property
    def name(self) -> str:
        return SETTINGS_PATH

    @property
    def path(self) -> Path:
        return self.root / SETTINGS_PATH

    @property
    def relpath(self) -> str:
        return SETTINGS_PATH


def load_settings(root: Path) -> SettingsFile:
    """The settings file of the working tree at ``root``; refused, naming the
    first problem, when the daemon could not read it as it is."""
    path = root / SETTINGS_PATH
    if not path.is_file():
        return SettingsFile(root, "")
    data = path.read_bytes()
    check_settings(data, "fix it first, then run the command again")
    return SettingsFile(root, data.decode("utf-8"))


def check_settings(data: bytes, what_to_do: str) -> None:
    parsed = parse_file(SETTINGS_PATH, data)
    if parsed.problems:
        more = len(parsed.problems) - 1
        raise ReconcilerError(
            f"{parsed.problems[0]}" + (f" (and {more} more problems)" if more else ""),
            hint=f"{what_to_do}; `reconciler validate` lists every problem",
        )


def freeze(root: Path, *, now: datetime, until: datetime, reason: str) -> Edit:
    """Add ``{from: now, to: until, reason}`` to ``spec.freezes``."""
    settings = load_settings(root)
    item = {"from": format_time(now), "to": format_time(until), "reason": reason}
    text = settings.text or NEW_SETTINGS
    items = _freeze_items(text)
    notes = [
        f"already frozen until {entry['to']}" + (f" ({entry['reason']})" if entry["reason"] else "")
        for entry in _in_force(items, now)
    ]
    after = _append_item(text, item)
    _prove(settings, after, [*(e["data"] for e in items), item])
    change = f"spec.freezes: + {flow_text(item)}"
    return Edit(rollout=settings, verb="freeze", after=after, changes=(change,), notes=tuple(notes))


def unfreeze(root: Path, *, now: datetime) -> Edit:
    """Set the ``to`` of every freeze in force at ``now`` to ``now``; freezes
    that ended or start later stay as they are."""
    settings = load_settings(root)
    items = _freeze_items(settings.text) if settings.text else []
    ending = _in_force(items, now)
    if not ending:
        later = [e for e in items if e["start"] > now]
        note = "no freeze is in force now" + (
            f"; {len(later)} start later and stay (the next at {later[0]['data']['from']})"
            if later
            else ""
        )
        return Edit(
            rollout=settings, verb="unfreeze", after=settings.text, changes=(), notes=(note,)
        )
    after = settings.text
    expected = [dict(e["data"]) for e in items]
    changes = []
    # From the end of the file backwards, so earlier positions stay valid.
    for entry in sorted(ending, key=lambda e: -int(e["to_node"].start_mark.index)):
        end = max(now, entry["start"] + timedelta(microseconds=1))
        node = entry["to_node"]
        start, stop = node.start_mark.index, node_end(node, after)
        after = after[:start] + flow_text(format_time(end), node) + after[stop:]
        expected[entry["index"]]["to"] = format_time(end)
        changes.append(
            f"spec.freezes[{entry['index']}].to: {entry['data']['to']} -> {format_time(end)}"
        )
    _prove(settings, after, expected)
    return Edit(rollout=settings, verb="unfreeze", after=after, changes=tuple(reversed(changes)))


def _compose(text: str) -> Node | None:
    from ruamel.yaml import YAML

    return YAML(typ="rt").compose(text)


def _spec_node(text: str) -> MappingNode | None:
    root = _compose(text)
    if not isinstance(root, MappingNode):
        return None
    spec = next((v for k, v in root.value if k.value == "spec"), None)
    return spec if isinstance(spec, MappingNode) else None


def _freezes_node(text: str) -> Node | None:
    spec = _spec_node(text)
    if spec is None:
        return None
    return next((v for k, v in spec.value if k.value == "freezes"), None)


def _freeze_items(text: str) -> list[dict[str, Any]]:
    """Each freeze of the (valid) file: its index, plain data, start, end and
    the node of its ``to`` value."""
    node = _freezes_node(text)
    if not isinstance(node, SequenceNode):
        return []
    data = load_data(text, SETTINGS_PATH)["spec"]["freezes"]
    found = []
    for index, (item, plain) in enumerate(zip(node.value, data, strict=True)):
        to_node = next((v for k, v in item.value if k.value == "to"), None)
        found.append(
            {
                "index": index,
                "data": plain,
                "reason": plain.get("reason", ""),
                "to": plain["to"],
                "start": parse_time(str(plain["from"])),
                "end": parse_time(str(plain["to"])),
                "to_node": to_node,
            }
        )
    return found


def _in_force(items: list[dict[str, Any]], now: datetime) -> list[dict[str, Any]]:
    return [e for e in items if e["start"] <= now < e["end"]]


def _append_item(text: str, item: dict[str, str]) -> str:
    """``text`` with ``item`` as the last freeze, the list's own style kept."""
    spec = _spec_node(text)
    block = "freezes:\n    - " + flow_text(item)
    if spec is None:
        # A valid file without spec (an empty spec is refused before this).
        separator = "" if text.endswith("\n") or not text else "\n"
        return text + separator + "spec:\n  " + block + "\n"
    if not spec.value:
        if spec.flow_style:
            return set_spec_fields(text, {"freezes": [item]}, source=SETTINGS_PATH)
        return text.rstrip("\n") + "\n  " + block + "\n"
    node = _freezes_node(text)
    if not isinstance(node, SequenceNode) or not node.value:
        return set_spec_fields(text, {"freezes": [item]}, source=SETTINGS_PATH)
    if node.flow_style:
        close = node.end_mark.index - 1
        return text[:close].rstrip() + ", " + flow_text(item) + text[close:]
    newline = "\r\n" if "\r\n" in text else "\n"
    at = line_end(text, node_end(node.value[-1], text))
    dash = " " * node.start_mark.column
    return text[:at] + newline + dash + "- " + flow_text(item) + text[at:]


def _prove(settings: SettingsFile, after: str, freezes: list[dict[str, Any]]) -> None:
    """Refuse an edit that changed anything but ``spec.freezes``, or that the
    daemon would not read."""
    before = load_data(settings.text or NEW_SETTINGS, SETTINGS_PATH) or {}
    expected = json.loads(json.dumps(before, default=str))
    if not isinstance(expected.get("spec"), dict):
        expected["spec"] = {}
    expected["spec"]["freezes"] = json.loads(json.dumps(freezes, default=str))
    if json.loads(json.dumps(load_data(after, SETTINGS_PATH), default=str)) != expected:
        raise ReconcilerError(
            f"{SETTINGS_PATH}: could not edit spec.freezes without changing something else",
            hint="edit the file by hand",
        )
    check_settings(after.encode("utf-8"), "this is a bug: edit the file by hand")
