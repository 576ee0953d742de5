"""Fleet repository documents: files to domain values plus problems.

Three steps, each cheap to repeat:

1. ``parse_file(path, data)``: one file, a pure function of its path and
   bytes, so callers cache it by Git blob id. Safe YAML (``yamlio``), schema
   validation (``schemas``; a compiled check first, jsonschema only to
   explain), then the rules of one file: ``metadata.name`` equals the file
   stem, durations above zero, real times, agent URLs with a valid port.
2. ``assemble(files)``: the rules across files: settings defaults applied to
   rollouts, unique names, ``nodeIds`` naming existing valid nodes. An
   invalid node file means the node does not exist; an invalid settings
   file means the defaults are used; both are reported.
3. ``load_directory(root)``: reads a working tree (``reconciler validate``).

Every problem names file, line, column, field path and what to do, and one
bad file never hides another's problems.

Must not: touch Git or the network, or decide anything about rollouts.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Any, TypeVar

from reconciler.spec import (
    artifact_rules,
    eval_documents,
    safe_yaml,
    schemas,
    settings_documents,
    signer_keys,
)
from reconciler.spec import compare as compare_rules
from reconciler.spec import evals as eval_rules
from reconciler.spec import health as health_rules
from reconciler.spec.agent_url import is_usable_agent_url
from reconciler.spec.batch_shapes import check_batch_entry, check_budget, check_share
from reconciler.spec.durations import parse_duration
from reconciler.spec.model import (
    API_VERSION,
    DEFAULT_FLEET_CHECK_INTERVAL,
    Defaults,
    Fleet,
    Node,
    Problem,
    RollbackRequest,
    RolloutSpec,
    Settings,
    SpreadBy,
    Target,
)
from reconciler.spec.paths import (
    EVALS_DIR,
    FLEET_STATUS_NAME,
    FLEET_STATUS_PATH,
    NAME_RE,
    NODES_DIR,
    ROLLOUTS_DIR,
    SETTINGS_PATH,
    eval_suite_path,
    is_readable_path,
    node_path,
    rollout_path,
    shown_path,
)
from reconciler.spec.times import parse_time
from reconciler.spec.value_words import did_you_mean, show

KINDS = ("Node", "Rollout", "Settings", "EvalSuite")
_ZERO_DURATION = re.compile(r"(0+[smh])+")
_SCHEMA_OF = {
    "Node": "node",
    "Rollout": "rollout",
    "Settings": "settings",
    "EvalSuite": "eval-suite",
}
_HOME_OF = {
    "Node": node_path("NAME"),
    "Rollout": rollout_path("NAME"),
    "Settings": SETTINGS_PATH,
    "EvalSuite": eval_suite_path("NAME"),
}
_FOLDER_OF = {NODES_DIR: "Node", ROLLOUTS_DIR: "Rollout", EVALS_DIR: "EvalSuite"}
_ROLE_KIND = {"settings": "Settings", "node": "Node", "rollout": "Rollout", "suite": "EvalSuite"}

NAME_RULE = "1 to 63 lowercase letters, digits and '-', starting and ending with a letter or digit"

# scheme://host[:port] of an agent URL; the schema has checked the rest
# Rollout fields that take their default from reconciler.yaml when omitted.
_SETTINGS_DEFAULTED = ("batchSize", "healthTimeout", "onFailure")


@dataclass(frozen=True)
class ParsedFile:
    """What one file says: a pure function of (path, data).

    ``kind`` is the kind the file's place asks for (``Node`` under nodes/,
    ``Rollout`` under rollouts/, ``Settings`` for reconciler.yaml), or ``""``
    for a file the daemon does not read (which may still carry a problem,
    for a document in the wrong place). ``name`` is the file stem for nodes
    and rollouts. Exactly one of ``node``/``rollout``/``settings`` is set
    when the file is valid; ``problems`` is empty then.
    """

    path: str
    kind: str
    name: str = ""
    node: Node | None = None
    rollout: RolloutSpec | None = None
    settings: Settings | None = None
    suite: eval_rules.EvalSuite | None = None
    # rollout fields the file omitted, which assemble fills from settings
    omitted: frozenset[str] = frozenset()
    problems: tuple[Problem, ...] = ()
    # metadata.name when it is text but differs from the stem (for the
    # duplicate-name message), and where it is written
    declared_name: str = ""
    declared_at: tuple[int, int] = (0, 0)
    # rollout bytes, to locate cross-document problems in assemble
    source: bytes = field(default=b"", repr=False, compare=False)

    @property
    def valid(self) -> bool:
        return not self.problems and bool(self.kind)


@dataclass(frozen=True)
class Documents:
    settings: Settings
    fleet: Fleet
    rollouts: Mapping[str, RolloutSpec]  # valid rollouts by name, defaults applied
    invalid_rollouts: Mapping[str, tuple[Problem, ...]]  # by file stem
    problems: tuple[Problem, ...]  # every problem in the tree, sorted by path, line

    @property
    def ok(self) -> bool:
        return not self.problems


# --- where files belong -------------------------------------------------------


def classify(path: str) -> str:
    """What the daemon makes of a repository path: ``settings``, ``node``,
    ``rollout``, ``suite`` (an eval suite), ``misplaced`` (a YAML file where documents live but not in a
    form the daemon reads), ``stray`` (a top-level YAML file that may hold a
    document in the wrong place) or ``ignored``."""
    # Plain string work: this runs for every file of a big tree.
    parts = path.split("/")
    base = parts[-1]
    if not base or base.startswith("."):
        return "ignored"
    if len(parts) == 1:
        if path == SETTINGS_PATH:
            return "settings"
        lower = base.lower()
        if lower in ("reconciler.yml", "reconciler.json", "reconciler.yaml"):
            return "misplaced"
        return "stray" if lower.endswith((".yaml", ".yml")) else "ignored"
    top = parts[0]
    if top != NODES_DIR and top != ROLLOUTS_DIR and top != EVALS_DIR:
        return "ignored"
    if len(parts) == 2 and base.endswith(".yaml"):
        return "node" if top == NODES_DIR else "rollout" if top == ROLLOUTS_DIR else "suite"
    if base.lower().endswith((".yaml", ".yml", ".json")):
        return "misplaced"
    return "ignored"


def is_document_path(path: str) -> bool:
    """Whether ``parse_file`` can say anything about ``path``: the paths a
    tree reader should hand over (everything else is ignored)."""
    return classify(path) != "ignored"


# --- one file ---------------------------------------------------------------------


def parse_file(path: str, data: bytes) -> ParsedFile:
    """Everything one file says on its own. ``path`` is relative to the
    repository root, with ``/`` separators."""
    role = classify(path)
    if role == "ignored":
        return ParsedFile(path, "")
    if not is_readable_path(path):
        # Its name could be written nowhere: a problem of this file alone.
        shown = shown_path(path)
        return ParsedFile(
            path,
            "",
            problems=(
                Problem(
                    shown,
                    0,
                    0,
                    "",
                    f"file name {shown} is not valid UTF-8: rename it; the daemon ignores it",
                ),
            ),
        )
    if role == "misplaced":
        return ParsedFile(path, "", problems=(_misplaced(path),))
    if role == "stray":
        return _parse_stray(path, data)
    kind = _ROLE_KIND[role]
    stem = path[path.index("/") + 1 : -len(".yaml")] if kind != "Settings" else ""
    try:
        doc = safe_yaml.load_yaml(path, data)
    except safe_yaml.YamlProblem as exc:
        return ParsedFile(path, kind, stem, problems=(exc.problem,))
    return _Checker(path, data, kind, stem, doc).run()


def _misplaced(path: str) -> Problem:
    pure = PurePosixPath(path)
    if len(pure.parts) == 1:
        return Problem(
            path,
            0,
            0,
            "",
            f"settings are read only from {SETTINGS_PATH}: rename {path} to {SETTINGS_PATH}",
        )
    folder = pure.parts[0]
    kind = _FOLDER_OF[folder]
    if len(pure.parts) > 2:
        where = f"{folder}/{pure.name}" if pure.suffix == ".yaml" else f"{folder}/{pure.stem}.yaml"
        return Problem(
            path,
            0,
            0,
            "",
            f"{kind} files must be directly in {folder}/, not in a subfolder: "
            f"move it to {where}; the daemon ignores it where it is",
        )
    return Problem(
        path,
        0,
        0,
        "",
        f"{kind} files must end in .yaml: rename it to {folder}/{pure.stem}.yaml; "
        "the daemon ignores it as it is",
    )


def _parse_stray(path: str, data: bytes) -> ParsedFile:
    """A top-level YAML file: fine unless it is one of our documents."""
    try:
        doc = safe_yaml.load_yaml(path, data)
    except safe_yaml.YamlProblem:
        return ParsedFile(path, "")  # not ours to judge
    if isinstance(doc, dict) and doc.get("apiVersion") == API_VERSION:
        kind = doc.get("kind")
        home = _HOME_OF.get(kind) if isinstance(kind, str) else None
        what = f"a {kind}" if home else "a reconciler document"
        where = (
            f"it belongs in {home}"
            if home
            else f"documents belong in {SETTINGS_PATH}, nodes/, rollouts/ or evals/"
        )
        return ParsedFile(
            path,
            "",
            problems=(Problem(path, 0, 0, "", f"{what} outside its place is ignored: {where}"),),
        )
    return ParsedFile(path, "")


class _Checker:
    """The checks of one parsed document, collecting problems."""

    def __init__(self, path: str, data: bytes, kind: str, stem: str, doc: Any) -> None:
        self.path = path
        self.data = data
        self.kind = kind
        self.stem = stem
        self.doc = doc
        self.problems: list[Problem] = []
        self.bad_fields: set[str] = set()
        self.declared_name = ""
        self.declared_at = (0, 0)

    def add(self, field_path: Sequence[str | int], message: str, *, at_key: bool = False) -> None:
        line, column = safe_yaml.locate(self.path, self.data, field_path, at_key=at_key)
        name = safe_yaml.format_field(field_path)
        self.bad_fields.add(name)
        self.problems.append(Problem(self.path, line, column, name, message))

    def add_whole(self, message: str) -> None:
        self.problems.append(Problem(self.path, 0, 0, "", message))

    def result(self, **values: Any) -> ParsedFile:
        problems = tuple(sorted(set(self.problems), key=_problem_order))
        if problems:
            values = {}
        return ParsedFile(
            self.path,
            self.kind,
            self.stem,
            problems=problems,
            declared_name=self.declared_name,
            declared_at=self.declared_at,
            source=self.data if self.kind == "Rollout" else b"",
            **values,
        )

    def run(self) -> ParsedFile:
        doc = self.doc
        if doc is None:
            self.add_whole(
                f"file is empty: a {self.kind} needs apiVersion: {API_VERSION}, kind: {self.kind}"
                + (", metadata and spec" if self.kind != "Settings" else "")
            )
            return self.result()
        if not isinstance(doc, dict):
            self.add(
                [], f"must be a mapping of fields (apiVersion, kind, ...), got {_describe(doc)}"
            )
            return self.result()
        other = doc.get("kind")
        if isinstance(other, str) and other in KINDS and other != self.kind:
            self.add(
                ["kind"],
                f"a {other} does not belong in {self.path}: move it to "
                f"{_HOME_OF[other]} (this place holds a {self.kind})",
            )
            return self.result()
        if self.kind != "Settings":
            self._check_stem()
        schema = _SCHEMA_OF[self.kind]
        if not schemas.fast_check(schema)(doc):
            for problem in explain(self.path, self.data, doc, schema):
                self.bad_fields.add(problem.field)
                self.problems.append(problem)
        if self.kind == "Node":
            return self._node(doc)
        if self.kind == "Rollout":
            return self._rollout(doc)
        if self.kind == "EvalSuite":
            return _suite(self, doc)
        return self._settings(doc)

    def ok_at(self, name: str) -> bool:
        """``_ok`` for the checks kept outside the class (eval suites, ``health.evals``)."""
        return self._ok(name)

    def _ok(self, name: str) -> bool:
        """No problem reported yet at ``name`` or around it."""
        return not any(_at_or_under(name, bad) for bad in self.bad_fields)

    def whole(self, name: str) -> bool:
        """No problem reported yet at ``name``, around it or inside it. A
        missing required key is reported at the key's own path, inside its
        mapping: only a whole part may be read by indexing."""
        return not any(
            _at_or_under(name, bad) or _at_or_under(bad, name) for bad in self.bad_fields
        )

    def _check_stem(self) -> None:
        if not NAME_RE.fullmatch(self.stem):
            self.add_whole(
                f"file name {show(self.stem)} is not a valid name ({NAME_RULE}): rename the "
                f"file, and set metadata.name to the same name"
            )
        metadata = self.doc.get("metadata")
        name = metadata.get("name") if isinstance(metadata, dict) else None
        if isinstance(name, str) and name != self.stem:
            self.declared_name = name
            self.declared_at = safe_yaml.locate(self.path, self.data, ["metadata", "name"])
            folder = PurePosixPath(self.path).parent
            fix = f"rename the file to {folder}/{name}.yaml"
            if NAME_RE.fullmatch(self.stem):
                fix += f" or set the name to {show(self.stem)}"
            self.add(
                ["metadata", "name"],
                f"must equal the file name: the file is {self.path} but the name is "
                f"{show(name)}; {fix}",
            )

    def _duration(self, field_path: list[str | int], value: Any) -> int | None:
        name = safe_yaml.format_field(field_path)
        if not self._ok(name) or not isinstance(value, str):
            return None
        try:
            return parse_duration(value)
        except ValueError as exc:
            self.add(field_path, str(exc))
            return None

    # --- kinds ------------------------------------------------------------------

    def _node(self, doc: dict[str, Any]) -> ParsedFile:
        spec = doc.get("spec")
        if not isinstance(spec, dict):
            return self.result()
        agent = spec.get("agent")
        if isinstance(agent, str) and self._ok("spec.agent") and not is_usable_agent_url(agent):
            self.add(
                ["spec", "agent"],
                "not a usable agent URL: write it like http://10.0.0.5:8710 "
                "(a host, and if given a port from 1 to 65535)",
            )
        if (
            isinstance(agent, str)
            and agent.startswith("https://")
            and self._ok("spec.agent")
            and "agentCertSha256" not in spec
        ):
            self.add(
                ["spec", "agent"],
                "an https:// agent needs spec.agentCertSha256, the SHA-256 of its certificate "
                "that `reconciler keys tls` printed; or use http://",
            )
        if self.problems:
            return self.result()
        return self.result(
            node=Node(
                name=self.stem,
                agent=spec["agent"],
                labels=tuple(sorted(spec.get("labels", {}).items())),
                maintenance=spec.get("maintenance", False),
                agent_key=spec.get("agentKey"),
                agent_cert_sha256=spec.get("agentCertSha256"),
            )
        )

    def _rollout(self, doc: dict[str, Any]) -> ParsedFile:
        if self.stem == FLEET_STATUS_NAME:
            self.add_whole(
                f"the name {FLEET_STATUS_NAME!r} is reserved: its status would be "
                f"{FLEET_STATUS_PATH}, the fleet watch's record; rename the file and "
                "metadata.name"
            )
        spec = doc.get("spec")
        if not isinstance(spec, dict):
            return self.result()
        health = self._duration(["spec", "healthTimeout"], spec.get("healthTimeout"))
        start_at = spec.get("startAt")
        if isinstance(start_at, str) and self._ok("spec.startAt"):
            try:
                parse_time(start_at)
            except ValueError:
                self.add(
                    ["spec", "startAt"],
                    f"{show(start_at)} is not a real time: check the date and the time of day "
                    "(such as 2026-12-01T09:00:00Z)",
                )
        checks = spec.get("health")
        if isinstance(checks, dict) and self._ok("spec.health"):
            self._check_health(checks)
        shapes = self._rollout_shapes(spec)
        spread_by, budget = self._capacity(spec)
        declared = artifact_rules.read(spec, self.add, self._ok, self.whole)
        if self.problems:
            return self.result()
        rollout = _rollout_spec(
            self.stem, spec, health, checks, shapes, spread_by, budget, declared
        )
        omitted = frozenset(k for k in _SETTINGS_DEFAULTED if k not in spec)
        return self.result(rollout=rollout, omitted=omitted)

    def _check_health(self, health: dict[str, Any]) -> None:
        """The health checks' rules the schema cannot say (docs/health.md): durations, unique check
        names, agent checks only on the node itself."""
        soak = health.get("soak")
        if isinstance(soak, str) and self._ok("spec.health.soak"):
            try:
                health_rules.parse_soak(soak)
            except ValueError as exc:
                self.add(["spec", "health", "soak"], str(exc))
        self._duration(["spec", "health", "interval"], health.get("interval"))
        checks = health.get("checks")
        _compare_problems(health.get("compare"), checks, self.add, self._ok)
        _eval_problems(self, health)
        if not isinstance(checks, list):
            return
        for index, name in health_rules.duplicate_names(checks):
            self.add(
                ["spec", "health", "checks", index, "name"],
                f"check name {show(name)} is used twice: give each check its own name",
            )
        for index, check in enumerate(checks):
            if not isinstance(check, dict):
                continue
            where: list[str | int] = ["spec", "health", "checks", index]
            for kind in health_rules.AGENT_KINDS:
                probe = check.get(kind)
                if isinstance(probe, dict):
                    self._duration([*where, kind, "timeout"], probe.get("timeout"))
            http = check.get("http")
            url = http.get("url") if isinstance(http, dict) else None
            if isinstance(url, str) and self._ok(safe_yaml.format_field([*where, "http", "url"])):
                problem = health_rules.http_url_problem(url)
                if problem:
                    self.add([*where, "http", "url"], problem)
            tcp = check.get("tcp")
            host = tcp.get("host") if isinstance(tcp, dict) else None
            if isinstance(host, str) and not health_rules.is_local_host(host):
                self.add(
                    [*where, "tcp", "host"],
                    f"an agent probes only its own node: the host {show(host)} must be "
                    f"{health_rules.LOCAL_HOST_RULE}",
                )

    def _rollout_shapes(self, spec: dict[str, Any]) -> _Shapes:
        """``batches``, timed ``pauseAfter`` and ``after`` (docs/rollouts.md)."""
        batches: list[int | str] = []
        written = spec.get("batches")
        if isinstance(written, list) and self._ok("spec.batches"):
            if "batchSize" in spec:
                self.add(
                    ["spec", "batchSize"],
                    "give batchSize or batches, not both: batches lists every batch's size, "
                    "so remove batchSize",
                    at_key=True,
                )
            for index, entry in enumerate(written):
                why = check_batch_entry(entry)
                if why is not None:
                    self.add(["spec", "batches", index], why)
                else:
                    batches.append(entry)
        pause_for: list[tuple[int, int]] = []
        pauses = spec.get("pauseAfter")
        seen_batches: set[int] = set()
        if isinstance(pauses, list) and self._ok("spec.pauseAfter"):
            for index, entry in enumerate(pauses):
                batch = entry.get("batch") if isinstance(entry, dict) else entry
                if isinstance(batch, int) and batch in seen_batches:
                    self.add(
                        ["spec", "pauseAfter", index],
                        f"batch {batch} is listed more than once; list each batch once",
                    )
                if isinstance(batch, int):
                    seen_batches.add(batch)
                if isinstance(entry, dict) and isinstance(batch, int):
                    seconds = self._duration(["spec", "pauseAfter", index, "for"], entry.get("for"))
                    if seconds is not None:
                        pause_for.append((batch, seconds))
        after = spec.get("after")
        if isinstance(after, list) and self._ok("spec.after"):
            for index, name in enumerate(after):
                if name == self.stem:
                    self.add(
                        ["spec", "after", index],
                        f"a rollout cannot wait for itself: remove {show(name)} from after",
                    )
        return _Shapes(tuple(batches), tuple(sorted(pause_for)))

    def _capacity(self, spec: dict[str, Any]) -> tuple[SpreadBy | None, int | str | None]:
        """``spreadBy`` and ``failureBudget`` (docs/capacity.md); whether the
        budget's policy is observe is checked once defaults apply."""
        spread_by = None
        spread = spec.get("spreadBy")
        if isinstance(spread, dict) and self._ok("spec.spreadBy"):
            share = spread.get("maxPerBatch")
            why = check_share(share, "node")
            if why is not None:
                self.add(["spec", "spreadBy", "maxPerBatch"], why)
            elif isinstance(share, int | str) and self.whole("spec.spreadBy"):
                spread_by = SpreadBy(spread["label"], share)
        budget = spec.get("failureBudget")
        if budget is not None and self._ok("spec.failureBudget"):
            why = check_budget(budget)
            if why is not None:
                self.add(["spec", "failureBudget"], why)
                budget = None
        return spread_by, budget if isinstance(budget, int | str) else None

    def _settings(self, doc: dict[str, Any]) -> ParsedFile:
        spec = doc.get("spec")
        spec = spec if isinstance(spec, dict) else {}
        offline = self._duration(["spec", "offlineAfter"], spec.get("offlineAfter"))
        fleet_check = spec.get("fleetCheck")
        fleet_check = fleet_check if isinstance(fleet_check, dict) else {}
        interval = fleet_check.get("interval")
        # ``0s`` is allowed here, and only here: it turns the fleet watch off.
        sweep = (
            0
            if isinstance(interval, str) and _ZERO_DURATION.fullmatch(interval)
            else self._duration(["spec", "fleetCheck", "interval"], interval)
        )
        defaults = spec.get("defaults")
        defaults = defaults if isinstance(defaults, dict) else {}
        health = self._duration(
            ["spec", "defaults", "healthTimeout"], defaults.get("healthTimeout")
        )
        windows = settings_documents.windows(spec, self.add, self._ok)
        freezes = settings_documents.freezes(spec, self.add, self._ok)
        receivers = settings_documents.receivers(
            spec.get("notifications"), self.add, self._ok, self.whole
        )
        rules = settings_documents.approval_rules(
            spec.get("approvalRules"), self.add, self._ok, self.whole
        )
        signers = settings_documents.model_signers(spec, self.add, self._ok, self.whole)
        if self.problems:
            return self.result()
        base = Defaults()
        return self.result(
            settings=Settings(
                status_branch=spec.get("statusBranch"),
                offline_after=offline if offline is not None else Settings().offline_after,
                defaults=Defaults(
                    batch_size=defaults.get("batchSize", base.batch_size),
                    health_timeout=health if health is not None else base.health_timeout,
                    on_failure=defaults.get("onFailure", base.on_failure),
                ),
                fleet_check_interval=sweep if sweep is not None else DEFAULT_FLEET_CHECK_INTERVAL,
                prometheus_url=(spec.get("prometheus") or {}).get("url"),
                alertmanager_url=(spec.get("alertmanager") or {}).get("url"),
                windows=windows,
                freezes=freezes,
                notifications=receivers,
                approval_rules=rules,
                model_signers=signers,
            )
        )


def _eval_problems(check: _Checker, health: dict[str, Any]) -> None:
    """``health.evals``' own rules (``eval_documents``); whether the suite
    exists is a rule across files (``assemble``)."""
    if health.get("evals"):
        live = check.doc["spec"].get("live") is True
        standby = check.doc["spec"].get("standby") is not None
        eval_documents.rollout_problems(
            health, live, standby, check.add, check.ok_at, check._duration
        )


def _suite(check: _Checker, doc: dict[str, Any]) -> ParsedFile:
    """An eval suite file's value, or its problems."""
    spec = doc.get("spec")
    if isinstance(spec, dict) and check.ok_at("spec"):
        eval_documents.suite_problems(spec, check.add, check.ok_at)
    if check.problems:
        return check.result()
    return check.result(suite=eval_rules.suite_from_document(check.stem, check.data, doc))


def _at_or_under(name: str, part: str) -> bool:
    """``name`` is the field ``part`` or a field inside it."""
    return name == part or name.startswith(part + ".") or name.startswith(part + "[")


@dataclass(frozen=True)
class _Shapes:
    batches: tuple[int | str, ...]
    pause_for: tuple[tuple[int, int], ...]


def _unique(names: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))


def _problem_order(problem: Problem) -> tuple[str, int, int, str, str]:
    return (problem.path, problem.line, problem.column, problem.field, problem.message)


# --- schema errors in words ----------------------------------------------------------

_TYPE_WORDS = {
    "string": "text",
    "integer": "a whole number",
    "number": "a number",
    "boolean": "true or false",
    "object": "a mapping (key: value lines)",
    "array": "a list",
    "null": "null",
}


def _describe(value: Any) -> str:
    if value is None:
        return "nothing (the value is empty or null)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the text {show(value)}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _first_sentence(text: str) -> str:
    head = text.split(". ")[0].rstrip(".")
    return head[:1].lower() + head[1:]


def explain(path: str, data: bytes, doc: Any, schema_name: str) -> list[Problem]:
    """Every schema error in ``doc`` as a problem in words a person can act on."""
    problems: list[Problem] = []
    for error in schemas.validator(schema_name).iter_errors(doc):
        for field_path, at_key, message in _translate(error, data):
            line, column = safe_yaml.locate(path, data, field_path, at_key=at_key)
            problems.append(
                Problem(path, line, column, safe_yaml.format_field(field_path), message)
            )
    return sorted(set(problems), key=_problem_order)


_Finding = tuple[list[str | int], bool, str]


def _translate(error: Any, data: bytes) -> list[_Finding]:
    where: list[str | int] = list(error.absolute_path)
    keyword = error.validator
    value = error.validator_value
    instance = error.instance
    schema = error.schema if isinstance(error.schema, dict) else {}

    if "propertyNames" in error.relative_schema_path:
        # jsonschema reports a bad key as an error on the key itself
        rule = _key_rule(error)
        return [([*where, instance], True, f"{rule}, got {show(instance)}")]
    if keyword == "additionalProperties":
        allowed = sorted(schema.get("properties", {}))
        out: list[_Finding] = []
        for key in sorted(k for k in instance if k not in schema.get("properties", {})):
            guess = did_you_mean(key, allowed)
            hint = (
                f"did you mean {show(guess)}?" if guess else "allowed fields: " + ", ".join(allowed)
            )
            out.append(([*where, key], True, f"unknown field {show(key)}; {hint}"))
        return out
    if keyword == "required":
        props = schema.get("properties", {})
        out = []
        for name in value:
            if name in instance:
                continue
            about = props.get(name, {}).get("description", "")
            extra = f" ({_first_sentence(about)})" if about else ""
            out.append(([*where, name], False, f"missing required field {show(name)}{extra}"))
        return out
    if keyword == "type":
        return [(where, False, _type_message(value, instance, data, where))]
    if keyword in ("oneOf", "anyOf"):
        return _one_of(error, where, schema, data)
    found = _value_findings(keyword, value, instance, schema, where)
    if found is not None:
        return found
    return [(where, False, str(error.message))]


def _value_findings(
    keyword: str, value: Any, instance: Any, schema: dict[str, Any], where: list[str | int]
) -> list[_Finding] | None:
    """The words for a value that breaks a rule on values (const, enum,
    pattern, bounds, unique items); None for any other keyword."""
    message = schema.get("errorMessage") if keyword in ("const", "enum") else None
    if keyword == "const":
        message = message or f"must be {show(value)}"
        return [(where, False, f"{message}, got {show(instance)}")]
    if keyword == "enum":
        choices = ", ".join(str(v) for v in value)
        text = f"must be one of {choices}; got {show(instance)}"
        if isinstance(instance, str):
            guess = did_you_mean(instance, [v for v in value if isinstance(v, str)])
            if guess:
                text += f" (did you mean {guess}?)"
        return [(where, False, text)]
    if keyword == "pattern":
        rule = schema.get("patternErrorMessage", "does not have the expected form")
        return [(where, False, f"{rule}; got {show(instance)}")]
    if keyword == "minimum":
        return [(where, False, f"must be at least {value}, got {show(instance)}")]
    if keyword == "maximum":
        return [(where, False, f"must be at most {value}, got {show(instance)}")]
    if keyword == "minLength":
        if value == 1:
            return [(where, False, "must not be empty")]
        return [(where, False, f"must be at least {value} characters long, got {len(instance)}")]
    if keyword == "maxLength":
        return [(where, False, f"must be at most {value} characters long, got {len(instance)}")]
    if keyword == "minItems":
        if value == 1:
            return [(where, False, "must list at least one item; the list is empty")]
        return [(where, False, f"must list at least {value} items, got {len(instance)}")]
    if keyword == "maxItems":
        return [(where, False, f"must list at most {value} items, got {len(instance)}")]
    if keyword == "uniqueItems":
        seen: list[Any] = []
        for index, item in enumerate(instance):
            if item in seen:
                return [
                    (
                        [*where, index],
                        False,
                        f"{show(item)} is listed more than once; list each value once",
                    )
                ]
            seen.append(item)
    return None


def _key_rule(error: Any) -> str:
    names = error.schema if isinstance(error.schema, dict) else {}
    if error.validator == "maxLength":
        return f"a key must be at most {error.validator_value} characters long"
    if error.validator == "minLength":
        return "a key must not be empty"
    return str(names.get("patternErrorMessage", "not an allowed key"))


def _type_message(expected: Any, instance: Any, data: bytes, where: list[str | int]) -> str:
    wanted = [expected] if isinstance(expected, str) else list(expected)
    words = " or ".join(_TYPE_WORDS.get(w, w) for w in wanted)
    if "string" in wanted and isinstance(instance, bool | int | float) and instance is not None:
        written = _written(data, where) or show(instance)
        what = "a boolean" if isinstance(instance, bool) else "a number"
        return (
            f"must be text, but {written} without quotes is read as {what}; "
            f'put it in quotes: "{written}"'
        )
    if instance is None:
        return f"must be {words}, but the value is empty"
    message = f"must be {words}, got {_describe(instance)}"
    if isinstance(instance, str) and ("integer" in wanted or "boolean" in wanted):
        message += ": remove the quotes"
    return message


def _written(data: bytes, where: list[str | int]) -> str:
    line, column = safe_yaml.locate("", data, where)
    return safe_yaml.source_text(data, line, column)


def _one_of(
    error: Any, where: list[str | int], schema: dict[str, Any], data: bytes
) -> list[_Finding]:
    branches = schema.get(error.validator, [])
    instance = error.instance
    required_only = all(isinstance(b, dict) and set(b) == {"required"} for b in branches)
    if required_only and isinstance(instance, dict):
        names = [n for b in branches for n in b["required"]]
        present = [n for n in names if n in instance]
        listed = " or ".join(names)
        if present:
            return [
                (
                    [*where, present[1]],
                    True,
                    f"give exactly one of {listed}, not both: remove one of them",
                )
            ]
        rule = schema.get("errorMessage", f"give exactly one of {listed}")
        return [(where, False, f"{rule}; neither is given")]
    # Explain the branch that fits the value's type, if one does.
    for sub in error.context or ():
        if sub.validator not in ("type", "const", "enum") or sub.relative_path:
            found: list[_Finding] = []
            for inner in error.context:
                if inner.relative_schema_path[0] == sub.relative_schema_path[0]:
                    found.extend(_translate(inner, data))
            if found:
                return found
    message = schema.get("errorMessage") or "does not match any allowed form"
    return [(where, False, f"{message}, got {_describe(instance)}")]


# --- many files --------------------------------------------------------------------


def assemble(files: Iterable[ParsedFile]) -> Documents:
    """The rules across files. Cheap: no YAML or schema work here."""
    problems: list[Problem] = []
    settings = Settings()
    nodes: dict[str, Node] = {}
    node_files: dict[str, ParsedFile] = {}
    rollout_files: list[ParsedFile] = []
    suites: dict[str, eval_rules.EvalSuite] = {}
    names_by_folder: dict[tuple[str, str], str] = {}
    parsed = sorted(files, key=lambda f: f.path)

    for item in parsed:
        problems.extend(item.problems)
        if item.kind in ("Node", "Rollout", "EvalSuite") and item.name:
            names_by_folder.setdefault((item.kind, item.name), item.path)
        if item.kind == "Settings" and item.path == SETTINGS_PATH and item.settings:
            settings = item.settings
        elif item.kind == "Node":
            node_files[item.name] = item
            if item.node is not None:
                nodes[item.name] = item.node
        elif item.kind == "Rollout":
            rollout_files.append(item)
        elif item.kind == "EvalSuite" and item.suite is not None:
            suites[item.name] = item.suite

    # A name given to a file whose stem differs: also say who owns it.
    for item in parsed:
        if item.declared_name:
            owner = names_by_folder.get((item.kind, item.declared_name))
            if owner and owner != item.path:
                line, column = item.declared_at
                problems.append(
                    Problem(
                        item.path,
                        line,
                        column,
                        "metadata.name",
                        f"{show(item.declared_name)} is already the name of {owner}: "
                        "every name is used by one file only",
                    )
                )

    rollouts: dict[str, RolloutSpec] = {}
    invalid: dict[str, tuple[Problem, ...]] = {}
    for item in rollout_files:
        spec, own = _rollout_result(item, settings, nodes, node_files, rollout_files, suites)
        problems.extend(own[len(item.problems) :])
        if own or spec is None:
            if NAME_RE.fullmatch(item.name):
                invalid[item.name] = tuple(sorted(own, key=_problem_order))
        else:
            rollouts[item.name] = spec

    return Documents(
        settings=settings,
        fleet=Fleet(tuple(nodes[name] for name in sorted(nodes))),
        rollouts=MappingProxyType(dict(sorted(rollouts.items()))),
        invalid_rollouts=MappingProxyType(dict(sorted(invalid.items()))),
        problems=tuple(sorted(problems, key=_problem_order)),
    )


def _rollout_spec(
    name: str,
    spec: dict[str, Any],
    health: int | None,
    checks: dict[str, Any] | None,
    shapes: _Shapes,
    spread_by: SpreadBy | None,
    budget: int | str | None,
    declared: artifact_rules.Declared,
) -> RolloutSpec:
    """The rollout a checked document declares, its defaults filled in; the
    parts checked on their own (``healthTimeout``, shapes, capacity,
    artifacts) come in as read."""
    target = spec["target"]
    request = spec.get("rollbackRequest")
    rollback = None
    if request is not None:
        nodes = request["nodes"]
        rollback = RollbackRequest(
            id=request["id"], nodes=None if nodes == "all" else _unique(nodes)
        )
    selector = spec.get("selector")
    node_ids = spec.get("nodeIds")
    return RolloutSpec(
        name=name,
        target=Target(
            runtime=target["runtime"],
            provider=target["provider"],
            model=target["model"],
            profile=target.get("profile", "default"),
        ),
        selector=None if selector is None else tuple(sorted(selector.items())),
        node_ids=None if node_ids is None else _unique(node_ids),
        batch_size=spec.get("batchSize", 1),
        health_timeout=health if health is not None else 300,
        live=spec.get("live", False),
        on_failure=spec.get("onFailure", "pause"),
        pause_after=tuple(
            e if isinstance(e, int) else e["batch"] for e in spec.get("pauseAfter", ())
        ),
        pause_for=shapes.pause_for,
        batches=shapes.batches,
        after=tuple(spec.get("after", ())),
        ignore_windows=spec.get("ignoreWindows", False),
        spread_by=spread_by,
        failure_budget=budget,
        start_at=spec.get("startAt"),
        include_maintenance=spec.get("includeMaintenance", False),
        allow_overlap=spec.get("allowOverlap", False),
        paused=spec.get("paused", False),
        abort=spec.get("abort", False),
        resume_request=spec.get("resumeRequest", ""),
        skip_nodes=_unique(spec.get("skipNodes", ())),
        rollback_request=rollback,
        health=None if checks is None else health_rules.from_document(checks),
        artifacts=declared.artifacts,
        stage=declared.stage,
        drain=declared.drain,
        warmup=declared.warmup,
        signature=declared.signature,
        standby=declared.standby,
        evals=eval_rules.evals_from_document(checks.get("evals", ()) if checks else ()),
    )


def _rollout_result(
    item: ParsedFile,
    settings: Settings,
    nodes: Mapping[str, Node],
    node_files: Mapping[str, ParsedFile],
    rollout_files: Sequence[ParsedFile],
    suites: Mapping[str, eval_rules.EvalSuite],
) -> tuple[RolloutSpec | None, list[Problem]]:
    """One rollout file's spec (defaults applied, eval suites joined in)
    and every problem it has: its own, then those across files
    (``nodeIds``, ``after``, eval suites)."""
    own = list(item.problems)
    spec = item.rollout
    if spec is not None:
        if item.omitted:
            spec = _with_defaults(spec, item.omitted, settings.defaults)
        if spec.evals:
            spec = replace(spec, evals=eval_rules.resolve(spec.evals, suites))
            own.extend(_suite_problems(item, spec))
        for index, name in enumerate(spec.node_ids or ()):
            if name in nodes:
                continue
            broken = node_files.get(name)
            if broken is not None:
                message = (
                    f"node {show(name)} cannot be used: its file {broken.path} is invalid; "
                    "fix that file first"
                )
            else:
                message = (
                    f"no node named {show(name)}: there is no nodes/{name}.yaml; "
                    "check the spelling or add the node"
                )
            index_in_file = _index_in_file(item.source, name, index)
            line, column = safe_yaml.locate(
                item.path, item.source, ["spec", "nodeIds", index_in_file]
            )
            own.append(Problem(item.path, line, column, f"spec.nodeIds[{index_in_file}]", message))
        own.extend(_after_problems(item, spec, rollout_files))
        own.extend(_budget_problems(item, spec))
        own.extend(_alerts_problems(item, spec, settings))
        spec, signed = _signers_of(item, spec, settings)
        own.extend(signed)
    return spec, own


def _suite_problems(item: ParsedFile, spec: RolloutSpec) -> list[Problem]:
    """``health.evals`` naming a suite that is not a valid file under evals/."""
    found = []
    for index, e in enumerate(spec.evals):
        if e.suite is not None:
            continue
        where: list[str | int] = ["spec", "health", "evals", index, "suite"]
        line, column = safe_yaml.locate(item.path, item.source, where)
        found.append(
            Problem(
                item.path,
                line,
                column,
                safe_yaml.format_field(where),
                f"no valid eval suite named {show(e.suite_name)}: there is no valid "
                f"{eval_suite_path(e.suite_name)}; add it, fix it, or check the spelling",
            )
        )
    return found


def _compare_problems(
    compare: Any,
    checks: Any,
    add: Callable[[Sequence[str | int], str], None],
    ok: Callable[[str], bool],
) -> None:
    """``health.compare``'s problems, each at its field (names must not
    repeat those of ``health.checks``)."""
    names = {c["name"] for c in checks or () if isinstance(c, dict) and "name" in c}
    for under, message in compare_rules.problems(compare, names):
        field_path: list[str | int] = ["spec", "health", "compare", *under]
        if ok(safe_yaml.format_field(field_path)):
            add(field_path, message)


def _alerts_problems(item: ParsedFile, spec: RolloutSpec, settings: Settings) -> list[Problem]:
    """``health.alerts`` with no Alertmanager to ask in reconciler.yaml."""
    if spec.health is None or spec.health.alerts is None or settings.alertmanager_url:
        return []
    line, column = safe_yaml.locate(item.path, item.source, ["spec", "health", "alerts"])
    message = (
        f"alerts need an Alertmanager to ask: set spec.alertmanager.url in {SETTINGS_PATH}, "
        "such as http://127.0.0.1:9093, or remove alerts"
    )
    return [Problem(item.path, line, column, "spec.health.alerts", message)]


def _signers_of(
    item: ParsedFile, spec: RolloutSpec, settings: Settings
) -> tuple[RolloutSpec, list[Problem]]:
    """``spec`` with the signers of reconciler.yaml that cover its model
    (their keys go to the nodes), and the problem of a signature missing
    where a signer covers the model, or given where none does."""
    signers = signer_keys.covering(settings.model_signers, spec.target.model)
    model = spec.target.model
    if signers and spec.signature is None:
        names = ", ".join(s.name for s in signers)
        line, column = safe_yaml.locate(item.path, item.source, ["spec", "target"])
        message = (
            f"model {show(model)} is covered by signer{'s' if len(signers) > 1 else ''} "
            f"{names} in {SETTINGS_PATH}: give target.signature {{url, sha256, size}}, the "
            "producer's OpenSSF Model Signing signature of target.artifacts"
        )
        return spec, [Problem(item.path, line, column, "spec.target.signature", message)]
    if not signers and spec.signature is not None:
        line, column = safe_yaml.locate(item.path, item.source, ["spec", "target", "signature"])
        message = (
            f"no signer in {SETTINGS_PATH} covers model {model}: add one under "
            "spec.modelSigners whose models match it, or remove signature"
        )
        return spec, [Problem(item.path, line, column, "spec.target.signature", message)]
    return replace(spec, signers=signers) if signers else spec, []


def _budget_problems(item: ParsedFile, spec: RolloutSpec) -> list[Problem]:
    """``failureBudget`` under a policy other than observe, once the default
    policy of reconciler.yaml applies."""
    if spec.failure_budget is None or spec.on_failure == "observe":
        return []
    whose = " (the default of reconciler.yaml)" if "onFailure" in item.omitted else ""
    line, column = safe_yaml.locate(item.path, item.source, ["spec", "failureBudget"])
    message = (
        f"failureBudget needs onFailure: observe, which records failures and goes on; "
        f"under onFailure {spec.on_failure}{whose} every failure holds already: set "
        "onFailure: observe, or remove failureBudget"
    )
    return [Problem(item.path, line, column, "spec.failureBudget", message)]


class Assembly:
    """``assemble`` kept from one read of a tree to the next, for the
    daemon: given the files that changed, it redoes only what they can
    change, and gives the same ``Documents`` as ``assemble`` over every file
    (tests pin this). That holds when only rollout files changed and no
    rule across files involves them: no ``after`` list in their old or new
    version or naming them, and no file anywhere declaring another's name.
    Otherwise (a node, the settings, an eval suite, such a rule) it assembles everything.
    Unchanged parts keep their identity (the same ``Fleet`` object), which
    the caches keyed on them rely on."""

    def __init__(self) -> None:
        self.files: dict[str, ParsedFile] = {}
        self.documents: Documents | None = None
        self.full_assemblies = 0  # for tests and the benchmark
        # The rollouts (by name) the last update redid; None after a full assembly.
        self.changed_names: frozenset[str] | None = None
        self._problems: dict[str, tuple[Problem, ...]] = {}  # by path
        self._nodes: dict[str, Node] = {}
        self._suites: dict[str, eval_rules.EvalSuite] = {}
        self._node_files: dict[str, ParsedFile] = {}
        self._rollout_paths: dict[str, str] = {}  # rollout name -> its file
        self._after_targets: set[str] = set()
        self._declaring = 0  # files whose metadata.name differs from their stem

    def rebuild(self, files: Iterable[ParsedFile]) -> Documents:
        """Everything from these files."""
        self.files = {f.path: f for f in files}
        return self._full()

    def update(self, changes: Mapping[str, ParsedFile | None]) -> Documents:
        """The documents after ``changes`` (path -> the file now, None when
        it is gone), relative to the files of the last call."""
        if self.documents is None:
            raise ValueError("update() before rebuild()")
        new_names = [new.name for new in changes.values() if new is not None]
        incremental = len(set(new_names)) == len(new_names) and all(
            self._local(path, new) for path, new in changes.items()
        )
        old_items = {path: self.files.get(path) for path in changes}
        for path, new in changes.items():
            if new is None:
                self.files.pop(path, None)
            else:
                self.files[path] = new
        if not incremental:
            return self._full()
        self.changed_names = frozenset(
            item.name for item in (*old_items.values(), *changes.values()) if item is not None
        )
        docs = self.documents
        settings = docs.settings
        gone: list[str] = []
        rollouts: dict[str, RolloutSpec] = {}
        invalid: dict[str, tuple[Problem, ...]] = {}
        for path, old in old_items.items():
            self._problems.pop(path, None)
            if old is not None:
                del self._rollout_paths[old.name]
                gone.append(old.name)
        for path, new in changes.items():
            if new is None:
                continue
            self._rollout_paths[new.name] = path
            spec, own = _rollout_result(
                new, settings, self._nodes, self._node_files, (), self._suites
            )
            if own:
                self._problems[path] = tuple(own)
            if own or spec is None:
                if NAME_RE.fullmatch(new.name):
                    invalid[new.name] = tuple(sorted(own, key=_problem_order))
            else:
                rollouts[new.name] = spec
        self.documents = Documents(
            settings=settings,
            fleet=docs.fleet,
            rollouts=_patched(docs.rollouts, gone, rollouts),
            invalid_rollouts=_patched(docs.invalid_rollouts, gone, invalid),
            problems=tuple(
                sorted((p for found in self._problems.values() for p in found), key=_problem_order)
            ),
        )
        return self.documents

    def _local(self, path: str, new: ParsedFile | None) -> bool:
        """Can a change of this file be assembled on its own?"""
        old = self.files.get(path)
        for item in (old, new):
            if item is None:
                continue
            if item.kind != "Rollout" or item.declared_name or not item.name:
                return False
            if item.rollout is not None and item.rollout.after:
                return False
            if item.name in self._after_targets:
                return False
            owner = self._rollout_paths.get(item.name)
            if owner is not None and owner != path:
                return False  # two files, one name: the full rules decide
        return self._declaring == 0 and (old is not None or new is not None)

    def _full(self) -> Documents:
        self.full_assemblies += 1
        self.changed_names = None
        files = list(self.files.values())
        self.documents = docs = assemble(files)
        self._problems = {}
        for problem in docs.problems:
            self._problems.setdefault(problem.path, ())
            self._problems[problem.path] += (problem,)
        self._nodes = {n.name: n for n in docs.fleet.nodes}
        self._suites = {f.name: f.suite for f in files if f.suite is not None}
        self._node_files = {f.name: f for f in files if f.kind == "Node"}
        self._rollout_paths = {f.name: f.path for f in files if f.kind == "Rollout"}
        self._after_targets = {
            name for f in files if f.rollout is not None for name in f.rollout.after or ()
        }
        self._declaring = sum(1 for f in files if f.declared_name)
        return docs


_V = TypeVar("_V")


def _patched(
    before: Mapping[str, _V], gone: Sequence[str], now: Mapping[str, _V]
) -> Mapping[str, _V]:
    """``before`` (in name order) without the names in ``gone``, with the
    entries of ``now``, in name order as ``assemble`` gives it: names kept
    keep their place, so only names new to it are sorted in (and usually
    go last), not thousands sorted again; ``before`` itself when that
    changes nothing in it."""
    if not now and not any(name in before for name in gone):
        return before
    # A dict's own copy, not dict(before): over a mapping proxy that looks
    # up every key again (0.3 ms at 5,000 rollouts, against 0.03).
    result = before.copy() if isinstance(before, (dict, MappingProxyType)) else dict(before)
    for name in gone:
        if name not in now:
            result.pop(name, None)
    added: list[str] = []
    for name, value in now.items():
        if name in result:
            result[name] = value
        else:
            added.append(name)
    if not added:
        return MappingProxyType(result)
    added.sort()
    last = next(reversed(result), None)
    for name in added:
        result[name] = now[name]
    if last is None or added[0] > last:
        return MappingProxyType(result)
    return MappingProxyType(dict(sorted(result.items())))


def _after_problems(
    item: ParsedFile, spec: RolloutSpec, rollout_files: Sequence[ParsedFile]
) -> list[Problem]:
    """``after`` naming no rollout file, or closing a cycle (docs/rollouts.md)."""
    if not spec.after:
        return []
    files = {f.name: f for f in rollout_files}
    found: list[Problem] = []
    for index, name in enumerate(spec.after):
        line, column = safe_yaml.locate(item.path, item.source, ["spec", "after", index])
        where = f"spec.after[{index}]"
        if name not in files:
            found.append(
                Problem(
                    item.path,
                    line,
                    column,
                    where,
                    f"no rollout named {show(name)}: there is no rollouts/{name}.yaml; "
                    "check the spelling or remove it from after",
                )
            )
            continue
        cycle = _cycle_through(item.name, name, files)
        if cycle:
            found.append(
                Problem(
                    item.path,
                    line,
                    column,
                    where,
                    "after makes a cycle: "
                    + " -> ".join([item.name, *cycle])
                    + "; no rollout in it could ever start: remove one of these names from "
                    "its after list",
                )
            )
    return found


def _cycle_through(start: str, first: str, files: Mapping[str, ParsedFile]) -> list[str]:
    """The path ``first`` -> ... -> ``start`` along ``after`` lists, if any."""
    stack: list[tuple[str, list[str]]] = [(first, [first])]
    seen: set[str] = set()
    while stack:
        name, path = stack.pop()
        if name == start:
            return path
        if name in seen:
            continue
        seen.add(name)
        rollout = files[name].rollout if name in files else None
        for nxt in rollout.after if rollout is not None else ():
            stack.append((nxt, [*path, nxt]))
    return []


def _with_defaults(spec: RolloutSpec, omitted: frozenset[str], defaults: Defaults) -> RolloutSpec:
    changes: dict[str, Any] = {}
    if "batchSize" in omitted:
        changes["batch_size"] = defaults.batch_size
    if "healthTimeout" in omitted:
        changes["health_timeout"] = defaults.health_timeout
    if "onFailure" in omitted:
        changes["on_failure"] = defaults.on_failure
    return replace(spec, **changes)


def _index_in_file(source: bytes, name: str, index: int) -> int:
    """``node_ids`` has duplicates dropped; find the name's index as written."""
    try:
        written = safe_yaml.load_yaml("", source)["spec"]["nodeIds"]
        return int(written.index(name))
    except (safe_yaml.YamlProblem, KeyError, TypeError, ValueError):
        return index


# --- a working tree ------------------------------------------------------------------


def _tree_files(root: Path) -> list[tuple[str, str, bool]]:
    """(relative POSIX path, full path, is a symlink) of the files
    ``parse_file`` cares about, sorted."""
    found: list[tuple[str, str, bool]] = []
    with os.scandir(root) as top:
        for entry in top:
            if is_document_path(entry.name) and (
                entry.is_symlink() or entry.is_file(follow_symlinks=False)
            ):
                found.append((entry.name, entry.path, entry.is_symlink()))
    pending = [
        (folder, os.path.join(root, folder)) for folder in (NODES_DIR, ROLLOUTS_DIR, EVALS_DIR)
    ]
    while pending:
        rel_dir, full_dir = pending.pop()
        try:
            entries = list(os.scandir(full_dir))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}"
            if entry.is_dir(follow_symlinks=False):
                if not entry.name.startswith("."):
                    pending.append((rel, entry.path))
            elif is_document_path(rel):
                found.append((rel, entry.path, entry.is_symlink()))
    found.sort()
    return found


def tree_paths(root: Path) -> list[str]:
    """Relative POSIX paths of the files ``parse_file`` cares about."""
    return [rel for rel, _full, _link in _tree_files(root)]


def _read(path: str) -> bytes:
    # Read one byte past the cap: enough to know the file is too big.
    with open(path, "rb") as handle:
        return handle.read(safe_yaml.MAX_BYTES + 1)


# Below this many files a process pool costs more than it saves.
_PARALLEL_FROM = 3000


def _parse_entries(entries: Sequence[tuple[str, str, bool]]) -> list[ParsedFile]:
    parsed = []
    for rel, full, is_link in entries:
        if is_link:
            problem = Problem(rel, 0, 0, "", "is a symbolic link; documents must be regular files")
            parsed.append(ParsedFile(rel, "", problems=(problem,)))
            continue
        parsed.append(parse_file(rel, _read(full)))
    return parsed


def _parse_in_processes(
    entries: Sequence[tuple[str, str, bool]], workers: int
) -> list[ParsedFile] | None:
    """Parse in forked worker processes; None when that is not possible."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return None
    size = max(1, len(entries) // (workers * 4))
    chunks = [entries[i : i + size] for i in range(0, len(entries), size)]
    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            return [item for chunk in pool.map(_parse_entries, chunks) for item in chunk]
    except (OSError, BrokenProcessPool):
        return None


def load_directory(root: Path, *, workers: int | None = None) -> Documents:
    """Every document of a fleet repository's working tree (status/ is the
    daemon's and is not read). ``root`` must be a directory.

    ``workers``: processes to parse with; by default one per CPU for a big
    tree (thousands of files) when this process has no other threads (a
    fork must not copy a lock held by another thread), else 1."""
    entries = _tree_files(root)
    if workers is None:
        big = len(entries) >= _PARALLEL_FROM and threading.active_count() == 1
        workers = min(os.cpu_count() or 1, 8) if big else 1
    parsed = _parse_in_processes(entries, workers) if workers > 1 else None
    if parsed is None:
        parsed = _parse_entries(entries)
    return assemble(parsed)
