"""One real node agent (``reconciler agent``, the after-apply probe of
``bench/peers/ansible.py``) given N live applies one after another over
HTTP on 127.0.0.1: POST, held GET of the job, heartbeat. Prints the
agent's CPU per job by thread (the event loop, the job thread) and that of
its children (the probe shells, the operator's command), from
``/proc/PID/task``; the median of ``--runs`` runs.

With ``--other-tree DIR`` (a source tree: DIR/reconciler and DIR/schemas,
e.g. from ``git archive main reconciler schemas``) the runs alternate
between this tree and that one, so the two are measured under the same
load.

    .venv/bin/python bench/agent_cpu.py --jobs 1000 --runs 3
    .venv/bin/python bench/agent_cpu.py --jobs 1000 --runs 3 --other-tree /tmp/main-tree
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests package

from _common import emit, load_average, row

from reconciler.spec.model import Target
from tests.kit.jobs import envelope, job
from tests.kit.keys import make_key

# The probe of bench/peers/ansible.py: shell builtins only, one process.
PROBE = (
    "found=; while IFS= read -r line; do"
    ' [ "$line" = "model: $RECONCILER_MODEL" ] && found=1;'
    ' done < "$RECONCILER_CONFIG"; [ -n "$found" ]'
)
TICK = os.sysconf("SC_CLK_TCK")


def _thread_times(pid: int) -> dict[int, tuple[int, int]]:
    """Thread id -> (user, system) ticks."""
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        found[int(tid)] = (int(fields[11]), int(fields[12]))
    return found


def _by_role(
    pid: int, before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]]
) -> dict[str, tuple[int, int]]:
    """Ticks spent between the two readings by the event loop (the process's
    first thread), the job thread (the busiest other one) and the rest."""
    spent = {
        tid: (user - before.get(tid, (0, 0))[0], system - before.get(tid, (0, 0))[1])
        for tid, (user, system) in after.items()
    }
    roles = {"event loop": spent.pop(pid)}
    if spent:
        busiest = max(spent, key=lambda tid: sum(spent[tid]))
        roles["job thread"] = spent.pop(busiest)
        roles["other threads"] = (
            sum(u for u, _ in spent.values()),
            sum(s for _, s in spent.values()),
        )
    return roles


def _children_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[13]) + int(fields[14])


def one_run(jobs: int, tree: str | None) -> dict[str, float]:
    """ms per job: user and system of each thread, and the children's CPU."""
    with tempfile.TemporaryDirectory(prefix="agent-cpu-") as tmp:
        root = Path(tmp)
        made = make_key(root / "keys" / "reconciler")
        key, public = made.signing, made.public
        state = root / "state"
        (state / "runtimes").mkdir(parents=True)
        (state / "runtimes" / "hermes.yaml").write_text(
            "provider: ollama\nmodel: base\nprofile: default\n"
        )
        env = dict(os.environ)
        if tree is not None:
            env["PYTHONPATH"] = tree
        command = [
            sys.executable, "-m", "reconciler", "agent", "--node", "node-a",
            "--state-dir", str(state), "--trust-key", str(public), "--runtime", "hermes",
            "--allow-live-apply", "--after-apply", PROBE, "--listen", "127.0.0.1:0",
        ]  # fmt: skip
        agent = subprocess.Popen(command, stdout=subprocess.PIPE, env=env, cwd=tmp)
        try:
            assert agent.stdout is not None
            port = int(agent.stdout.readline().decode().rsplit(":", 1)[1])
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

            def call(method: str, path: str, body: bytes | None = None) -> bytes:
                connection.request(method, f"/v1/nodes/node-a/{path}", body=body)
                return connection.getresponse().read()

            def apply(i: int) -> None:
                target = Target("hermes", "ollama", f"model-{i}", "default")
                sent = job(f"apply-{i:08d}", rollout=f"r{i % 4}", target=target)
                body = envelope(sent, key, issued_at=datetime.now(UTC))
                call("POST", "jobs", json.dumps(body).encode())
                answer = call("GET", f"jobs/{sent.job_id}?wait=20s")
                assert b'"succeeded"' in answer, answer
                call("GET", "heartbeat")

            for i in range(20):  # warm: imports, caches, the first backups
                apply(i)
            before, children = _thread_times(agent.pid), _children_ticks(agent.pid)
            for i in range(20, 20 + jobs):
                apply(i)
            after = _thread_times(agent.pid)
            per_job = 1000 / TICK / jobs
            figures = {"children": (_children_ticks(agent.pid) - children) * per_job}
            for name, (user, system) in _by_role(agent.pid, before, after).items():
                figures[f"{name} user"] = user * per_job
                figures[f"{name} sys"] = system * per_job
            connection.close()
            return figures
        finally:
            agent.terminate()
            agent.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--other-tree", help="a source tree to alternate with")
    parser.add_argument("--quick", action="store_true", help="200 jobs, one run")
    args = parser.parse_args()
    jobs, runs = (200, 1) if args.quick else (args.jobs, args.runs)
    trees: list[tuple[str, str | None]] = [("this tree", None)]
    if args.other_tree:
        trees.append((args.other_tree, str(Path(args.other_tree).resolve())))
    results: dict[str, list[dict[str, float]]] = {label: [] for label, _ in trees}
    for run in range(runs):
        for label, tree in trees:
            figures = one_run(jobs, tree)
            results[label].append(figures)
            shown = ", ".join(f"{k} {v:.2f}" for k, v in sorted(figures.items()))
            print(f"run {run + 1} {label} (load {load_average():.1f}): {shown} ms/job", flush=True)
    for label, _ in trees:
        done = results[label]
        names = sorted({name for figures in done for name in figures})
        medians = {n: statistics.median(f.get(n, 0.0) for f in done) for n in names}
        print(f"{label}, median of {len(done)}:")
        rows = [
            row(f"agent {n} CPU per live apply", v, "ms")
            for n, v in medians.items()
            if v or not n.startswith("other threads")  # the probes' threads, when checks run
        ]
        if label == "this tree":
            emit(rows)
        else:
            for r in rows:
                print(f"  {r.figure}: {r.value:.2f} {r.unit}")


if __name__ == "__main__":
    main()
