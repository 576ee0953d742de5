"""Rollout shapes: what deploy windows, freezes and growing batches cost the
engine (docs/rollouts.md).

    .venv/bin/python bench/shapes.py [--nodes 10000] [--calls 20000]

Prints the median cost of one window-and-freeze check (``batch_gate``,
five windows in two zones and three freezes, at random moments of a year),
and the median idle step of a rollout of ``--nodes`` nodes cut by
``batches: [1, "1%", "10%"]`` while a freeze keeps its next batch waiting
(each such step runs the check once). Targets: a check under 1 ms; the
idle step under 5 ms (bench/engine.py's target).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import zoneinfo
from datetime import UTC, datetime, timedelta

from _common import emit, row

from reconciler.engine.calendar import batch_gate
from reconciler.engine.step import RolloutInput, step_fleet
from reconciler.protocol.observations import JobObservation, Observations
from reconciler.spec.model import Fleet, Freeze, Node, RolloutSpec, Settings, Target, Window
from reconciler.spec.rollout_status import RolloutStatus
from reconciler.spec.times import format_time

TARGET = Target("hermes", "ollama", "llama3.1-8b", "default")
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def windows() -> tuple[Window, ...]:
    berlin, york = zoneinfo.ZoneInfo("Europe/Berlin"), zoneinfo.ZoneInfo("America/New_York")
    return (
        Window(frozenset({0, 1, 2, 3}), 9 * 60, 17 * 60, "Europe/Berlin", berlin),
        Window(frozenset({4}), 9 * 60, 12 * 60, "Europe/Berlin", berlin),
        Window(frozenset({0, 1, 2, 3}), 10 * 60, 16 * 60, "America/New_York", york),
        Window(frozenset({5}), 1 * 60, 4 * 60, "Europe/Berlin", berlin),
        Window(frozenset({6}), 1 * 60, 4 * 60, "America/New_York", york),
    )


def freezes(start: datetime) -> tuple[Freeze, ...]:
    return tuple(
        Freeze(start + timedelta(days=d), start + timedelta(days=d + 3), "bench")
        for d in (20, 90, 200)
    )


def time_gate(calls: int) -> float:
    rng = random.Random(7)
    wins, frz = windows(), freezes(T0)
    moments = [T0 + timedelta(seconds=rng.randrange(365 * 86400)) for _ in range(calls)]
    samples = []
    for chunk in range(0, calls, 1000):
        started = time.perf_counter()
        for moment in moments[chunk : chunk + 1000]:
            batch_gate(wins, frz, moment)
        samples.append((time.perf_counter() - started) / len(moments[chunk : chunk + 1000]))
    return statistics.median(samples)


def idle_steps(nodes: int, settings: Settings) -> float:
    names = [f"node-{i:05d}" for i in range(nodes)]
    fleet = Fleet(
        tuple(Node(n, f"http://10.0.{i // 250}.{i % 250 + 1}:8710") for i, n in enumerate(names))
    )
    spec = RolloutSpec(name="big", target=TARGET, node_ids=tuple(names), batches=(1, "1%", "10%"))
    status: RolloutStatus | None = None
    jobs: dict[str, JobObservation] = {}

    def step(now: datetime) -> RolloutStatus | None:
        inp = RolloutInput("big", spec, True, (), status, "a" * 40, "a" * 40, 0)
        result = step_fleet([inp], fleet, settings, Observations(jobs=jobs), now)
        for job in result.effects:
            jobs[job.job_id] = JobObservation(job.job_id, "succeeded", finished_at=format_time(now))
        return result.statuses.get("big", status)

    status = step(T0)  # batch 1 out (before the freeze)
    frozen_at = T0 + timedelta(seconds=10)
    status = step(frozen_at)  # batch 1 done; the freeze (if any) keeps batch 2 back
    samples = []
    for k in range(30):
        inp = RolloutInput("big", spec, True, (), status, "a" * 40, "a" * 40, 0)
        started = time.perf_counter()
        result = step_fleet(
            [inp], fleet, settings, Observations(jobs=jobs), frozen_at + timedelta(seconds=k)
        )
        samples.append(time.perf_counter() - started)
        assert not result.statuses and not result.effects, "a waiting step changed something"
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=20_000)
    args = parser.parse_args()

    gate = time_gate(args.calls)
    freeze = Freeze(T0 + timedelta(seconds=5), T0 + timedelta(days=2), "bench")
    waiting = idle_steps(args.nodes, Settings(windows=windows(), freezes=(freeze,)))
    print(f"batch_gate (5 windows, 3 freezes): median {gate * 1e6:.1f} us per check")
    print(
        f"{args.nodes} nodes, batches [1, 1%, 10%]: idle step waiting for a freeze "
        f"{waiting * 1e3:.2f} ms"
    )
    emit(
        [
            row("shapes: window and freeze check, median", gate * 1e3, "ms", 1.0, "target <"),
            row(
                f"shapes: idle step, {args.nodes:,} nodes waiting for a freeze",
                waiting * 1e3,
                "ms",
                5.0,
                "target <",
            ),
        ]
    )


if __name__ == "__main__":
    main()
