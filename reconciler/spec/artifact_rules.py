"""The rules of a rollout's ``target.artifacts``, ``stage``, ``drain`` and
``warmup`` that its schema cannot say, and the values they become
(``reconciler.spec.artifacts``).

``read`` runs after the schema: it skips a field the schema already found
wrong (``ok``) and reports each further problem through ``add``, so every
problem keeps its file, line, column and field. Pure: no IO. Must not
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
    Artifact,
    Drain,
    Stage,
    Warmup,
)
from reconciler.spec.durations import parse_duration
from reconciler.spec.health import LOCAL_HOST_RULE, is_local_host

DEFAULT_DRAIN_TIMEOUT = 300  # seconds: 5m

# scheme://host[:port][/path...]; the host may be [IPv6]; no user:password@.
_URL = re.compile(
    r"^([A-Za-z][A-Za-z0-9+.-]*)://(\[[^\]/]+\]|[^/:?#\s\[\]@]*)(?::([0-9]*))?([/?#]\S*)?$"
)

Path = Sequence[str | int]


class Add(Protocol):
    def __call__(self, field_path: Path, message: str, *, at_key: bool = False) -> None: ...


@dataclass(frozen=True)
class Declared:
    """What a rollout declares about its artifacts, ready for ``RolloutSpec``."""

    artifacts: tuple[Artifact, ...] = ()
    stage: Stage | None = None  # set (defaults filled) whenever there are artifacts
    drain: Drain | None = None
    warmup: tuple[Warmup, ...] = ()


def read(spec: Mapping[str, Any], add: Add, ok: Callable[[str], bool]) -> Declared:
    """The declared values of ``spec`` (a rollout's spec mapping), adding a
    problem for each rule it breaks; the values are meaningless when a
    problem was added."""
    target = spec.get("target")
    written = target.get("artifacts") if isinstance(target, dict) else None
    artifacts = _artifacts(written, add, ok) if isinstance(written, list) else ()
    stage = _stage(spec.get("stage"), bool(written), add, ok)
    live = spec.get("live") is True
    drain = _drain(spec.get("drain"), live, add, ok)
    warmup = _warmups(spec.get("warmup"), live, add, ok)
    return Declared(artifacts, stage, drain, warmup)


def _artifacts(items: list[Any], add: Add, ok: Callable[[str], bool]) -> tuple[Artifact, ...]:
    found: list[Artifact] = []
    seen: dict[str, int] = {}
    for index, item in enumerate(items):
        where: list[str | int] = ["spec", "target", "artifacts", index]
        if not isinstance(item, dict) or not ok(f"spec.target.artifacts[{index}]"):
            continue
        name, url, size = item["name"], item["url"], item["size"]
        if name in seen:
            add(
                [*where, "name"],
                f"artifact name {name!r} is used twice (also entry {seen[name] + 1}): "
                "give each artifact its own name",
            )
        seen.setdefault(name, index)
        _path_clash(item, where, found, add, ok)
        why = _url_problem(url) if ok(safe_yaml.format_field([*where, "url"])) else ""
        if why:
            add([*where, "url"], why)
        if isinstance(size, float) and ok(safe_yaml.format_field([*where, "size"])):
            add(
                [*where, "size"],
                f"must be a whole number of bytes, got {size!r}: write it without a "
                "decimal point or exponent, such as 4920734976",
            )
            continue
        found.append(Artifact(name, url, item["sha256"], size, item.get("path", "")))
    return tuple(found)


def _path_clash(
    item: Mapping[str, Any],
    where: list[str | int],
    earlier: Sequence[Artifact],
    add: Add,
    ok: Callable[[str], bool],
) -> None:
    """A problem when this artifact's place in the model directory is taken
    by an earlier one, or is a folder of one or inside one."""
    field = [*where, "path"] if "path" in item else [*where, "name"]
    if not ok(safe_yaml.format_field(field)):
        return
    mine = item.get("path") or item["name"]
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


def _stage(value: Any, has_artifacts: bool, add: Add, ok: Callable[[str], bool]) -> Stage | None:
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


def _drain(value: Any, live: bool, add: Add, ok: Callable[[str], bool]) -> Drain | None:
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
    seconds = DEFAULT_DRAIN_TIMEOUT if timeout is None else timeout
    where: list[str | int] = ["spec", "drain", "idle"]
    if "runtime" in idle:
        if not _preset_fields(idle, where, ("url", "metric"), add):
            return None
        runtime = idle["runtime"]
        return Drain(
            seconds,
            runtime_presets.metrics_url(idle["port"]),
            runtime_presets.PRESETS[runtime].idle_metrics,
            idle.get("max", 0),
            runtime,
        )
    if not _needs(idle, where, "url", "metric", add) or not _needs(
        idle, where, "metric", "url", add
    ):
        return None
    why = local_url_problem(idle["url"]) if ok("spec.drain.idle.url") else ""
    if why:
        add([*where, "url"], why)
    metric = idle["metric"]
    return Drain(
        timeout_seconds=seconds,
        idle_url=idle["url"],
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


def _warmups(value: Any, live: bool, add: Add, ok: Callable[[str], bool]) -> tuple[Warmup, ...]:
    if value is None:
        return ()
    if not live:
        _only_live("warmup", "warm up", add)
        return ()
    if not isinstance(value, list) or not ok("spec.warmup"):
        return ()
    found: list[Warmup] = []
    for index, item in enumerate(value):
        where: list[str | int] = ["spec", "warmup", index, "http"]
        if not isinstance(item, dict) or not ok(f"spec.warmup[{index}]"):
            continue
        if "runtime" in item:
            preset = _preset_warmup(item, where[:-1], add, ok)
            if preset is not None:
                found.append(preset)
            continue
        if "port" in item or "timeout" in item:
            wrong = "port" if "port" in item else "timeout"
            instead = "write the port in http.url" if wrong == "port" else "write it under http"
            add(
                [*where[:-1], wrong],
                f"{wrong} goes with runtime; for an http warm-up {instead}",
                at_key=True,
            )
        http = item.get("http")
        if not isinstance(http, dict):
            continue
        why = local_url_problem(http["url"]) if ok(safe_yaml.format_field([*where, "url"])) else ""
        if why:
            add([*where, "url"], why)
        timeout = _duration([*where, "timeout"], http.get("timeout"), add, ok)
        found.append(
            Warmup(
                url=http["url"],
                method=http.get("method", DEFAULT_WARMUP_METHOD),
                body=http.get("body", ""),
                expect_status=http.get("expectStatus", DEFAULT_WARMUP_EXPECT_STATUS),
                timeout_seconds=DEFAULT_WARMUP_TIMEOUT if timeout is None else timeout,
                times=item.get("times", DEFAULT_WARMUP_TIMES),
            )
        )
    return tuple(found)


def _preset_warmup(
    item: Mapping[str, Any], where: list[str | int], add: Add, ok: Callable[[str], bool]
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


def _duration(field_path: Path, value: Any, add: Add, ok: Callable[[str], bool]) -> int | None:
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
