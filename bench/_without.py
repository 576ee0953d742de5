"""Turn speed shortcuts off in a bench process, to measure what each is
worth (``bench/shortcuts.py``).

``apply(names)`` replaces each named shortcut by its plain twin: a cached
function by the function itself, a fast check by the validator it stands
for, a memo by nothing. Every replacement computes the same values, so a
bench measures only the cost. ``bench/shortcuts.py`` runs benches with
``BENCH_WITHOUT=name,...`` and a ``sitecustomize`` that calls ``apply``
before anything else is imported, so the names other modules import are
already the plain ones, in the bench and in every process it starts.

Must not be imported by the package: benches only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from operator import attrgetter
from typing import Any

ENV = "BENCH_WITHOUT"


def _uncached(module: Any, *names: str) -> None:
    for name in names:
        setattr(module, name, getattr(module, name).__wrapped__)


def _times_cache() -> None:
    from reconciler.spec import times

    _uncached(times, "_format_aware")


def _agent_url_cache() -> None:
    from reconciler.spec import agent_url

    _uncached(agent_url, "is_usable_agent_url")


def _yaml_scalar_caches() -> None:
    from reconciler.spec import safe_yaml

    _uncached(safe_yaml, "_scalar", "_number", "_value_text", "_key_text")


def _schema_fast_check() -> None:
    from reconciler.spec import schemas

    schemas.fast_check = functools.cache(lambda name: schemas.validator(name).is_valid)


def _job_fast_path() -> None:
    from reconciler.protocol import job_payload

    def plainly_valid(document: Any, *, envelope: bool) -> bool:
        payload_validator, envelope_validator = job_payload._validators()
        return (envelope_validator if envelope else payload_validator).is_valid(document)

    job_payload._plainly_valid = plainly_valid  # type: ignore[assignment]


def _agent_head_cache() -> None:
    from reconciler.protocol import h11_server

    _uncached(h11_server, "_head")


def _agent_stored_time_cache() -> None:
    from reconciler.node import agent

    _uncached(agent, "_stored_time")


def _fleet_index_cache() -> None:
    from reconciler.spec import model

    model.Fleet.index = property(model.FleetIndex)  # type: ignore[assignment,method-assign]


def _step_memo() -> None:
    from reconciler.engine import step

    original = step.step_fleet

    def step_fleet(*args: Any, memo: Any = None, changed: Any = None, **kwargs: Any) -> Any:
        return original(*args, memo=None, changed=None, **kwargs)

    step.step_fleet = step_fleet  # type: ignore[assignment]


def _inert_statuses() -> None:
    from reconciler.daemon import inert

    original = inert.InertStatuses.lively

    def lively(self: Any, statuses: Any, *, every: bool = True) -> Any:
        self._known = {}
        return original(self, statuses, every=every)

    def lively_changed(self: Any, statuses: Any, changed: Any) -> Any:
        return sorted(lively(self, statuses), key=attrgetter("name"))

    inert.InertStatuses.lively = lively  # type: ignore[method-assign]
    inert.InertStatuses.lively_changed = lively_changed  # type: ignore[method-assign]


def _git_write_shortcuts() -> None:
    from reconciler.git import store

    original = store.GitStore._blob_writer

    def blob_writer(self: Any) -> Any:
        found = original(self)
        self._pieces = None
        self._large_trees = None
        return found

    store.GitStore._blob_writer = blob_writer  # type: ignore[method-assign]


def _read_shortcuts() -> None:
    from reconciler.daemon import loop

    original = loop.Daemon.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **{**kwargs, "plain": True})

    loop.Daemon.__init__ = init  # type: ignore[method-assign]


def _combined_range_queries() -> None:
    from reconciler.daemon import range_queries

    original = range_queries.RangeQueries.__init__

    def init(self: Any, **kwargs: Any) -> None:
        original(self, **{**kwargs, "batched": False})

    range_queries.RangeQueries.__init__ = init  # type: ignore[method-assign]


class _Forgetful(dict):  # type: ignore[type-arg]
    """A table that keeps nothing: every lookup misses."""

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def update(self, *args: Any, **kwargs: Any) -> None:
        pass


def _rule_tables() -> None:
    from reconciler.git import approval_rules

    original = approval_rules.RuleTables.__init__

    def init(self: Any) -> None:
        original(self)
        self.parsed, self.fleets, self.covered, self.selections = (_Forgetful() for _ in "1234")

    approval_rules.RuleTables.__init__ = init  # type: ignore[method-assign]


SHORTCUTS: dict[str, Callable[[], None]] = {
    # Turns nothing off: both sides are the same, so its change is the noise.
    "nothing": lambda: None,
    "times-cache": _times_cache,
    "agent-url-cache": _agent_url_cache,
    "yaml-scalar-caches": _yaml_scalar_caches,
    "schema-fast-check": _schema_fast_check,
    "job-fast-path": _job_fast_path,
    "agent-head-cache": _agent_head_cache,
    "agent-stored-time-cache": _agent_stored_time_cache,
    "fleet-index-cache": _fleet_index_cache,
    "step-memo": _step_memo,
    "inert-statuses": _inert_statuses,
    "git-write-shortcuts": _git_write_shortcuts,
    "read-shortcuts": _read_shortcuts,
    "combined-range-queries": _combined_range_queries,
    "rule-tables": _rule_tables,
}


def apply(names: str) -> None:
    for name in filter(None, (n.strip() for n in names.split(","))):
        SHORTCUTS[name]()
