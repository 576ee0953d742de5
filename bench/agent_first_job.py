"""What a node agent's first job costs against its later ones: real
``reconciler agent`` processes (the live apply and after-apply probe of
``bench/peers/ansible.py``), each sent ``--jobs`` config applies one after
another over HTTP on 127.0.0.1 as the daemon sends them (the payload built
and signed by the daemon's code, a ``POST``, then the held ``GET`` of the
job), after one heartbeat (the daemon's fleet sweep). Prints the agent's
CPU (its own and its probes', ``/proc/PID/stat``) to start, for the
heartbeat, for the first job and per later job, averaged over ``--agents``
agents started one after another, and the ratio first / later.

    .venv/bin/python bench/agent_first_job.py --agents 10 --jobs 20
    .venv/bin/python bench/agent_first_job.py --other-tree /tmp/v2   # alternated
    .venv/bin/python bench/agent_first_job.py --profile /tmp/first.prof

``--other-tree DIR`` (a source tree: DIR/reconciler and DIR/schemas, e.g. a
``git worktree add``) alternates agents of this tree and that one, so both
are measured under the same load. ``--profile FILE`` runs one agent under
cProfile and writes its profile (start, heartbeat and first job) when it
stops. The ticks of ``/proc`` are 10 ms: read the averages, not one agent.
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import emit, load_average, row

from reconciler.protocol.effects import SendJob
from reconciler.protocol.job_payload import build_payload
from reconciler.protocol.signing import SigningKey, envelope_bytes, generate_key, load_private_key
from reconciler.spec.model import Target

# The probe of bench/peers/ansible.py: shell builtins only, one process.
PROBE = (
    "found=; while IFS= read -r line; do"
    ' [ "$line" = "model: $RECONCILER_MODEL" ] && found=1;'
    ' done < "$RECONCILER_CONFIG"; [ -n "$found" ]'
)
NODE = "node-a"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_ms(pid: int) -> float:
    """User + system CPU of the process, its threads and its reaped children."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) * 1000 / TICK


def apply_job(i: int) -> SendJob:
    target = Target("hermes", "ollama", f"model-{i}", "default")
    return SendJob(f"apply-{i:032x}", "apply", NODE, "bench", 1, "live", target, "ab" * 20)


def one_agent(root: Path, key: SigningKey, public: Path, jobs: int, tree: str | None,
              profile: str | None) -> dict[str, float]:  # fmt: skip
    """ms of CPU: to start, the heartbeat, the first job, each later job (mean)."""
    state = root / "state"
    (state / "runtimes").mkdir(parents=True)
    (state / "runtimes" / "hermes.yaml").write_text(
        "provider: ollama\nmodel: base\nprofile: default\n"
    )
    # `python -m` puts its working directory (here ROOT) first on sys.path,
    # so PYTHONPATH alone says which tree runs: this bench's by default.
    env = {**os.environ, "PYTHONPATH": tree or str(Path(__file__).resolve().parent.parent)}
    python = [sys.executable, *(["-m", "cProfile", "-o", profile] if profile else [])]
    command = [
        *python, "-m", "reconciler", "agent", "--node", NODE,
        "--state-dir", str(state), "--trust-key", str(public), "--runtime", "hermes",
        "--allow-live-apply", "--after-apply", PROBE, "--listen", "127.0.0.1:0",
    ]  # fmt: skip
    with open(root / "agent.log", "wb") as log:
        agent = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, env=env, cwd=root)
    try:
        assert agent.stdout is not None
        port = int(agent.stdout.readline().decode().rsplit(":", 1)[1])
        started = cpu_ms(agent.pid)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

        def call(method: str, path: str, body: bytes | None = None) -> bytes:
            connection.request(method, f"/v1/nodes/{NODE}/{path}", body=body)
            return connection.getresponse().read()

        def apply(i: int) -> float:
            sent = apply_job(i)
            before = cpu_ms(agent.pid)
            call("POST", "jobs", envelope_bytes(build_payload(sent, datetime.now(UTC)), key))
            answer = call("GET", f"jobs/{sent.job_id}?wait=20s")
            assert b'"succeeded"' in answer, answer
            return cpu_ms(agent.pid) - before

        before = cpu_ms(agent.pid)
        call("GET", "heartbeat")
        heartbeat = cpu_ms(agent.pid) - before
        first = apply(0)
        later = [apply(i) for i in range(1, jobs)]
        connection.close()
        return {
            "start": started,
            "heartbeat": heartbeat,
            "first job": first,
            "later job": statistics.mean(later),
        }
    finally:
        agent.terminate()
        agent.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=10, help="agents per tree")
    parser.add_argument("--jobs", type=int, default=20, help="jobs per agent")
    parser.add_argument("--other-tree", help="a source tree to alternate with")
    parser.add_argument("--profile", metavar="FILE", help="one agent under cProfile")
    parser.add_argument("--quick", action="store_true", help="3 agents, 5 jobs")
    args = parser.parse_args()
    if args.quick:
        args.agents, args.jobs = 3, 5
    if args.profile:
        args.agents, args.other_tree = 1, None
    trees: list[tuple[str, str | None]] = [("this tree", None)]
    if args.other_tree:
        trees.append((args.other_tree, str(Path(args.other_tree).resolve())))
    found: dict[str, list[dict[str, float]]] = {label: [] for label, _ in trees}
    with tempfile.TemporaryDirectory(prefix="agent-first-job-") as tmp:
        private, public = generate_key(Path(tmp) / "keys")
        key = load_private_key(private)
        for n in range(args.agents):
            for label, tree in trees:
                root = Path(tmp) / f"agent-{n}-{len(found[label])}-{trees.index((label, tree))}"
                root.mkdir()
                figures = one_agent(root, key, public, args.jobs, tree, args.profile)
                found[label].append(figures)
                shown = ", ".join(f"{k} {v:.0f}" for k, v in figures.items())
                print(f"agent {n + 1} {label}: {shown} ms [load {load_average():.1f}]", flush=True)
    for label, _ in trees:
        done = found[label]
        mean = {k: statistics.mean(f[k] for f in done) for k in done[0]}
        rows = [row(f"agent {k} CPU, mean of {len(done)} agents", v, "ms") for k, v in mean.items()]
        rows.append(
            row("agent first job / later job CPU", mean["first job"] / mean["later job"], "x")
        )
        print(f"{label}:")
        if label == "this tree":
            emit(rows)
        else:
            for r in rows:
                print(f"  {r.figure}: {r.value:.2f} {r.unit}")


if __name__ == "__main__":
    main()
