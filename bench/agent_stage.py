"""One node agent staging a model artifact from a real nginx and switching
to it on a stand-in inference runtime (tests/kit/runtime.py), in this
process; prints what a node costs and how long it is out of service.

    .venv/bin/python bench/agent_stage.py             # 64 MiB, 5 switches each way
    .venv/bin/python bench/agent_stage.py --quick     # 16 MiB, 2 switches each way

Rows:
- a stage job of SIZE from nginx, uncapped: wall time, throughput, and the
  agent's CPU per MiB (size and SHA-256 checked while it downloads);
- the same with ``--stage-rate`` set so it takes about 3 s: the rate held;
- a stage job for a file already held: wall time (nothing is fetched);
- a live apply with drain and two warm-up requests, the runtime answering
  generations of 50 ms under client load and taking 0.2 s to load a model:
  out of service (``servingAt`` - ``drainStartedAt``), median and max over
  the switches, and the requests the client load saw fail;
- the same without drain (out of service from ``activatedAt``): the failed
  requests, which a restart under load cuts off.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests package

from _common import emit, row

from reconciler.spec.artifacts import Artifact, Drain, Warmup
from reconciler.spec.model import Target
from reconciler.spec.times import parse_time
from tests.kit.agents import AgentThread
from tests.kit.jobs import envelope, job
from tests.kit.keys import make_key
from tests.kit.nginx import NginxServer
from tests.kit.runtime import METRIC, StandInRuntime
from tests.kit.waiting import wait_for

MiB = 1024 * 1024


def _blob(size: int) -> bytes:
    block = hashlib.sha256(b"bench").digest() * 4096
    return (block * (size // len(block) + 1))[:size]


def _seconds(timings: dict[str, str], start: str) -> float:
    return (parse_time(timings["servingAt"]) - parse_time(timings[start])).total_seconds()


def stage_rows(root: Path, size: int) -> list:  # type: ignore[type-arg]
    files = root / "files"
    files.mkdir()
    data = _blob(size)
    (files / "model.gguf").write_bytes(data)
    owner = make_key(root / "keys" / "reconciler")
    rows = []
    with NginxServer(root / "nginx", files) as nginx:
        artifact = Artifact(
            "weights", nginx.url("model.gguf"), hashlib.sha256(data).hexdigest(), size
        )
        for label, rate in (("uncapped", None), ("capped", size // 3)):
            state = root / f"state-{label}"
            (state / "runtimes").mkdir(parents=True)
            (state / "runtimes" / "hermes.yaml").write_text("model: old\n")
            agent = AgentThread(state, [owner.signing], stage_rate=rate)
            try:
                cpu, wall = time.process_time(), time.perf_counter()
                agent.post(envelope(job("s1", kind="stage", artifacts=(artifact,)), owner.signing))
                record = wait_for(
                    lambda agent=agent: _finished(agent, "s1"), timeout=600, what="the stage job"
                )
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                assert record["state"] == "succeeded", record
                if rate is None:
                    rows += [
                        row(f"stage {size // MiB} MiB from nginx, uncapped", wall, "s"),
                        row("  throughput", size / MiB / wall, "MiB/s"),
                        row(
                            "  agent CPU per MiB (download + SHA-256)",
                            cpu / (size / MiB) * 1000,
                            "ms",
                        ),
                    ]
                    again = time.perf_counter()
                    agent.post(
                        envelope(
                            job("s2", kind="stage", attempt=2, artifacts=(artifact,)), owner.signing
                        )
                    )
                    wait_for(
                        lambda agent=agent: _finished(agent, "s2"),
                        timeout=60,
                        what="the second stage",
                    )
                    rows.append(
                        row(
                            "stage of a file already held",
                            (time.perf_counter() - again) * 1000,
                            "ms",
                        )
                    )
                else:
                    rows.append(row(f"  with --stage-rate {rate}", size / wall, "B/s", rate, "cap"))
            finally:
                agent.close()
    return rows


def _finished(agent: AgentThread, job_id: str) -> dict | None:  # type: ignore[type-arg]
    status, record = agent.get(f"jobs/{job_id}")
    return record if status == 200 and record["state"] in ("succeeded", "failed") else None


def switch_rows(root: Path, switches: int) -> list:  # type: ignore[type-arg]
    owner = make_key(root / "keys2" / "reconciler")
    rows = []
    for drained in (True, False):
        state = root / f"switch-{drained}"
        (state / "runtimes").mkdir(parents=True)
        (state / "runtimes" / "hermes.yaml").write_text(
            "provider: vllm\nmodel: m0\nprofile: default\n"
        )
        with StandInRuntime("m0", load_seconds=0.2) as runtime:
            commands = runtime.commands(root / f"scripts-{drained}")
            agent = AgentThread(
                state,
                [owner.signing],
                after_apply=commands["after_apply"],
                drain_command=commands["drain"],
                undrain_command=commands["undrain"],
            )
            out: list[float] = []
            load = runtime.load(workers=4, delay=0.05)
            try:
                for n in range(1, switches + 1):
                    send = job(
                        f"a{n}",
                        target=Target("hermes", "vllm", f"m{n}", "default"),
                        drain=Drain(30, f"{runtime.url}/metrics", METRIC, 0) if drained else None,
                        warmup=(Warmup(f"{runtime.url}/v1/completions", "POST", "{}", 200, 10, 2),),
                    )
                    agent.post(envelope(send, owner.signing))
                    record = wait_for(
                        lambda n=n, agent=agent: _finished(agent, f"a{n}"),
                        timeout=120,
                        what="the switch",
                    )
                    assert record["state"] == "succeeded", record
                    start = "drainStartedAt" if drained else "activatedAt"
                    out.append(_seconds(record["timings"], start))
                    time.sleep(0.3)  # load on the new model between switches
            finally:
                statuses = load.stop()
                agent.close()
            label = "with drain" if drained else "without drain"
            rows += [
                row(f"out of service {label}, median of {switches}", statistics.median(out), "s"),
                row(f"out of service {label}, max", max(out), "s", 1.0, "target <"),
                row(f"client requests failed {label}", runtime.failed, "requests"),
                row(f"client requests answered {label}", statuses.get(200, 0), "requests"),
            ]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=64)
    parser.add_argument("--switches", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    size = (16 if args.quick else args.size_mib) * MiB
    switches = 2 if args.quick else args.switches
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        emit(stage_rows(root, size))
        emit(switch_rows(root, switches))


if __name__ == "__main__":
    main()
