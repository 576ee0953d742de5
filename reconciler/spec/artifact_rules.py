"""The rules of a rollout's ``target.artifacts``, ``stage``, ``drain`` and
``warmup`` that its schema cannot say, and the values they become
(``reconciler.spec.artifacts``).

``read`` runs after the schema, whether it passed the document or not: it
skips a field the schema already found wrong (``ok``), builds values only
from parts with no problem inside them (``whole``), and reports each
further problem through ``add``, so every problem keeps its file, line,
column and field, and no document makes it raise. Pure: no IO. Must not
decide anything about a started rollout (the engine does).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from reconciler.spec import runtime_presets, safe_yaml
from reconciler.spec.artifacts import (
    DEFAULT_WARMUP_EXPECT_STATUS,
    DEFAULT_WARMUP_METHOD,
    DEFAULT_WARMUP_TIMEOUT,
    DEFAULT_WARMUP_TIMES,
    SIGNATURE_NAME,
    Artifact,
    Drain,
    Stage,
    Warmup,
)
from reconciler.spec.durations import parse_duration
from reconciler.spec.health import LOCAL_HOST_RULE, is_local_host
from reconciler.spec.slot_port import url_to_check

DEFAULT_DRAIN_TIMEOUT = 300  # seconds: 5m

# scheme://host[:port][/path...]; the host may be [IPv6]; no user:password@.
_URL = re.compile(
    r"^([A-Za-z][A-Za-z0-9+.-]*)://(\[[^\]/]+\]|[^/:?#\s\[\]@]*)(?::([0-9]*))?([/?#]\S*)?$"
)

Path = Sequence[str | int]
Check = Callable[[str], bool]


class Add(Protocol):
    def __call__(self, field_path: Path, message: str, *, at_key: bool = False) -> None: ...


@dataclass(frozen=True)
class Declared:
    """What a rollout declares about its artifacts, ready for ``RolloutSpec``."""

    artifacts: tuple[Artifact, ...] = ()
    stage: Stage | None = None  # set (defaults filled) whenever there are artifacts
    drain: Drain | None = None
    warmup: tuple[Warmup, ...] = ()
    signature: Artifact | None = None  # target.signature, named "signature"
    standby: str | None = None  # spec.standby.keepPrevious (live only)


class _Unread(Exception):
    """A key the values need is absent from a part no problem was found in:
    the schema allows a form these rules do not read."""

    def __init__(self, field_path: Path) -> None:
        super().__init__(safe_yaml.format_field(field_path))
        self.field_path = field_path


def read(spec: Mapping[str, Any], add: Add, ok: Check, whole: Check) -> Declared:
    """The declared values of ``spec`` (a rollout's spec mapping), adding a
    problem for each rule it breaks; the values are meaningless when a
    problem was added.

    The schema may have rejected any part, so a rule looks at a field only
    when ``ok`` (no problem at it or around it) and only through ``get`` and
    a type check; a value is built only from a part that is ``whole`` (no
    problem inside it either: a missing required key is reported inside its
    mapping), and even then a missing key becomes a problem, not a KeyError.
    """
    target = spec.get("target")
    written = target.get("artifacts") if isinstance(target, dict) else None
    try:
        artifacts = _artifacts(written, add, ok, whole) if isinstance(written, list) else ()
        stage = _stage(spec.get("stage"), bool(written), add, ok)
        live = spec.get("live") is True
        drain = _drain(spec.get("drain"), live, add, ok, whole)
        standby_given = spec.get("standby") is not None
        warmup = _warmups(spec.get("warmup"), live, standby_given, add, ok, whole)
        signature = _signature(target, bool(written), add, ok, whole)
        standby = _standby(spec.get("standby"), live, add, ok)
    except _Unread as gap:
        add(
            gap.field_path,
            "missing: this form is allowed by the schema but this version of reconciler "
            "cannot read it; give the field, or upgrade reconciler",
        )
        return Declared()
    return Declared(artifacts, stage, drain, warmup, signature, standby)


# keepPrevious when standby is given without it: the previous slot stays
# warm until the rollout ends, so a rollback of any node can route back.
DEFAULT_KEEP_PREVIOUS = "untilCompleted"


def _standby(value: Any, live: bool, add: Add, ok: Check) -> str | None:
    if value is None:
        return None
    if not live:
        add(
            ["spec", "standby"],
            "standby needs live: true: a dry run starts no slot on the node, so there is "
            "no previous slot to keep warm; set live: true, or remove standby",
            at_key=True,
        )
        return None
    if not isinstance(value, dict) or not ok("spec.standby"):
        return None
    keep = value.get("keepPrevious", DEFAULT_KEEP_PREVIOUS)
    return keep if isinstance(keep, str) else None


def _signature(
    target: Any, has_artifacts: bool, add: Add, ok: Check, whole: Check
) -> Artifact | None:
    """``target.signature``: a file staged like an artifact, only beside artifacts."""
    value = target.get("signature") if isinstance(target, dict) else None
    where: list[str | int] = ["spec", "target", "signature"]
    if value is None or not ok(safe_yaml.format_field(where)):
        return None
    if not has_artifacts:
        add(
            where,
            "a signature vouches for target.artifacts: list the files it signs under "
            "target.artifacts, or remove signature",
            at_key=True,
        )
        return None
    url = value.get("url") if isinstance(value, dict) else None
    why = _url_problem(url) if isinstance(url, str) and _ok_at(ok, where, "url") else ""
    if why:
        add([*where, "url"], why)
    if not isinstance(value, dict) or not whole(safe_yaml.format_field(where)):
        return None
    return Artifact(
        SIGNATURE_NAME, _need(value, "url", where), _need(value, "sha256", where),
        _need(value, "size", where),
    )  # fmt: skip


def _need(part: Mapping[str, Any], key: str, field_path: Path) -> Any:
    """``part[key]`` of a whole part; ``_Unread`` when the key is absent."""
    if key not in part:
        raise _Unread([*field_path, key])
    return part[key]


def _artifacts(items: list[Any], add: Add, ok: Check, whole: Check) -> tuple[Artifact, ...]:
    found: list[Artifact] = []
    seen: dict[str, int] = {}
    for index, item in enumerate(items):
        where: list[str | int] = ["spec", "target", "artifacts", index]
        if not isinstance(item, dict) or not ok(safe_yaml.format_field(where)):
            continue
        name, url, size = item.get("name"), item.get("url"), item.get("size")
        if isinstance(name, str) and _ok_at(ok, where, "name"):
            if name in seen:
                add(
                    [*where, "name"],
                    f"artifact name {name!r} is used twice (also entry {seen[name] + 1}): "
                    "give each artifact its own name",
                )
            seen.setdefault(name, index)
            _path_clash(item, where, found, add, ok)
        why = _url_problem(url) if isinstance(url, str) and _ok_at(ok, where, "url") else ""
        if why:
            add([*where, "url"], why)
        if isinstance(size, float) and _ok_at(ok, where, "size"):
            add(
                [*where, "size"],
                f"must be a whole number of bytes, got {size!r}: write it without a "
                "decimal point or exponent, such as 4920734976",
            )
        if whole(safe_yaml.format_field(where)):
            found.append(
                Artifact(
                    _need(item, "name", where),
                    _need(item, "url", where),
                    _need(item, "sha256", where),
                    _need(item, "size", where),
                    item.get("path", ""),
                )
            )
    return tuple(found)


def _ok_at(ok: Check, where: Path, key: str) -> bool:
    return ok(safe_yaml.format_field([*where, key]))


def _path_clash(
    item: Mapping[str, Any],
    where: list[str | int],
    earlier: Sequence[Artifact],
    add: Add,
    ok: Check,
) -> None:
    """A problem when this artifact's place in the model directory is taken
    by an earlier one, or is a folder of one or inside one."""
    field = [*where, "path"] if "path" in item else [*where, "name"]
    if not ok(safe_yaml.format_field(field)):
        return
    mine = item.get("path") or item.get("name")
    if not isinstance(mine, str):
        return
    for other in earlier:
        theirs = other.layout_path
        if mine == theirs:
            add(
                field,
                f"the model directory path {mine!r} is taken by artifact {other.name!r}: "
                "give each artifact its own path",
            )
        elif theirs.startswith(mine + "/") or mine.startswith(theirs + "/"):
            add(
                field,
                f"the model directory path {mine!r} and {theirs!r} (artifact {other.name!r}) "
                "would make one file a folder of the other: change one of them",
            )


def _stage(value: Any, has_artifacts: bool, add: Add, ok: Check) -> Stage | None:
    if value is None:
        return Stage() if has_artifacts else None
    if not has_artifacts:
        add(
            ["spec", "stage"],
            "stage needs target.artifacts: there is nothing to download ahead; "
            "list the files under target.artifacts, or remove stage",
            at_key=True,
        )
        return None
    if not isinstance(value, dict) or not ok("spec.stage"):
        return None
    base = Stage()
    timeout = _duration(["spec", "stage", "timeout"], value.get("timeout"), add, ok)
    return Stage(
        ahead=value.get("ahead", base.ahead),
        max_concurrent=value.get("maxConcurrent", base.max_concurrent),
        timeout_seconds=base.timeout_seconds if timeout is None else timeout,
    )


def _only_live(field: str, what: str, add: Add) -> None:
    add(
        ["spec", field],
        f"{field} needs live: true: a dry run changes nothing on the node, so there is "
        f"nothing to {what}; set live: true, or remove {field}",
        at_key=True,
    )


def _drain(value: Any, live: bool, add: Add, ok: Check, whole: Check) -> Drain | None:
    if value is None:
        return None
    if not live:
        _only_live("drain", "drain", add)
        return None
    if not isinstance(value, dict) or not ok("spec.drain"):
        return None
    timeout = _duration(["spec", "drain", "timeout"], value.get("timeout"), add, ok)
    idle = value.get("idle")
    if not isinstance(idle, dict) or not ok("spec.drain.idle"):
        return None
    url = None if "runtime" in idle else idle.get("url")
    why = local_url_problem(url) if isinstance(url, str) and ok("spec.drain.idle.url") else ""
    if why:
        add(["spec", "drain", "idle", "url"], why)
    if not whole("spec.drain"):
        return None
    seconds = DEFAULT_DRAIN_TIMEOUT if timeout is None else timeout
    where: list[str | int] = ["spec", "drain", "idle"]
    if "runtime" in idle:
        if not _preset_fields(idle, where, ("url", "metric"), add):
            return None
        runtime = idle["runtime"]
        return Drain(
            seconds,
            runtime_presets.metrics_url(_need(idle, "port", where)),
            runtime_presets.PRESETS[runtime].idle_metrics,
            idle.get("max", 0),
            runtime,
        )
    if not _needs(idle, where, "url", "metric", add) or not _needs(
        idle, where, "metric", "url", add
    ):
        return None
    metric = _need(idle, "metric", where)
    return Drain(
        timeout_seconds=seconds,
        idle_url=_need(idle, "url", where),
        idle_metric=tuple(metric) if isinstance(metric, list) else metric,
        idle_max=idle.get("max", 0),
    )


def _needs(
    value: Mapping[str, Any], where: list[str | int], given: str, wanted: str, add: Add
) -> bool:
    """False (with a problem) when ``given`` is there without ``wanted``."""
    if given in value and wanted not in value:
        add(where, f"{given} needs {wanted}: add {wanted}")
        return False
    return True


def _preset_fields(
    value: Mapping[str, Any], where: list[str | int], refused: Sequence[str], add: Add
) -> bool:
    """A preset (``runtime``) needs ``port`` and takes none of ``refused``,
    which it sets itself; False (with problems) when that is not so."""
    fine = True
    for field in refused:
        if field in value:
            add(
                [*where, field],
                f"runtime {value['runtime']} sets {field} itself: remove {field}, "
                "or write it out without runtime",
                at_key=True,
            )
            fine = False
    if "port" not in value:
        add(where, "runtime needs port: add the runtime's port on this node, such as port: 8000")
        fine = False
    return fine and value["runtime"] in runtime_presets.PRESETS and isinstance(value["port"], int)


def _warmups(
    value: Any, live: bool, standby: bool, add: Add, ok: Check, whole: Check
) -> tuple[Warmup, ...]:
    if value is None:
        return ()
    if not live:
        _only_live("warmup", "warm up", add)
        return ()
    if not isinstance(value, list) or not ok("spec.warmup"):
        return ()
    found: list[Warmup] = []
    for index, item in enumerate(value):
        entry: list[str | int] = ["spec", "warmup", index]
        where: list[str | int] = [*entry, "http"]
        if not isinstance(item, dict) or not ok(safe_yaml.format_field(entry)):
            continue
        if "runtime" in item:
            preset = _preset_warmup(item, entry, add, ok)
            if preset is not None and whole(safe_yaml.format_field(entry)):
                found.append(preset)
            continue
        if "port" in item or "timeout" in item:
            wrong = "port" if "port" in item else "timeout"
            instead = "write the port in http.url" if wrong == "port" else "write it under http"
            add(
                [*entry, wrong],
                f"{wrong} goes with runtime; for an http warm-up {instead}",
                at_key=True,
            )
        http = item.get("http")
        url = http.get("url") if isinstance(http, dict) else None
        why = ""
        if isinstance(url, str) and _ok_at(ok, where, "url"):
            checked, why = url_to_check(url, standby)
            why = why or local_url_problem(checked)
        if why:
            add([*where, "url"], why)
        timeout = None
        if isinstance(http, dict):
            timeout = _duration([*where, "timeout"], http.get("timeout"), add, ok)
        if not whole(safe_yaml.format_field(entry)):
            continue
        http = _need(item, "http", entry)
        found.append(
            Warmup(
                url=_need(http, "url", where),
                method=http.get("method", DEFAULT_WARMUP_METHOD),
                body=http.get("body", ""),
                expect_status=http.get("expectStatus", DEFAULT_WARMUP_EXPECT_STATUS),
                timeout_seconds=DEFAULT_WARMUP_TIMEOUT if timeout is None else timeout,
                times=item.get("times", DEFAULT_WARMUP_TIMES),
            )
        )
    return tuple(found)


def _preset_warmup(
    item: Mapping[str, Any], where: list[str | int], add: Add, ok: Check
) -> Warmup | None:
    if not _preset_fields(item, where, ("http",), add):
        return None
    timeout = _duration([*where, "timeout"], item.get("timeout"), add, ok)
    return Warmup(
        url=runtime_presets.warmup_url(item["port"]),
        method=runtime_presets.WARMUP_METHOD,
        body=runtime_presets.WARMUP_BODY,
        expect_status=runtime_presets.WARMUP_EXPECT_STATUS,
        timeout_seconds=DEFAULT_WARMUP_TIMEOUT if timeout is None else timeout,
        times=item.get("times", DEFAULT_WARMUP_TIMES),
        runtime=item["runtime"],
    )


def _duration(field_path: Path, value: Any, add: Add, ok: Check) -> int | None:
    if not isinstance(value, str) or not ok(safe_yaml.format_field(field_path)):
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        add(field_path, str(exc))
        return None


def _url_problem(url: str) -> str:
    """Empty when ``url`` is one an agent can download from; else what to fix."""
    match = _URL.match(url)
    if match is None or match.group(1).lower() not in ("http", "https"):
        return (
            f"must be an http:// or https:// URL with a host, such as "
            f"https://mirror.example/llama3.1-8b/model.gguf; got {url!r}"
        )
    port = match.group(3)
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        return f"has no valid port (1 to 65535): {url!r}"
    if not match.group(2):
        return f"has no host: {url!r}"
    return ""


def local_url_problem(url: str) -> str:
    """Empty when ``url`` is on the node itself, as a warm-up request or an
    idle metric must be; else what to fix."""
    why = _url_problem(url)
    if why:
        return why
    match = _URL.match(url)
    assert match is not None
    host = match.group(2)
    if not is_local_host(host):
        return f"an agent asks only its own node: the host {host!r} must be {LOCAL_HOST_RULE}"
    return ""
