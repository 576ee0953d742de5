"""A soak of one node agent: N signed live jobs posted over HTTP on
127.0.0.1, one after another, each changing the model (so each takes a
backup), with the agent's clock advancing ``--step`` per job. Every
``--every`` jobs it prints the journal's record count, the state directory's
size on disk, the process's open descriptors and its resident memory.

Flat means: after the journal window (a finished record is kept a day past
its payload's 15-minute expiry) and the backup retention fill, the figures
stop growing. With the default 30 s per job the window is about 2,900 jobs.

    .venv/bin/python bench/agent_soak.py                  # 10,000 jobs
    .venv/bin/python bench/agent_soak.py --jobs 2000 --every 200
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests package

from _common import emit, row

from reconciler.spec.model import Target
from tests.kit.agents import AgentThread
from tests.kit.jobs import envelope, job
from tests.kit.keys import make_key


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC).replace(microsecond=0)

    def __call__(self) -> datetime:
        return self.now


def disk_bytes(root: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--every", type=int, default=1_000)
    parser.add_argument("--step", type=int, default=30, help="agent clock seconds per job")
    parser.add_argument("--quick", action="store_true", help="2,000 jobs, 60 s apart")
    args = parser.parse_args()
    if args.quick:  # a window of about 1,450 jobs: flat for the last quarter
        args.jobs, args.every, args.step = 2_000, 250, 60
    with tempfile.TemporaryDirectory(prefix="agent-soak-") as tmp:
        root = Path(tmp)
        key = make_key(root / "keys" / "reconciler").signing
        state = root / "state"
        config = state / "runtimes" / "hermes.yaml"
        config.parent.mkdir(parents=True)
        config.write_bytes(b"provider: ollama\nmodel: start\nprofile: default\n")
        clock = Clock()
        agent = AgentThread(state, [key], keep_first_backups=12 * 3600)
        agent.agent.clock = clock  # the soak covers days of agent time in minutes
        started = time.monotonic()
        samples: list[tuple[int, int, int, int, float]] = []
        print(f"{'jobs':>7} {'journal':>8} {'disk KiB':>9} {'fds':>5} {'max RSS MiB':>12} {'s':>7}")
        try:
            for number in range(1, args.jobs + 1):
                send = job(
                    f"soak-{number:06d}",
                    rollout=f"soak-{number // 100}",
                    target=Target("hermes", "vllm", f"model-{number % 7}", "default"),
                )
                status, answer = agent.post(envelope(send, key, issued_at=clock.now))
                assert status == 202, (status, answer)
                agent.agent._worker.submit(lambda: None).result(60)  # the job has run
                clock.now += timedelta(seconds=args.step)
                if number % args.every == 0:
                    sample = (
                        number,
                        len(list((state / "jobs").iterdir())),
                        disk_bytes(state) // 1024,
                        open_descriptors(),
                        rss_mib(),
                    )
                    samples.append(sample)
                    print(
                        f"{sample[0]:>7} {sample[1]:>8} {sample[2]:>9} {sample[3]:>5} "
                        f"{sample[4]:>12.1f} {time.monotonic() - started:>7.0f}",
                        flush=True,
                    )
        finally:
            agent.close()
    half = samples[len(samples) // 2]
    last = samples[-1]
    emit(
        [
            row("agent soak: jobs", last[0], "jobs"),
            row("agent soak: journal records at the end", last[1], "records"),
            row("agent soak: disk at the end / at half", last[2] / max(half[2], 1), "ratio"),
            row("agent soak: open descriptors at the end", last[3], "fds", half[3], "at half"),
        ]
    )


if __name__ == "__main__":
    main()
