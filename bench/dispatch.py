"""Dispatch throughput: signed jobs to a simulated fleet and their results.

Starts ``reconciler sim-fleet`` with N nodes as a subprocess, sends one
signed job per node with ``AgentClient.send_jobs``, then reads every job
back with ``read_jobs`` until all have finished, and prints jobs per second
end to end (POST + GET per job), the client's CPU time, and the share of
time spent building and signing payloads.

Both ways in one run (``--evidence both``, the default): unsigned answers as
in version 1, then signed answers (docs/trust.md): the simulated fleet signs
every answer with a per-node key derived from a seed, and every answer read
is checked against that node's agentKey (``AnswerCheck``), inside the timing:
as in the daemon, the agent client's thread verifies each signed answer as it
arrives (``AnswerCheck.prepare``) and the check that believes it or not
finds it verified.

    .venv/bin/python bench/dispatch.py                # 10,000 nodes
    .venv/bin/python bench/dispatch.py --nodes 2000 --compare-httpx
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from _common import Row, cpu_seconds, emit, row

from reconciler.daemon.agent_client import AgentClient
from reconciler.daemon.answer_check import AnswerCheck
from reconciler.protocol.effects import SendJob
from reconciler.protocol.evidence import derived_agent_key
from reconciler.protocol.job_payload import build_payload
from reconciler.protocol.signing import (
    SigningKey,
    canonical_json,
    generate_key,
    load_private_key,
    make_envelope,
)
from reconciler.spec.model import Node, Target

KEY_SEED = "bench-dispatch"


def start_fleet(
    tmp: Path, nodes: int, pub: Path, seed: str | None = None
) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reconciler",
            "sim-fleet",
            "--nodes",
            str(nodes),
            "--state-dir",
            str(tmp / f"sim-{seed or 'unsigned'}"),
            "--trust-key",
            str(pub),
            *(["--key-seed", seed] if seed else []),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        raise SystemExit(f"sim-fleet did not start: {line!r}")
    return proc, "http://" + line.split()[-1]


def make_jobs(url: str, count: int, mode: str, run: str) -> list[tuple[str, SendJob]]:
    target = Target("hermes", "ollama", "llama3.1-8b", "default")
    return [
        (
            url,
            SendJob(
                job_id=f"apply-{run}-{i:06d}",
                kind="apply",
                node=f"sim-{i:04d}",
                rollout="bench",
                attempt=1,
                mode=mode,
                target=target,
                source_commit="0" * 40,
            ),
        )
        for i in range(1, count + 1)
    ]


def compare_httpx(url: str, count: int) -> None:
    """Plain GET heartbeats through httpx, for the comparison in docs/performance.md."""
    import asyncio

    import httpx

    paths = [f"/v1/nodes/sim-{i % 1000 + 1:04d}/heartbeat" for i in range(count)]
    with httpx.Client(base_url=url) as client:
        start = time.perf_counter()
        for path in paths:
            client.get(path)
        elapsed = time.perf_counter() - start
    print(f"httpx.Client, one at a time:      {count / elapsed:8.0f} requests/s")

    async def run_async() -> float:
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=url, limits=limits) as client:
            sem = asyncio.Semaphore(64)

            async def one(path: str) -> None:
                async with sem:
                    await client.get(path)

            start = time.perf_counter()
            await asyncio.gather(*(one(p) for p in paths))
            return time.perf_counter() - start

    elapsed = asyncio.run(run_async())
    print(f"httpx.AsyncClient, 64 in flight:  {count / elapsed:8.0f} requests/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--mode", choices=("dry_run", "live"), default="live")
    parser.add_argument("--rounds", type=int, default=1, help="jobs per node, one round each")
    parser.add_argument("--compare-httpx", action="store_true")
    parser.add_argument(
        "--evidence",
        choices=("both", "unsigned", "signed"),
        default="both",
        help="answers unsigned (version 1), signed and checked, or both in one run (default)",
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        private, public = generate_key(tmp / "keys")
        key = load_private_key(private)
        variants = ["unsigned", "signed"] if args.evidence == "both" else [args.evidence]
        rows = []
        rates = {}
        for variant in variants:
            found, rates[variant] = run_variant(tmp, key, public, args, signed=variant == "signed")
            rows += found
        if len(rates) == 2:
            ratio = rates["signed"] / rates["unsigned"]
            print(f"signed ÷ unsigned jobs/s: {ratio:.2f}")
            rows.append(row("dispatch: signed ÷ unsigned jobs/s, same run", ratio, "x"))
        emit(rows)


def run_variant(
    tmp: Path, key: SigningKey, public: Path, args: argparse.Namespace, *, signed: bool
) -> tuple[list[Row], float]:
    seed = KEY_SEED if signed else None
    fleet, url = start_fleet(tmp, args.nodes, public, seed)
    names = [f"sim-{i:04d}" for i in range(1, args.nodes + 1)]
    nodes = {
        name: Node(
            name, url, agent_key=derived_agent_key(seed, name).public_openssh if seed else None
        )
        for name in names
    }
    check = AnswerCheck()
    label = "signed answers, each checked" if signed else "unsigned answers (version 1)"
    print(f"-- {label}")
    try:
        # As the daemon does: signatures are checked as answers arrive, and
        # each answer is then believed or not by the same check.
        client = AgentClient(key, concurrency=args.concurrency, on_signed=check.prepare)
        check.nodes = nodes
        # warm up: connections and code paths
        client.read_heartbeats([(url, f"sim-{i:04d}") for i in range(1, 201)])
        for round_no in range(1, args.rounds + 1):
            jobs = make_jobs(url, args.nodes, args.mode, f"{seed or 'u'}{round_no}")
            now = datetime.now(UTC)
            load_before = os.getloadavg()[0]
            fleet_cpu0 = cpu_seconds(fleet.pid)
            cpu0 = time.process_time()
            start = time.perf_counter()
            sent = client.send_jobs(jobs, now)
            sent_at = time.perf_counter()
            unbelieved = 0
            pending = list(jobs)
            reads = 0
            while pending:
                results = client.read_jobs(pending)
                reads += len(pending)
                still = []
                for item in pending:
                    obs = results[item[1].job_id]
                    if obs is not None:
                        obs, problem = check.job(nodes[item[1].node], obs)
                        unbelieved += bool(problem)
                    if obs is None or obs.state not in ("succeeded", "failed"):
                        still.append(item)
                pending = still if not unbelieved else []
            elapsed = time.perf_counter() - start
            cpu = time.process_time() - cpu0
            fleet_cpu = cpu_seconds(fleet.pid) - fleet_cpu0
            refused = sum(1 for o in sent.values() if o.state in ("refused", "unreachable"))
            # signing share: the same payload building and signing, alone
            sign_start = time.perf_counter()
            for _, job in jobs:
                canonical_json(make_envelope(build_payload(job, now), key))
            signing = time.perf_counter() - sign_start
            count = len(jobs)
            print(
                f"round {round_no}: {count} {args.mode} jobs to {args.nodes} nodes, "
                f"{args.concurrency} connections: send {sent_at - start:.2f}s, "
                f"collect {elapsed - (sent_at - start):.2f}s ({reads} reads), "
                f"total {elapsed:.2f}s = {count / elapsed:,.0f} jobs/s end to end"
            )
            print(
                f"  CPU per 1,000 jobs: client {cpu / count * 1000:.2f}s "
                f"(signing {signing / count * 1000:.2f}s = {signing / elapsed:.0%} of the "
                f"wall time), sim fleet {fleet_cpu / count * 1000:.2f}s; "
                f"CPU-bound capacity on 2 idle cores ~{count / max(cpu, fleet_cpu):,.0f} jobs/s; "
                f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}; "
                f"not accepted: {refused}; answers not believed: {unbelieved}"
            )
            if unbelieved:
                raise SystemExit("signed answers did not verify: the benchmark is broken")
        tag = f"dispatch {count:,} {args.mode} jobs, {args.concurrency} connections, {label}"
        client.close()
        if args.compare_httpx and not signed:
            compare_httpx(url, min(args.nodes, 3000))
        rate = count / elapsed
        return [
            row(f"{tag}: jobs/s end to end (POST + GETs)", rate, "jobs/s", 2000.0, "target >"),
            row(f"{tag}: client CPU per 1,000 jobs", cpu / count * 1000, "s"),
            row(f"{tag}: sim fleet CPU per 1,000 jobs", fleet_cpu / count * 1000, "s"),
        ], rate
    finally:
        fleet.terminate()
        fleet.wait(timeout=10)


if __name__ == "__main__":
    main()
