"""What a spec commit is judged on under ``spec.approvalRules``
(docs/approval-rules.md): the change from the last verified tree to the
commit's tree.

- ``Change.between(repo, base, new, tables)``: the spec files that differ, with
  each side's documents read from the trees (parsed once per blob id).
- ``Change.rules(rules)``: the rules that change touches: a rollout whose
  nodes, resolved in either tree, include a node the rule covers in either
  tree; a node file the rule covers in either tree (so moving a node out of
  a rule's reach needs that rule); ``reconciler.yaml`` for ``settings:
  true``. A side whose file cannot be read adds nothing; the other side
  still counts.
- ``Change.only_stops()``: does the change only set ``paused: true`` or
  ``abort: true`` on existing rollouts (less work, never more)?
- ``rules_at(repo, tree, tables)``: the rules a tree's ``reconciler.yaml`` declares
  (None when that file cannot be read as settings).

Reads Git trees; decides nothing about rollouts, and counts no approvals
(that is ``approval``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pygit2

from reconciler.git.history import changed_paths
from reconciler.spec.documents import ParsedFile, parse_file
from reconciler.spec.model import ApprovalRule, Node, RolloutSpec
from reconciler.spec.paths import NODES_DIR, ROLLOUTS_DIR, SETTINGS_PATH, SPEC_FILES, SPEC_FOLDERS
from reconciler.spec.safe_yaml import YamlProblem, load_yaml

# Only these fields, set to true, may differ in a change that only stops.
_STOP_FIELDS = ("paused", "abort")

_PARSED_KEPT = 20_000
_FLEETS_KEPT = 16
_SELECTIONS_KEPT = 20_000


class RuleTables:
    """What judging one change after another reads again, kept by the
    approver that judges them (a new approver starts empty): each a pure
    function of immutable Git objects named by their ids, so forgetting
    them changes nothing but the cost."""

    def __init__(self) -> None:
        # Parsed files by (path, blob id).
        self.parsed: dict[tuple[str, str], ParsedFile] = {}
        # The valid nodes of a ``nodes/`` tree, by its id: most commits share one.
        self.fleets: dict[str, Fleet] = {}
        # What a rule covers, and what a rollout file selects, in one fleet.
        self.covered: dict[tuple[ApprovalRule, str], frozenset[str]] = {}
        self.selections: dict[tuple[str, str, str], frozenset[str]] = {}


@dataclass(frozen=True)
class Fleet:
    """The valid nodes of a ``nodes/`` tree, named by that tree's id."""

    key: str
    nodes: Mapping[str, Node]

    def covered(self, rule: ApprovalRule, tables: RuleTables) -> frozenset[str]:
        covered = tables.covered
        found = covered.get((rule, self.key))
        if found is None:
            found = frozenset(n for n, node in self.nodes.items() if rule.covers_node(node))
            if len(covered) >= _SELECTIONS_KEPT:
                covered.clear()
            covered[(rule, self.key)] = found
        return found


_NO_FLEET = Fleet("", {})


@dataclass(frozen=True)
class Side:
    """One tree of a change, read lazily: its nodes by name and its files."""

    repo: pygit2.Repository
    tree: pygit2.Tree | None
    tables: RuleTables

    def blob(self, path: str) -> pygit2.Blob | None:
        entry = self.entry(path)
        found = None if entry is None else self.repo[entry.id]
        return found if isinstance(found, pygit2.Blob) else None

    def parsed(self, path: str) -> ParsedFile | None:
        entry = self.entry(path)
        if entry is None:
            return None
        key = (path, str(entry.id))
        parsed = self.tables.parsed
        found = parsed.get(key)
        if found is None:
            blob = self.repo[entry.id]
            if not isinstance(blob, pygit2.Blob):
                return None
            found = parse_file(path, blob.data)
            if len(parsed) >= _PARSED_KEPT:
                parsed.clear()
            parsed[key] = found
        return found

    def nodes(self) -> Fleet:
        """Every valid node of this tree, by name (kept per ``nodes/`` tree id)."""
        folder = None if self.tree is None else _subtree(self.repo, self.tree, NODES_DIR)
        if folder is None:
            return _NO_FLEET
        key = str(folder.id)
        fleets = self.tables.fleets
        cached = fleets.get(key)
        if cached is not None:
            return cached
        found: dict[str, Node] = {}
        for entry in folder:
            name = entry.name or ""
            parsed = self.parsed(f"{NODES_DIR}/{name}")
            if parsed is not None and parsed.node is not None:
                found[parsed.node.name] = parsed.node
        fleet = Fleet(key, found)
        if len(fleets) >= _FLEETS_KEPT:
            fleets.pop(next(iter(fleets)))
        fleets[key] = fleet
        return fleet

    def entry(self, path: str) -> pygit2.Object | None:
        if self.tree is None:
            return None
        try:
            return self.tree[path]
        except KeyError:
            return None


@dataclass(frozen=True)
class Change:
    """The spec files that differ from ``base`` (None: no verified tree yet,
    so everything in ``new`` is new) to ``new``."""

    base: Side
    new: Side
    paths: frozenset[str]

    @classmethod
    def between(
        cls,
        repo: pygit2.Repository,
        base: pygit2.Tree | None,
        new: pygit2.Tree,
        tables: RuleTables,
    ) -> Change:
        paths = changed_paths(repo, base, new, SPEC_FOLDERS, SPEC_FILES)
        return cls(Side(repo, base, tables), Side(repo, new, tables), paths)

    def rules(self, rules: Iterable[ApprovalRule]) -> tuple[ApprovalRule, ...]:
        """The rules this change touches, in their order."""
        rules = tuple(rules)
        if not rules or not self.paths:
            return ()
        node_files = [p for p in self.paths if p.startswith(NODES_DIR + "/")]
        rollout_files = [p for p in self.paths if p.startswith(ROLLOUTS_DIR + "/")]
        needs_fleets = any(r.selector is not None or r.node_ids is not None for r in rules)
        fleets = (self.base.nodes(), self.new.nodes()) if needs_fleets else (_NO_FLEET,) * 2
        touched: list[ApprovalRule] = []
        for rule in rules:
            if rule.settings and SETTINGS_PATH in self.paths:
                touched.append(rule)
                continue
            if rule.selector is None and rule.node_ids is None:
                continue
            tables = self.new.tables
            covered = fleets[0].covered(rule, tables) | fleets[1].covered(rule, tables)
            if self._touches_nodes(rule, node_files) or any(
                covered & self._rollout_nodes(path, fleets) for path in rollout_files
            ):
                touched.append(rule)
        return tuple(touched)

    def _touches_nodes(self, rule: ApprovalRule, paths: Iterable[str]) -> bool:
        for path in paths:
            for side in (self.base, self.new):
                parsed = side.parsed(path)
                if parsed is not None and parsed.node is not None and rule.covers_node(parsed.node):
                    return True
        return False

    def _rollout_nodes(self, path: str, fleets: tuple[Fleet, Fleet]) -> set[str]:
        """The nodes rollout file ``path`` names or selects, in either tree
        (every matching node, in maintenance or not: a superset is safe)."""
        found: set[str] = set()
        for side in (self.base, self.new):
            entry = side.entry(path)
            parsed = side.parsed(path)
            spec = None if parsed is None else parsed.rollout
            if spec is None or entry is None:
                continue
            for fleet in fleets:
                key = (path, str(entry.id), fleet.key)
                selections = side.tables.selections
                selected = selections.get(key)
                if selected is None:
                    selected = frozenset(_selected(spec, fleet.nodes))
                    if len(selections) >= _SELECTIONS_KEPT:
                        selections.clear()
                    selections[key] = selected
                found |= selected
        return found

    def only_stops(self) -> bool:
        """Is every difference a rollout file whose only changed fields are
        ``spec.paused`` or ``spec.abort``, now ``true``? False with no
        verified tree to compare with."""
        if self.base.tree is None or not self.paths:
            return False
        for path in self.paths:
            if not path.startswith(ROLLOUTS_DIR + "/"):
                return False
            before, after = _plain(self.base.blob(path)), _plain(self.new.blob(path))
            if not _stops_only(before, after):
                return False
        return True


def rules_at(
    repo: pygit2.Repository, tree: pygit2.Tree | None, tables: RuleTables
) -> tuple[ApprovalRule, ...] | None:
    """The approval rules of ``tree`` (() without ``reconciler.yaml``; None
    when it is there but not valid settings)."""
    side = Side(repo, tree, tables)
    parsed = side.parsed(SETTINGS_PATH)
    if parsed is None:
        return ()
    if parsed.settings is None:
        return None
    return parsed.settings.approval_rules


def _selected(spec: RolloutSpec, fleet: Mapping[str, Node]) -> Iterable[str]:
    if spec.node_ids is not None:
        return spec.node_ids
    selector = spec.selector or ()
    return [name for name, node in fleet.items() if node.matches(selector)]


def _plain(blob: pygit2.Blob | None) -> Any:
    if blob is None:
        return _MISSING
    try:
        return load_yaml("rollout", blob.data)
    except YamlProblem:
        return _MISSING


_MISSING = object()


def _stops_only(before: Any, after: Any) -> bool:
    if before is _MISSING or after is _MISSING:
        return False
    if not isinstance(before, dict) or not isinstance(after, dict):
        return False
    spec_before, spec_after = before.get("spec"), after.get("spec")
    if not isinstance(spec_before, dict) or not isinstance(spec_after, dict):
        return False
    if {k: v for k, v in before.items() if k != "spec"} != {
        k: v for k, v in after.items() if k != "spec"
    }:
        return False
    rest_before = {k: v for k, v in spec_before.items() if k not in _STOP_FIELDS}
    rest_after = {k: v for k, v in spec_after.items() if k not in _STOP_FIELDS}
    if rest_before != rest_after:
        return False
    changed = [f for f in _STOP_FIELDS if spec_before.get(f) != spec_after.get(f)]
    return all(spec_after.get(f) is True for f in changed)


def _subtree(repo: pygit2.Repository, tree: pygit2.Tree, name: str) -> pygit2.Tree | None:
    try:
        entry = tree[name]
    except KeyError:
        return None
    found = repo[entry.id]
    return found if isinstance(found, pygit2.Tree) else None
