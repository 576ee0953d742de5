"""What the daemon must watch for the rollouts' comparisons and alerts
(docs/health.md): the live nodes whose soak it keeps, and the matchers to
ask Alertmanager, for the rollouts that run and those that may start now.

Pure: statuses and inputs in, names out.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from reconciler.engine.inputs import RolloutInput
from reconciler.engine.queries import open_nodes
from reconciler.spec.rollout_status import NodeRecord, RolloutStatus


def wanted_nodes(
    statuses: Iterable[RolloutStatus],
) -> Iterator[tuple[RolloutStatus, NodeRecord]]:
    """(status, node) of every dispatched node of a running live rollout
    with comparisons or alerts: the nodes whose soak the daemon keeps."""
    for status in statuses:
        f = status.frozen
        if f is None or not f.live or f.health is None or status.phase not in ACTIVE:
            continue
        if not (f.health.compare or f.health.alerts):
            continue
        for node in open_nodes(status):
            if node.state == "dispatched" and node.job_id is not None:
                yield status, node


def wanted_alerts(statuses: Iterable[RolloutStatus]) -> dict[str, tuple[str, ...]]:
    """The matchers of every running live rollout declaring alerts, by name."""
    return {
        s.name: s.frozen.health.alerts.matchers
        for s in statuses
        if s.frozen is not None
        and s.frozen.live
        and s.frozen.health is not None
        and s.frozen.health.alerts is not None
        and s.phase in ACTIVE
    }


ACTIVE = ("running", "paused")


def starting_alerts(inputs: Iterable[RolloutInput]) -> dict[str, tuple[str, ...]]:
    """The matchers of every live rollout declaring alerts that has not
    started yet: its first batch may start this pass, and waits for them too."""
    found = {}
    for inp in inputs:
        spec = inp.spec
        if spec is None or not spec.live or spec.health is None or spec.health.alerts is None:
            continue
        if inp.status is None or inp.status.phase in ("pending", "scheduled"):
            found[inp.name] = spec.health.alerts.matchers
    return found
