"""A daemon in a process of its own: the oracle of the differential tests
(``tests/test_read_shortcuts.py``). Sharing a process with the daemon it
checks, it would share whatever that process keeps; here it shares only
the repository it is handed (a copy) and the agents it sends jobs to.

    oracle = Oracle(key_path, agent_timeout)
    want = oracle.run_pass(copy_of_the_bare_repository, now, plain=True)
    oracle.close()

Each request builds a new ``Daemon`` (``plain`` or not) over the given
repository and runs one pass; the answer is what the test compares: the
outcome, the status commit's tree and message, and the rollouts-by-phase
gauges. Run as ``python -m tests.kit.oracle KEY_PATH AGENT_TIMEOUT``: a
JSON request per line on stdin, a JSON answer per line on stdout.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import traceback
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent


def gauge_lines(metrics_text: str) -> list[str]:
    """The rollouts-by-phase lines of a metrics text."""
    return [line for line in metrics_text.splitlines() if line.startswith("reconciler_rollouts{")]


class Oracle:
    """The oracle process, started once per test and asked once per step."""

    def __init__(self, key_path: Path, agent_timeout: float) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.kit.oracle", str(key_path), str(agent_timeout)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run_pass(self, repo: Path, now: datetime, *, plain: bool) -> dict[str, Any]:
        process = self.process
        assert process.stdin is not None and process.stdout is not None
        request = {"repo": str(repo), "now": now.isoformat(), "plain": plain}
        process.stdin.write(json.dumps(request) + "\n")
        process.stdin.flush()
        line = process.stdout.readline()
        if not line:
            raise AssertionError(f"the oracle process ended (exit status {process.wait()})")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise AssertionError(f"the oracle's pass failed:\n{answer['error']}")
        return answer

    def close(self) -> None:
        process = self.process
        assert process.stdin is not None
        process.stdin.close()
        process.wait(timeout=30)


def _answer(request: dict[str, Any], key: Any, agent_timeout: float) -> dict[str, Any]:
    from prometheus_client import generate_latest

    from reconciler.daemon.agent_client import AgentClient
    from reconciler.daemon.logs import EventLog
    from reconciler.daemon.loop import Daemon
    from reconciler.git.store import GitStore

    now = datetime.fromisoformat(request["now"])
    daemon = Daemon(
        GitStore.open(request["repo"], "main"),
        AgentClient(key, timeout=agent_timeout),
        log=EventLog(stream=io.StringIO()),
        clock=lambda: now,
        plain=request["plain"],
    )
    try:
        outcome = daemon.run_pass()
    finally:
        daemon.client.close()
    made = daemon.store.repository()[outcome.commit] if outcome.commit is not None else None
    return {
        "commit": outcome.commit,
        "tree": str(made.tree_id) if made is not None else None,
        "message": made.message if made is not None else None,
        "transitions": outcome.transitions,
        "jobs_sent": outcome.jobs_sent,
        "active": outcome.active,
        "wakeup": outcome.wakeup.isoformat() if outcome.wakeup is not None else None,
        "refused": outcome.refused,
        "job_ids": list(outcome.job_ids),
        "gauges": gauge_lines(generate_latest(daemon.metrics.registry).decode()),
    }


def main() -> int:
    from reconciler.protocol.signing import load_private_key

    key = load_private_key(Path(sys.argv[1]))
    agent_timeout = float(sys.argv[2])
    for line in sys.stdin:
        try:
            answer = _answer(json.loads(line), key, agent_timeout)
        except Exception:
            answer = {"error": traceback.format_exc()}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
