"""Engine speed: step a 10,000-node rollout (batchSize 500) to completion
with synthetic observations, no IO, and time one idle step on it.

    .venv/bin/python bench/engine.py [--nodes 10000] [--batch 500] [--live]

Prints total engine seconds for the whole rollout, microseconds per
node-step (engine time / nodes), and the median cost of an idle step (a
step in the middle of a running batch with nothing new observed).
Targets: whole rollout under 1 s; idle step under 5 ms.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime, timedelta

from _common import emit, row

from reconciler.engine.step import RolloutInput, step_fleet
from reconciler.protocol.effects import SendJob
from reconciler.protocol.observations import Heartbeat, JobObservation, Observations, RuntimeReport
from reconciler.spec.model import Fleet, Node, RolloutSpec, Settings, Target
from reconciler.spec.rollout_status import RolloutStatus
from reconciler.spec.times import format_time

TARGET = Target("hermes", "ollama", "llama3.1-8b", "default")
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--live", action="store_true", help="live: verdicts need heartbeats")
    args = parser.parse_args()

    names = [f"node-{i:05d}" for i in range(args.nodes)]
    fleet = Fleet(
        tuple(Node(n, f"http://10.0.{i // 250}.{i % 250 + 1}:8710") for i, n in enumerate(names))
    )
    spec = RolloutSpec(
        name="big", target=TARGET, node_ids=tuple(names), batch_size=args.batch, live=args.live
    )
    settings = Settings()
    jobs: dict[str, JobObservation] = {}
    beats: dict[str, Heartbeat] = {}
    status: RolloutStatus | None = None
    now = T0
    engine_seconds = 0.0
    engine_cpu = 0.0
    steps = 0
    idle: list[float] = []

    def step() -> None:
        nonlocal status, engine_seconds, engine_cpu, steps
        inp = RolloutInput(
            name="big",
            spec=spec,
            file_present=True,
            problems=(),
            status=status,
            spec_commit="a" * 40,
            first_seen_commit="a" * 40,
            queue_key=0,
        )
        obs = Observations(jobs=jobs, heartbeats=beats)
        started, cpu = time.perf_counter(), time.process_time()
        result = step_fleet([inp], fleet, settings, obs, now)
        engine_seconds += time.perf_counter() - started
        engine_cpu += time.process_time() - cpu
        steps += 1
        status = result.statuses.get("big", status)
        for job in result.effects:
            pending.append(job)

    pending: list[SendJob] = []  # jobs sent and not yet answered
    step()
    while status is not None and status.phase == "running":
        now += timedelta(seconds=10)
        # Idle steps in the middle of the batch: nothing new observed.
        if len(idle) < 20:
            for _ in range(5):
                inp = RolloutInput("big", spec, True, (), status, "a" * 40, "a" * 40, 0)
                started = time.perf_counter()
                result = step_fleet([inp], fleet, settings, Observations(jobs, beats), now)
                idle.append(time.perf_counter() - started)
                assert not result.statuses, "an idle step changed the status"
        # Half the batch answers, then the other half.
        for part in (pending[: len(pending) // 2], pending[len(pending) // 2 :]):
            stamp = format_time(now)
            for job in part:
                jobs[job.job_id] = JobObservation(job.job_id, "succeeded", finished_at=stamp)
                if args.live:
                    beats[job.node] = Heartbeat(
                        job.node,
                        format_time(now + timedelta(seconds=1)),
                        runtimes=(
                            RuntimeReport("hermes", TARGET.provider, TARGET.model, "default"),
                        ),
                    )
            now += timedelta(seconds=5)
            step()
        pending = [j for j in pending if j.job_id not in jobs]

    assert status is not None and status.phase == "completed", status and status.phase
    print(f"nodes {args.nodes}, batchSize {args.batch}, {'live' if args.live else 'dry-run'}")
    print(
        f"whole rollout: {engine_seconds:.3f} s engine time ({engine_cpu:.3f} s CPU) "
        f"over {steps} steps"
    )
    print(f"per node-step: {engine_seconds / args.nodes * 1e6:.1f} us")
    print(
        f"idle step: median {statistics.median(idle) * 1e3:.2f} ms, "
        f"max {max(idle) * 1e3:.2f} ms over {len(idle)} steps"
    )
    tag = f"engine {args.nodes:,} nodes/{args.batch:,}"
    emit(
        [
            row(f"{tag}: whole rollout, engine time", engine_seconds, "s", 1.0, "target <"),
            row(f"{tag}: per node-step", engine_seconds / args.nodes * 1e6, "us"),
            row(f"{tag}: idle step, median", statistics.median(idle) * 1e3, "ms", 5.0, "target <"),
        ]
    )


if __name__ == "__main__":
    main()
