"""Operator intents as edits to a rollout file in a working tree.

``pause``, ``resume``, ``abort`` and ``rollback`` are changes to
``rollouts/NAME.yaml`` that a person commits and a reviewer approves
(docs/rollouts.md). This module decides whether an intent makes sense,
given the status committed next to the rollout, and edits the file so that
only the lines carrying the intent change: comments, key order, quoting and
indentation of everything else stay exactly as written.

How the edit keeps the layout: ruamel.yaml's round-trip composer gives the
exact position of every key and value; the edit replaces those characters,
or adds one line under ``spec``, and then re-loads both texts to prove that
nothing but the intended fields changed. (Dumping the round-trip tree back
would re-indent sequences, re-flow long lines and normalise spacing, which
shows in a diff and in review.)

Must not: decide anything about the rollout's future (the engine does), read
status from anywhere but the working tree it edits, or touch Git beyond the
optional commit of the one file it edited.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from reconciler.git.git_binary import run_git
from reconciler.readers.status_reader import StatusCache
from reconciler.spec.errors import ReconcilerError
from reconciler.spec.paths import (
    NODES_DIR,
    ROLLOUTS_DIR,
    STATUS_DIR,
    rollout_path,
    status_pages_dir,
    status_path,
)
from reconciler.spec.rollout_status import TERMINAL_PHASES, RolloutStatus
from reconciler.spec.safe_yaml import YamlProblem, load_yaml
from reconciler.spec.times import format_time

# Node states whose restore is still under way: a new rollback would race it.
RESTORING_STATES = frozenset({"rollback_pending", "restoring"})

_PLAIN_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
_ROLLBACK_ID = re.compile(r"^r([0-9]+)$")


# --------------------------------------------------------------------------
# What the working tree says


@dataclass(frozen=True)
class StatusFacts:
    """What an intent needs to know from ``status/NAME.yaml``."""

    phase: str
    hold_reason: str | None = None
    hold_message: str = ""
    operator_paused: bool = False
    live: bool | None = None  # frozen value; None before the rollout started
    nodes: tuple[str, ...] = ()  # frozen node list, in frozen order
    node_states: Mapping[str, str] = field(default_factory=dict)
    last_handled_resume: str = ""
    rollback_ids: tuple[str, ...] = ()  # every rollback request id status has seen

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def policy_hold(self) -> bool:
        """A hold a ``resumeRequest`` answers (the operator pause is lifted by
        ``paused: false`` instead)."""
        return self.hold_reason is not None and self.hold_reason != "operator_paused"


@dataclass(frozen=True)
class Rollout:
    """One rollout file as found in a working tree."""

    root: Path  # top of the fleet working tree
    name: str
    path: Path
    text: str
    spec: Mapping[str, Any]  # plain data of ``spec``

    @property
    def relpath(self) -> str:
        return self.path.relative_to(self.root).as_posix()


class EditedFile(Protocol):
    """A file of the fleet working tree that an edit rewrites: a rollout
    file, or ``reconciler.yaml`` for ``freeze``."""

    @property
    def root(self) -> Path: ...
    @property
    def name(self) -> str: ...
    @property
    def path(self) -> Path: ...
    @property
    def text(self) -> str: ...
    @property
    def relpath(self) -> str: ...


@dataclass(frozen=True)
class Edit:
    """One intent, ready to be written: the file before and after, and what
    changed in words (``spec.paused: false -> true``)."""

    rollout: EditedFile
    verb: str
    after: str
    changes: tuple[str, ...]
    notes: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return self.after != self.rollout.text


def find_root(directory: Path) -> Path:
    """The fleet working tree holding ``directory``: the directory itself if it
    has ``rollouts/``, else the top of the Git working tree around it."""
    directory = directory.resolve()
    if (directory / ROLLOUTS_DIR).is_dir():
        return directory
    top = _rev_parse(directory, "--show-toplevel")
    if top and (Path(top) / ROLLOUTS_DIR).is_dir():
        return Path(top)
    if not top and _rev_parse(directory, "--is-bare-repository") == "true":
        raise ReconcilerError(
            f"{directory} is a bare repository: the intent verbs edit a rollout file, "
            "which needs a working clone",
            hint=f"clone it (git clone {directory}) and pass the clone with --repo "
            "(or use --push from the clone)",
        )
    raise ReconcilerError(
        f"{directory} is not a fleet working tree: it has no rollouts/ folder",
        hint="run this inside a clone of the fleet repository, or pass --repo DIR",
    )


def _rev_parse(directory: Path, flag: str) -> str:
    """What ``git rev-parse FLAG`` says in ``directory``; "" when git cannot say."""
    try:
        return subprocess.run(
            ["git", "-C", str(directory), "rev-parse", flag],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def rollout_names(root: Path) -> list[str]:
    folder = root / ROLLOUTS_DIR
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def load_rollout(root: Path, name: str) -> Rollout:
    path = root / rollout_path(name)
    if not path.is_file():
        known = rollout_names(root)
        listing = ", ".join(known) if known else "none"
        raise ReconcilerError(
            f"no rollout named {name!r}: rollouts/{name}.yaml does not exist",
            hint=f"rollouts in {root}: {listing}",
        )
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReconcilerError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    data = load_data(text, path.name)
    spec = data.get("spec") if isinstance(data, dict) else None
    if not isinstance(spec, dict):
        raise ReconcilerError(
            f"{rollout_path(name)} has no spec mapping",
            hint="run `reconciler validate` and fix the file first",
        )
    return Rollout(root=root, name=name, path=path, text=text, spec=spec)


def read_status(root: Path, name: str) -> StatusFacts | None:
    """The facts of ``status/NAME.yaml`` (and its node pages) in the working
    tree, or None if the daemon has not written one here (not seen yet, or
    status kept on a ``statusBranch``). Read by the one status reader; a
    record it cannot read (an older or newer daemon's) gives the few plain
    fields an intent needs."""
    path = root / status_path(name)
    if not path.is_file():
        return None
    statuses, _ = StatusCache().read(_StatusFilesOf(root, name), "")
    if name in statuses:
        return facts_from_status(statuses[name])
    record = load_data(path.read_bytes().decode("utf-8"), status_path(name))
    if not isinstance(record, dict):
        raise ReconcilerError(f"{status_path(name)} is not a mapping")
    pages = {
        f"{status_pages_dir(name)}/{page.name}": load_data(
            page.read_bytes().decode("utf-8"), page.name
        )
        for page in sorted((root / status_pages_dir(name)).glob("nodes-*.yaml"))
    }
    return facts_from_record(record, pages)


class _StatusFilesOf:
    """One rollout's status files in a working tree, as the status reader's
    source (blob ids are the paths)."""

    def __init__(self, root: Path, name: str) -> None:
        self.root = root
        self.name = name

    def files(self, commit: str, folder: str) -> dict[str, str]:
        if folder == STATUS_DIR:
            return {status_path(self.name): status_path(self.name)}
        directory = self.root / folder
        if not directory.is_dir():
            return {}
        return {f"{folder}/{p.name}": f"{folder}/{p.name}" for p in directory.glob("nodes-*.yaml")}

    def blob(self, blob_id: str) -> bytes:
        return (self.root / blob_id).read_bytes()


def facts_from_status(status: RolloutStatus) -> StatusFacts:
    return StatusFacts(
        phase=status.phase,
        hold_reason=status.hold.reason if status.hold else None,
        hold_message=status.hold.message if status.hold else "",
        operator_paused=status.operator_paused,
        live=status.frozen.live if status.frozen else None,
        nodes=tuple(n.name for n in status.nodes),
        node_states={n.name: n.state for n in status.nodes},
        last_handled_resume=status.last_handled_resume,
        rollback_ids=tuple(r.id for r in status.rollbacks),
    )


def facts_from_record(record: Mapping[str, Any], pages: Mapping[str, Any]) -> StatusFacts:
    """Read the plain fields of a status record (docs/configuration.md)."""
    hold = _mapping(record.get("hold"))
    frozen = _mapping(record.get("frozen"))
    node_records = [n for n in _list(record.get("nodes")) if isinstance(n, dict)]
    for _, page in sorted(pages.items()):
        node_records += [n for n in _list(_mapping(page).get("nodes")) if isinstance(n, dict)]
    names = [str(n.get("name")) for n in node_records]
    if not names:
        names = [str(n) for n in _list(frozen.get("nodes"))]
    live = frozen.get("live")
    return StatusFacts(
        phase=str(record.get("phase", "")),
        hold_reason=str(hold["reason"]) if hold.get("reason") else None,
        hold_message=str(hold.get("message", "")),
        operator_paused=bool(record.get("operatorPaused", False)),
        live=bool(live) if live is not None else None,
        nodes=tuple(names),
        node_states={str(n.get("name")): str(n.get("state", "")) for n in node_records},
        last_handled_resume=str(record.get("lastHandledResume") or ""),
        rollback_ids=tuple(
            str(r["id"])
            for r in _list(record.get("rollbacks"))
            if isinstance(r, dict) and "id" in r
        ),
    )


def _mapping(value: object) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def _list(value: object) -> list[Any]:
    return list(value) if isinstance(value, list) else []


# --------------------------------------------------------------------------
# The intents


def pause(root: Path, name: str) -> Edit:
    rollout = load_rollout(root, name)
    status = read_status(root, name)
    _refuse_terminal(rollout, status, "pause")
    if rollout.spec.get("paused") is True:
        return _unchanged(rollout, "pause", "spec.paused is already true")
    return _edit(rollout, "pause", {"paused": True})


def abort(root: Path, name: str) -> Edit:
    rollout = load_rollout(root, name)
    status = read_status(root, name)
    _refuse_terminal(rollout, status, "abort")
    if rollout.spec.get("abort") is True:
        return _unchanged(rollout, "abort", "spec.abort is already true")
    return _edit(rollout, "abort", {"abort": True})


def resume(root: Path, name: str, *, now: datetime, who: str, message: str = "") -> Edit:
    """Lift the operator pause, and answer the policy hold the status shows
    with a fresh ``resumeRequest`` (``2026-12-01T09:00:00Z alice: why``).

    Without a status file in the working tree nothing is known about holds,
    so the request is written and the daemon answers whatever hold is
    current when it handles it."""
    rollout = load_rollout(root, name)
    status = read_status(root, name)
    _refuse_terminal(rollout, status, "resume")
    paused = rollout.spec.get("paused") is True
    values: dict[str, object] = {}
    notes: list[str] = []
    if paused:
        values["paused"] = False
    if status is None:
        notes.append(
            f"no status/{name}.yaml in this working tree: the request answers whatever "
            "hold is current when the daemon handles it"
        )
        values["resumeRequest"] = _fresh_token(rollout, None, now, who, message)
    elif status.policy_hold:
        values["resumeRequest"] = _fresh_token(rollout, status, now, who, message)
    elif not paused:
        raise ReconcilerError(
            f"nothing to resume: {name} is {status.phase or 'unknown'}, holds nothing "
            "and spec.paused is not true",
            hint=f"`reconciler status {name}` shows what it is doing",
        )
    return _edit(rollout, "resume", values, notes)


def rollback(root: Path, name: str, nodes: Sequence[str] | None, *, now: datetime) -> Edit:
    """Write ``spec.rollbackRequest: {id, nodes}`` with a fresh id; ``nodes``
    None means ``all``."""
    rollout = load_rollout(root, name)
    status = read_status(root, name)
    live = status.live if status is not None and status.live is not None else None
    if live is None:
        live = rollout.spec.get("live") is True
    if not live:
        raise ReconcilerError(
            f"{name} is a dry-run rollout (live is not true): it changed nothing, "
            "so there is nothing to restore",
        )
    if (
        status is not None
        and status.phase == "running"
        and not status.hold_reason
        and rollout.spec.get("paused") is not True
    ):
        raise ReconcilerError(
            f"{name} is running and holds nothing: the daemon refuses a rollback while "
            "batches are still being sent",
            hint=f"pause it first (`reconciler pause {name}`, in the same commit is fine), "
            "or wait for a hold",
        )
    notes: list[str] = []
    if nodes is not None:
        wanted = list(dict.fromkeys(nodes))
        if status is not None and status.nodes:
            unknown = [n for n in wanted if n not in status.nodes]
            if unknown:
                raise ReconcilerError(
                    f"not nodes of {name}: {', '.join(unknown)}",
                    hint=f"its nodes: {_short_list(status.nodes)}",
                )
        else:
            known = {p.stem for p in (root / NODES_DIR).glob("*.yaml")}
            unknown = [n for n in wanted if n not in known]
            if unknown:
                raise ReconcilerError(
                    f"no such nodes in nodes/: {', '.join(unknown)}",
                    hint=f"nodes: {_short_list(sorted(known))}",
                )
        if status is not None:
            busy = [n for n in wanted if status.node_states.get(n) in RESTORING_STATES]
            if busy:
                notes.append(
                    f"already being restored: {', '.join(busy)}; the daemon refuses "
                    "those until the restore ends"
                )
        request: dict[str, object] = {"id": "", "nodes": wanted}
    else:
        request = {"id": "", "nodes": "all"}
    if status is None:
        notes.append(
            f"no status/{name}.yaml in this working tree: if the rollout has not "
            "started, the daemon has nothing to restore"
        )
    request["id"] = fresh_rollback_id(rollout, status, now)
    return _edit(rollout, "rollback", {"rollbackRequest": request}, notes)


def skip(root: Path, name: str, nodes: Sequence[str]) -> Edit:
    """Add ``nodes`` to ``spec.skipNodes``, keeping the names already there:
    each becomes ``skipped`` once it has not succeeded and has no job in
    flight. Refuses names that are not the rollout's nodes."""
    rollout = load_rollout(root, name)
    status = read_status(root, name)
    _refuse_terminal(rollout, status, "skip nodes")
    wanted = list(dict.fromkeys(nodes))
    known = (
        set(status.nodes)
        if status is not None and status.nodes
        else {p.stem for p in (root / NODES_DIR).glob("*.yaml")}
    )
    unknown = [n for n in wanted if n not in known]
    if unknown:
        where = f"nodes of {name}" if status is not None and status.nodes else "nodes in nodes/"
        raise ReconcilerError(
            f"not {where}: {', '.join(unknown)}", hint=f"its nodes: {_short_list(sorted(known))}"
        )
    current = [str(n) for n in rollout.spec.get("skipNodes") or ()]
    notes = [f"already in spec.skipNodes: {n}" for n in wanted if n in current]
    if status is not None:
        done = [n for n in wanted if status.node_states.get(n) == "succeeded"]
        if done:
            notes.append(f"already succeeded, so never skipped: {', '.join(done)}")
    added = [n for n in wanted if n not in current]
    if not added:
        return Edit(
            rollout=rollout, verb="skip", after=rollout.text, changes=(), notes=tuple(notes)
        )
    return _edit(rollout, "skip", {"skipNodes": [*current, *added]}, notes)


def fresh_rollback_id(rollout: Rollout, status: StatusFacts | None, now: datetime) -> str:
    """``r1``, then ``r2`` after ``r1``; ``r-YYYYMMDDHHMMSS`` when earlier ids
    do not count up."""
    used = list(status.rollback_ids if status else ())
    current = rollout.spec.get("rollbackRequest")
    if isinstance(current, dict) and current.get("id") is not None:
        used.append(str(current["id"]))
    numbers = [int(m.group(1)) for u in used if (m := _ROLLBACK_ID.match(u))]
    if numbers or not used:
        return f"r{max(numbers, default=0) + 1}"
    candidate = "r-" + now.strftime("%Y%m%d%H%M%S")
    return candidate if candidate not in used else candidate + f"-{len(used)}"


def _fresh_token(
    rollout: Rollout, status: StatusFacts | None, now: datetime, who: str, message: str
) -> str:
    taken = {str(rollout.spec.get("resumeRequest") or "")}
    if status is not None:
        taken.add(status.last_handled_resume)
    suffix = f" {who}" + (f": {message}" if message else "") if who else ""
    token = format_time(now.replace(microsecond=0)) + suffix
    if token in taken:  # two resumes within one second
        token = format_time(now) + suffix
    return token


def _refuse_terminal(rollout: Rollout, status: StatusFacts | None, verb: str) -> None:
    if status is not None and status.terminal:
        raise ReconcilerError(
            f"{rollout.name} is {status.phase}: a finished rollout cannot {verb}",
            hint=(
                "a terminal phase is final; to change the fleet again, add a new rollout"
                if verb != "abort"
                else "it has already ended; nothing is running to abort"
            ),
        )


def _unchanged(rollout: Rollout, verb: str, why: str) -> Edit:
    return Edit(rollout=rollout, verb=verb, after=rollout.text, changes=(), notes=(why,))


def _edit(
    rollout: Rollout, verb: str, values: Mapping[str, object], notes: Sequence[str] = ()
) -> Edit:
    after = set_spec_fields(rollout.text, values, source=rollout.relpath)
    changes = tuple(
        f"spec.{key}: {flow_text(rollout.spec[key]) if key in rollout.spec else '(absent)'}"
        f" -> {flow_text(value)}"
        for key, value in values.items()
    )
    return Edit(rollout=rollout, verb=verb, after=after, changes=changes, notes=tuple(notes))


def _short_list(names: Sequence[str], limit: int = 20) -> str:
    if not names:
        return "none"
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


# --------------------------------------------------------------------------
# Writing and committing


def write_edit(edit: Edit) -> None:
    if edit.changed:
        edit.rollout.path.write_bytes(edit.after.encode("utf-8"))


def operator_identity(root: Path) -> tuple[str, str]:
    """``(name, email)`` of the person, as git would sign their commit
    (``GIT_AUTHOR_NAME`` and friends, then git config); ``("", "")`` when git
    knows no one."""
    try:
        ident = subprocess.run(
            ["git", "-C", str(root), "var", "GIT_AUTHOR_IDENT"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ("", "")
    match = re.match(r"^(.*?) <(.*?)>", ident)
    return (match.group(1), match.group(2)) if match else ("", "")


def operator_name(root: Path) -> str:
    name, email = operator_identity(root)
    return name or email or os.environ.get("USER", "") or "someone"


def commit_message(edit: Edit, message: str, who: str) -> str:
    subject = f"{edit.verb} {edit.rollout.name}" + (f": {message}" if message else "")
    body = [f"Requested by {who} with `reconciler {edit.verb}`."] if who else []
    body += [f"{edit.rollout.relpath}: {change}" for change in edit.changes]
    return subject + "\n\n" + "\n".join(body) + "\n"


def check_committable(edit: Edit) -> None:
    """Refuse ``--commit`` when the rollout file already carries uncommitted
    changes: they would ride along in a commit that says it is only a pause."""
    root = edit.rollout.root
    result = run_git(root, "status", "--porcelain", "--", edit.rollout.relpath)
    if result.strip():
        raise ReconcilerError(
            f"{edit.rollout.relpath} has changes that are not committed",
            hint="commit or discard them first, or run without --commit and commit by hand",
        )


def commit_edit(edit: Edit, message: str) -> str:
    """Commit the edited rollout file alone; returns the new commit id."""
    root = edit.rollout.root
    name, email = operator_identity(root)
    who = f"{name} <{email}>" if email else name
    run_git(root, "add", "--", edit.rollout.relpath)
    run_git(
        root,
        "commit",
        "--quiet",
        "-m",
        commit_message(edit, message, who),
        "--",
        edit.rollout.relpath,
    )
    return run_git(root, "rev-parse", "HEAD").strip()


# --------------------------------------------------------------------------
# The layout-keeping edit


def set_spec_fields(text: str, values: Mapping[str, object], *, source: str = "<text>") -> str:
    """``text`` with ``spec.KEY`` set to each value: an existing value is
    replaced in place, a missing key is added as one line at the end of
    ``spec``. Everything else stays byte for byte. Raises ReconcilerError if
    the file is not a mapping with a ``spec`` mapping, or if the result would
    differ from the intent in any other way."""
    after = text
    for key, value in values.items():
        after = _set_one(after, key, value, source)
    before_data = load_data(text, source)
    expected = json.loads(json.dumps(before_data, default=str))
    expected["spec"].update(json.loads(json.dumps(dict(values))))
    if json.loads(json.dumps(load_data(after, source), default=str)) != expected:
        raise ReconcilerError(
            f"{source}: could not edit spec.{', spec.'.join(values)} without changing "
            "something else",
            hint="edit the file by hand",
        )
    return after


def _set_one(text: str, key: str, value: object, source: str) -> str:
    root = _compose(text, source)
    spec = _mapping_value(root, "spec") if isinstance(root, MappingNode) else None
    if not isinstance(spec, MappingNode):
        raise ReconcilerError(f"{source}: no spec mapping to edit")
    newline = "\r\n" if "\r\n" in text else "\n"
    for key_node, value_node in spec.value:
        if key_node.value != key:
            continue
        if _is_empty(value_node):
            colon = text.index(":", key_node.end_mark.index) + 1
            return text[:colon] + " " + flow_text(value) + text[colon:]
        if isinstance(value_node, ScalarNode) or value_node.flow_style:
            start, end = value_node.start_mark.index, node_end(value_node, text)
            return text[:start] + flow_text(value, value_node) + text[end:]
        # A block collection becomes one flow line; a comment on the key line stays.
        colon = text.index(":", key_node.end_mark.index) + 1
        eol = line_end(text, colon)
        comment = text[colon:eol].strip()
        tail = "  " + comment if comment.startswith("#") else ""
        return text[:colon] + " " + flow_text(value) + tail + text[node_end(value_node, text) :]
    line = f"{key}: {flow_text(value)}"
    if spec.flow_style:
        close = spec.end_mark.index - 1
        separator = ", " if spec.value else ""
        return text[:close].rstrip() + separator + line + text[close:]
    last_key, last_value = spec.value[-1]
    end = (
        text.index(":", last_key.end_mark.index) + 1
        if _is_empty(last_value)
        else node_end(last_value, text)
    )
    at = line_end(text, end)
    indent = " " * spec.value[0][0].start_mark.column
    return text[:at] + newline + indent + line + text[at:]


def _compose(text: str, source: str) -> Node:
    try:
        node = YAML(typ="rt").compose(text)
    except YAMLError as exc:
        raise ReconcilerError(
            f"{source}: not valid YAML: {exc}", hint="run `reconciler validate`"
        ) from exc
    if node is None:
        raise ReconcilerError(f"{source}: empty file")
    return node


def _mapping_value(mapping: MappingNode, key: str) -> Node | None:
    return next((v for k, v in mapping.value if k.value == key), None)


def _is_empty(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.value == "" and not node.style


def node_end(node: Node, text: str) -> int:
    """Index just after the last character of ``node``'s own text. Block
    collections end where their last item ends (their end mark lies after
    any comments that follow)."""
    if isinstance(node, ScalarNode):
        end = node.end_mark.index
        if node.style in ("|", ">"):
            while end > 0 and text[end - 1] in " \t\r\n":
                end -= 1
        return int(end)
    if getattr(node, "flow_style", False):
        return int(node.end_mark.index)
    if isinstance(node, MappingNode) and node.value:
        last_key, last_value = node.value[-1]
        if _is_empty(last_value):
            return text.index(":", last_key.end_mark.index) + 1
        return node_end(last_value, text)
    if isinstance(node, SequenceNode) and node.value:
        return node_end(node.value[-1], text)
    return int(node.end_mark.index)


def line_end(text: str, index: int) -> int:
    at = text.find("\n", index)
    if at == -1:
        return len(text)
    return at - 1 if at > 0 and text[at - 1] == "\r" else at


def flow_text(value: object, old: Node | None = None) -> str:
    """``value`` as a one-line YAML flow text; strings keep the quote style
    of the value they replace."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        style = getattr(old, "style", None) if isinstance(old, ScalarNode) else None
        if style == "'" and value.isprintable():
            return "'" + value.replace("'", "''") + "'"
        if style != '"' and _PLAIN_SAFE.match(value) and load_data(value, "<value>") == value:
            return value
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {flow_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(flow_text(v) for v in value) + "]"
    raise TypeError(f"cannot render {value!r}")


def load_data(text: str, source: str) -> Any:
    """Plain data of a YAML text, read as every reconciler document is read
    (timestamps stay text); ReconcilerError naming ``source`` if it is not
    such YAML."""
    try:
        return load_yaml(source, text.encode("utf-8"))
    except YamlProblem as exc:
        raise ReconcilerError(str(exc.problem), hint="run `reconciler validate`") from exc
