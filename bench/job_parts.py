"""What one job costs the daemon, part by part, each measured alone in one
process: the parts the agent client spends on every job (a signed ``POST``
and a held read, each answer read and its signature checked), against the
budget a per-node overhead target leaves.

    .venv/bin/python bench/job_parts.py            # 20,000 jobs
    .venv/bin/python bench/job_parts.py --jobs 2000
    .venv/bin/python bench/job_parts.py --eval-cases 20   # live applies with a 20-case suite
    .venv/bin/python bench/job_parts.py --artifacts       # the jobs of fleet.py --artifacts

Each figure is CPU time (``time.process_time``) per job, the median of
``--runs`` rounds:

- sign: the job's payload built and signed into its envelope (``envelope_bytes``);
- h11: the ``POST`` with its body and the ``GET`` with its ``?wait=`` query,
  written by h11, and their two answers read by it, on one keep-alive
  connection (no socket: the wire format alone);
- read answers: both answers parsed into observations (``job_observation``);
- check answers: both answers' Ed25519 signatures checked against the
  node's key, as the daemon checks each one it believes.

The sum is what these parts cost per job before the event loop, the
sockets and the passes; ``bench/fleet.py --artifacts`` gives the whole.
With two jobs a node (stage and apply), a per-node overhead of 0.5 ms
leaves 0.25 ms of daemon CPU per job.

With ``--artifacts`` the jobs are those of ``bench/fleet.py --artifacts``:
a dry-run stage and a dry-run apply per node, each carrying the rollout's
model artifact, answered as the simulated fleet answers them; that run's
``--with-parts`` measures these, so its ratio compares like with like.

With ``--eval-cases N`` each job is a live apply carrying an eval suite of
N cases, and its finished answer the suite's results (an answer of 200
characters a case): the difference from a run without it is what evals
add to each job.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from datetime import UTC, datetime

import h11
from _common import announce, emit, median, row

from reconciler.daemon.agent_answers import job_observation
from reconciler.protocol.effects import SendJob
from reconciler.protocol.evidence import (
    derived_agent_key,
    signed_answer_bytes,
    signed_bytes_problem,
)
from reconciler.protocol.job_payload import build_payload
from reconciler.protocol.signing import canonical_json, envelope_bytes
from reconciler.spec.artifacts import Artifact
from reconciler.spec.evals import Eval, EvalCase, EvalSuite
from reconciler.spec.model import Target

SEED = "bench-job-parts"
BUDGET_MS = 0.25  # of daemon CPU per job: 0.5 ms per node, two jobs a node


# The artifact of bench/fleet.py's staged rollout.
WEIGHTS = Artifact("weights", "https://mirror.example/w.gguf", "0f" * 32, 4920734976)


def jobs(count: int, eval_cases: int = 0, artifacts: bool = False) -> list[SendJob]:
    target = Target("hermes", "vllm", "llama3.1-8b", "default")
    evals = _evals(eval_cases) if eval_cases else ()
    mode = "live" if evals else "dry_run"
    carried = (WEIGHTS,) if artifacts else ()

    def kind(i: int) -> str:
        return "stage" if artifacts and i % 2 == 0 else "apply"

    return [
        SendJob(
            f"{kind(i)}-{i:032x}",
            kind(i),
            f"n{i % 1000:05d}",
            "big",
            1,
            mode,
            target,
            "ab" * 20,
            evals=evals,
            artifacts=carried,
            stage_timeout=3600 if kind(i) == "stage" else None,
        )
        for i in range(count)
    ]


def _evals(cases: int) -> tuple[Eval, ...]:
    written = tuple(
        EvalCase(f"case-{k}", "contains", '"Paris"', prompt=f"Golden prompt number {k}: the capital of France is")
        for k in range(cases)
    )  # fmt: skip
    suite = EvalSuite("golden", "cd" * 32, written, seed=1)
    return (Eval("golden", "golden", "http://127.0.0.1:8080", 100.0, 300, suite=suite),)


def _results(job: SendJob) -> list[dict[str, object]]:
    return [
        {
            "name": e.name,
            "suiteSha256": e.suite.sha256 if e.suite else "",
            "passed": len(e.suite.cases) if e.suite else 0,
            "total": len(e.suite.cases) if e.suite else 0,
            "passRate": 100.0,
            "cases": [
                {
                    "name": c.name,
                    "ok": True,
                    "answer": " Paris." * 28,
                    "detail": "",
                    "seconds": 0.05,
                }
                for c in (e.suite.cases if e.suite else ())
            ],
        }
        for e in job.evals
    ]


def answer(job: SendJob, state: str) -> bytes:
    record = {
        "jobId": job.job_id,
        "state": state,
        "error": "",
        "backupId": None,
        "finishedAt": "2026-12-02T20:50:04Z" if state == "succeeded" else None,
        "sourceCommit": job.source_commit,
        "detail": _detail(job) if state == "succeeded" else "",
    }
    if job.evals and state == "succeeded":
        record["evals"] = _results(job)
    return signed_answer_bytes(record, derived_agent_key(SEED, job.node))


def _detail(job: SendJob) -> str:
    """What the simulated fleet says of a finished dry run (an apply's
    detail is of the same length)."""
    size = sum(a.size for a in job.artifacts)
    return f"the server reports {size} bytes; 0 of {len(job.artifacts)} held" if size else ""


def http_answer(body: bytes, status: int) -> bytes:
    head = b"HTTP/1.1 %d \r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    return head % (status, len(body)) + body


def exchange(wire: h11.Connection, request: h11.Request, body: bytes | None, reply: bytes) -> None:
    wire.send(request)
    if body:
        wire.send(h11.Data(data=body))
    wire.send(h11.EndOfMessage())
    wire.receive_data(reply)
    while type(wire.next_event()) is not h11.EndOfMessage:
        pass
    wire.start_next_cycle()


def measure(
    count: int, runs: int, eval_cases: int = 0, artifacts: bool = False
) -> dict[str, float]:
    batch = jobs(count, eval_cases, artifacts)
    key = derived_agent_key(SEED, "daemon")
    now = datetime.now(UTC)
    bodies = [envelope_bytes(build_payload(j, now), key) for j in batch]
    answers = [(answer(j, "accepted"), answer(j, "succeeded")) for j in batch]
    replies = [(http_answer(a, 202), http_answer(b, 200)) for a, b in answers]
    trusted = {j.node: derived_agent_key(SEED, j.node).trusted() for j in batch}
    seen = [
        (job_observation(j.job_id, a), job_observation(j.job_id, b))
        for j, (a, b) in zip(batch, answers, strict=True)
    ]

    def sign() -> None:
        for j in batch:
            envelope_bytes(build_payload(j, now), key)

    def wire() -> None:
        conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=64 * 1024)
        host = [(b"Host", b"127.0.0.1:40000"), (b"User-Agent", b"reconciler-daemon")]
        for j, body, (accepted, finished) in zip(batch, bodies, replies, strict=True):
            length = [
                (b"Content-Type", b"application/json"),
                (b"Content-Length", b"%d" % len(body)),
            ]
            post = h11.Request(
                method="POST", target=f"/v1/nodes/{j.node}/jobs", headers=host + length
            )
            exchange(conn, post, body, accepted)
            path = f"/v1/nodes/{j.node}/jobs/{j.job_id}?wait=20s"
            exchange(conn, h11.Request(method="GET", target=path, headers=host), None, finished)

    def read() -> None:
        for j, (a, b) in zip(batch, answers, strict=True):
            job_observation(j.job_id, a)
            job_observation(j.job_id, b)

    def check() -> None:
        for j, pair in zip(batch, seen, strict=True):
            for observed in pair:
                signed = observed.signed
                assert signed is not None
                data = canonical_json(signed.body)
                problem = signed_bytes_problem(
                    data, signed.key_id, signed.signature, trusted[j.node]
                )
                assert not problem, problem

    parts: dict[str, Callable[[], None]] = {
        "sign": sign,
        "h11": wire,
        "read answers": read,
        "check answers": check,
    }
    found: dict[str, list[float]] = {name: [] for name in parts}
    for _ in range(runs):
        for name, part in parts.items():
            started = time.process_time()
            part()
            found[name].append((time.process_time() - started) / count * 1e3)
    return {name: median(times) for name, times in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2,000 jobs, 1 run")
    parser.add_argument("--eval-cases", type=int, default=0, help="live applies with evals")
    parser.add_argument(
        "--artifacts", action="store_true", help="stage and apply jobs carrying an artifact"
    )
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.runs = 2_000, 1
    shape = f", an eval suite of {args.eval_cases} cases" if args.eval_cases else ""
    shape += ", stages and applies carrying an artifact" if args.artifacts else ""
    announce(f"job parts: {args.jobs:,} jobs, {args.runs} runs{shape}")
    figures = measure(args.jobs, args.runs, args.eval_cases, args.artifacts)
    rows = [row(f"per job: {name}", ms, "ms") for name, ms in figures.items()]
    total = sum(figures.values())
    rows.append(row("per job: these parts together", total, "ms", BUDGET_MS, "budget"))
    emit(rows)


if __name__ == "__main__":
    main()
