"""The daemon's side of a rollout's comparisons (docs/health.md): it keeps
each live node's soak on the daemon's clock, and once the soak has elapsed
asks Prometheus for the node's window and its baseline's, and judges each
comparison with ``canary_statistics``. The verdicts go to the engine as
observations (``CanaryWatch``); the engine decides what they mean.
These are readings of each comparison, not the node's verdict: that is
the engine's (``engine.verdicts``).

The soak starts at the pass that first sees the node's apply succeed with
a fresh heartbeat naming the target. The baseline is the rollout's nodes
not yet dispatched, staged ones included (those the comparison's selector
picks, if it has one); when none is left, the node's own window of the same length before its
dispatch.

Soft state only: the watches (``SoakMemory``), forgotten on restart, so a
restarted daemon starts a soak again (never shortens one).

Must not: decide a node's verdict, read Git, or keep rollout state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from reconciler.daemon.range_queries import RangeAnswer, RangeQueries, RangeQuery
from reconciler.engine import canary_queries, comparisons
from reconciler.engine.evidence import heartbeat_problem
from reconciler.protocol.canary_observations import CanaryWatch, ComparisonVerdict
from reconciler.protocol.observations import Observations
from reconciler.spec.compare import Comparison, Measured
from reconciler.spec.health import Health, for_node
from reconciler.spec.model import Node
from reconciler.spec.rollout_status import NodeRecord, RolloutStatus
from reconciler.statistics import canary_statistics as stats

# Node states still on the config the rollout found: staging downloads
# files beside it and changes nothing the runtime serves.
UNCHANGED = ("pending", "staging", "staged")


@dataclass(frozen=True)
class _Due:
    """One comparison of one node to judge now, and the windows it needs."""

    node: str
    comparison: Comparison
    health: Health
    start: datetime
    end: datetime
    baseline: tuple[str, ...]  # empty: no baseline at all
    base_start: datetime
    base_end: datetime
    own_window: bool

    def queries(self, text: str, who: str) -> RangeQuery:
        """``text`` for node ``who``, over the node's window (or the
        baseline's, for a baseline node)."""
        mine = who == self.node and not self.own_window
        start, end = (self.start, self.end) if mine else (self.base_start, self.base_end)
        return RangeQuery(for_node(text, who), start, end, self.health.interval)

    def own(self, text: str) -> RangeQuery:
        return RangeQuery(for_node(text, self.node), self.start, self.end, self.health.interval)

    def texts(self) -> tuple[str, ...]:
        c = self.comparison
        return (c.query,) if c.query else (c.errors, c.total)

    def baseline_key(self) -> tuple[object, ...]:
        """The same for every node of a batch that shares this baseline."""
        return (self.texts(), self.base_start, self.base_end, self.baseline)

    def baseline_queries(self) -> list[RangeQuery]:
        return [self.queries(t, b) for t in self.texts() for b in self.baseline]


@dataclass
class SoakMemory:
    """Soft state, forgotten on restart: each live node's watch (when its
    soak began, the comparisons judged), by node."""

    watches: dict[str, CanaryWatch] = field(default_factory=dict)


class CanaryReadings:
    """Keeps the live nodes' soaks and judges their comparisons."""

    def __init__(
        self,
        queries: RangeQueries,
        clock: Callable[[], datetime],
        memory: SoakMemory | None = None,
    ) -> None:
        self.queries = queries
        self.clock = clock
        self.watches = (memory or SoakMemory()).watches  # by node; the soft state's own dict
        # The earliest soak still under way at the last observe ends then:
        # the daemon's next pass is due at that moment, not at its interval.
        self.next_soak_end: datetime | None = None

    def observe(
        self,
        statuses: Iterable[RolloutStatus],
        observed: Observations,
        fleet: Mapping[str, Node],
        prometheus_url: str | None,
    ) -> dict[str, CanaryWatch]:
        """Start the soaks this pass sees begin, judge the comparisons whose
        soak has elapsed, and return every node's watch."""
        now = self.clock()
        wanted = list(canary_queries.wanted_nodes(statuses))
        keep = {node.name: node.job_id for _, node in wanted}
        for name in [n for n, w in self.watches.items() if keep.get(n) != w.job_id]:
            del self.watches[name]
        if any(
            s.frozen is not None and s.frozen.health is not None and s.frozen.health.compare
            for s, _ in wanted
        ):
            stats.prepare()
        due: list[_Due] = []
        ahead: list[datetime] = []
        baselines: dict[tuple[str, str], _Baseline] = {}
        for status, node in wanted:
            assert status.frozen is not None and status.frozen.health is not None
            watch = self.watches.get(node.name) or self._begun(status, node, observed, now)
            if watch is None:
                continue
            self.watches[node.name] = watch
            health = status.frozen.health
            soak_end = watch.soak_since + timedelta(seconds=health.soak)
            if now < soak_end:
                ahead.append(soak_end)
                continue
            due.extend(
                _due(status, node, c, watch, fleet, baselines)
                for c in health.compare
                if c.name not in watch.verdicts
            )
        self.next_soak_end = min(ahead, default=None)
        if due:
            self._judge(due, prometheus_url)
        return dict(self.watches)

    def _begun(
        self, status: RolloutStatus, node: NodeRecord, observed: Observations, now: datetime
    ) -> CanaryWatch | None:
        """A new watch when this pass sees the apply succeed with a fresh
        heartbeat naming the target."""
        assert status.frozen is not None and node.job_id is not None
        job = observed.jobs.get(node.job_id)
        if job is None or job.state != "succeeded":
            return None
        if heartbeat_problem(observed.heartbeats.get(node.name), job, status.frozen.target):
            return None
        return CanaryWatch(node.job_id, now)

    def _judge(self, due: Sequence[_Due], url: str | None) -> None:
        if url is None:
            for d in due:
                self._record(d, _unknown(d, "settings.spec.prometheus is not set"))
            return
        asked: dict[RangeQuery, None] = {}
        shared: set[tuple[object, ...]] = set()  # a batch's baseline: its queries once
        for d in due:
            asked.update(dict.fromkeys(d.own(text) for text in d.texts()))
            if d.baseline_key() not in shared:
                shared.add(d.baseline_key())
                asked.update(dict.fromkeys(d.baseline_queries()))
        answers = self.queries.ask_all(url, asked)
        for d, verdict in zip(due, judge_all(due, answers), strict=True):
            self._record(d, verdict)

    def _record(self, d: _Due, verdict: ComparisonVerdict) -> None:
        watch = self.watches[d.node]
        self.watches[d.node] = replace(watch, verdicts={**watch.verdicts, verdict.name: verdict})


@dataclass(frozen=True)
class _Baseline:
    """A comparison's baseline in a rollout this pass: its nodes not yet
    dispatched, and whether its selector picks any node at all."""

    pending: tuple[str, ...]
    chosen_any: bool


def _baseline_of(
    found: dict[tuple[str, str], _Baseline],
    status: RolloutStatus,
    comparison: Comparison,
    fleet: Mapping[str, Node],
) -> _Baseline:
    """The baseline, worked out once per rollout and comparison a pass."""
    key = (status.name, comparison.name)
    if key not in found:
        chosen = [
            n
            for n in status.nodes
            if comparison.baseline is None
            or comparisons.selects(comparison.baseline, fleet.get(n.name))
        ]
        pending = tuple(n.name for n in chosen if n.state in UNCHANGED and n.name in fleet)
        found[key] = _Baseline(pending, bool(chosen))
    return found[key]


def _due(
    status: RolloutStatus,
    node: NodeRecord,
    comparison: Comparison,
    watch: CanaryWatch,
    fleet: Mapping[str, Node],
    baselines: dict[tuple[str, str], _Baseline] | None = None,
) -> _Due:
    """``baselines`` keeps the baselines worked out so far this pass."""
    assert status.frozen is not None and status.frozen.health is not None
    chosen = _baseline_of({} if baselines is None else baselines, status, comparison, fleet)
    health = status.frozen.health
    start = watch.soak_since
    end = start + timedelta(seconds=health.soak)
    baseline = chosen.pending
    if baseline or not chosen.chosen_any:
        return _Due(node.name, comparison, health, start, end, baseline, start, end, False)
    # None left: the node's own window of the same length before its dispatch.
    dispatched = node.dispatched_at or start
    before = dispatched - timedelta(seconds=health.soak)
    return _Due(node.name, comparison, health, start, end, (node.name,), before, dispatched, True)


def judge_all(
    due: Sequence[_Due], answers: Mapping[RangeQuery, RangeAnswer]
) -> list[ComparisonVerdict]:
    """Each comparison's verdict from Prometheus's answers. A batch shares
    its baseline: its answers are looked at, pooled or counted once, and the
    nodes' quantities against it are tested together."""
    verdicts: dict[int, ComparisonVerdict] = {}
    failed: dict[tuple[object, ...], str] = {}  # a baseline's first error
    quantities: dict[tuple[object, ...], list[int]] = {}  # by comparison and baseline
    counted: dict[tuple[object, ...], stats.Counts] = {}
    for i, d in enumerate(due):
        why = _unanswered(d, answers, failed)
        if why:
            verdicts[i] = _unknown(d, why)
        elif d.comparison.query:
            quantities.setdefault((d.comparison, *d.baseline_key()), []).append(i)
        else:
            c = d.comparison
            key = d.baseline_key()
            if key not in counted:
                counted[key] = _pooled_rate(d, answers)
            ours = _aligned(answers[d.own(c.errors)], answers[d.own(c.total)])
            judged = stats.compare_rate(
                ours, counted[key], tolerance=c.tolerance, min_samples=c.min_samples
            )
            verdicts[i] = _verdict(d, judged)
    for members in quantities.values():
        verdicts.update(zip(members, _quantities([due[i] for i in members], answers), strict=True))
    return [verdicts[i] for i in range(len(due))]


def _unanswered(
    d: _Due, answers: Mapping[RangeQuery, RangeAnswer], failed: dict[tuple[object, ...], str]
) -> str:
    """Why ``d`` cannot be judged: no baseline, or an error from Prometheus
    for the node or its baseline (``failed`` keeps each baseline's)."""
    if not d.baseline:
        return "no baseline: the baseline selector matches none of this rollout's nodes"
    key = d.baseline_key()
    if key not in failed:
        wanted = d.baseline_queries()
        failed[key] = next((answers[q].error for q in wanted if answers[q].error), "")
    error = next((answers[q].error for q in map(d.own, d.texts()) if answers[q].error), "")
    error = error or failed[key]
    return f"no answer from Prometheus: {error}" if error else ""


def _quantities(
    due: Sequence[_Due], answers: Mapping[RangeQuery, RangeAnswer]
) -> list[ComparisonVerdict]:
    """The verdicts of one ``query`` comparison for nodes that share one
    baseline."""
    first = due[0]
    c = first.comparison
    pooled = stats.pool(
        [v for b in first.baseline for v in answers[first.queries(c.query, b)].values()]
    )
    judged = stats.compare_quantities(
        [answers[d.own(c.query)].values() for d in due],
        pooled,
        worse=c.worse,
        tolerance=c.tolerance,
        min_samples=c.min_samples,
    )
    return [_verdict(d, j) for d, j in zip(due, judged, strict=True)]


def _pooled_rate(d: _Due, answers: Mapping[RangeQuery, RangeAnswer]) -> stats.Counts:
    c = d.comparison
    base: tuple[list[float], list[float]] = ([], [])
    for b in d.baseline:
        errors, total = _aligned(answers[d.queries(c.errors, b)], answers[d.queries(c.total, b)])
        base[0].extend(errors)
        base[1].extend(total)
    return stats.count(*base)


def _aligned(errors: RangeAnswer, total: RangeAnswer) -> tuple[list[float], list[float]]:
    """Errors and totals at the steps the total has; a step without errors
    is 0 (a counter that never moved has no series)."""
    counted, steps = errors.by_time(), total.by_time()
    times = sorted(steps)
    return [counted.get(t, 0.0) for t in times], [steps[t] for t in times]


def _verdict(d: _Due, judged: stats.Judgement) -> ComparisonVerdict:
    kind = "median" if d.comparison.query else "rate"
    pick = (lambda s: s.median) if kind == "median" else (lambda s: s.rate)
    measured = Measured(
        kind=kind,
        canary=pick(judged.canary),
        canary_samples=judged.canary.samples,
        baseline=pick(judged.baseline),
        baseline_samples=judged.baseline.samples,
        baseline_nodes=d.baseline,
        change=judged.change,
        p_value=judged.p_value,
        own_window=d.own_window,
        canary_spread=judged.canary.spread,
        baseline_spread=judged.baseline.spread,
    )
    against = (
        "against its own window before its dispatch"
        if d.own_window
        else f"against {len(d.baseline)} baseline node(s)"
    )
    return ComparisonVerdict(
        d.comparison.name, judged.verdict, f"{judged.detail}, {against}", measured
    )


def _unknown(d: _Due, why: str) -> ComparisonVerdict:
    return ComparisonVerdict(d.comparison.name, stats.UNKNOWN, why)
