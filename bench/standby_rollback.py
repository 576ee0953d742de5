"""A rollback from a warm standby on one node, all real: two llama-server
slots run by the shipped slot script, a node-local nginx routing to one,
client load through nginx (tests/kit/standby.py). Each round applies
model B with a standby (A kept warm in the other slot), then restores the
backup that apply took, and measures:

- agent side: the restore's ``timings.routedAt`` minus its accepted time
  (the job reaching the agent), from the agent's record;
- client side: the first answer from model A to a request sent after the
  restore was posted, minus the moment it was posted;
- and the client requests that failed over all rounds (switches included).

    .venv/bin/python bench/standby_rollback.py             # 5 rounds
    .venv/bin/python bench/standby_rollback.py --rounds 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests package

from _common import emit, median, row

from reconciler.spec.times import parse_time
from tests.kit.keys import make_key
from tests.kit.llama import Models
from tests.kit.standby import SlotNode, post_and_wait
from tests.kit.waiting import wait_for

TARGET_SECONDS = 1.0  # a rollback serves the old model within 1 s of reaching the agent


def rounds(root: Path, count: int) -> tuple[list[float], list[float], int, int]:
    """(agent-side seconds, client-side seconds, failed requests, requests)."""
    key = make_key(root / "keys" / "reconciler").signing
    node = SlotNode.create(root / "node", Models(root / "models"), key)
    agent = node.agent()
    agent_side: list[float] = []
    client_side: list[float] = []
    try:
        node.stage(agent, "A")
        node.stage(agent, "B")
        assert post_and_wait(agent, node.apply("A", "apply-0000"))["state"] == "succeeded"
        with node.load() as load:
            for turn in range(1, count + 1):
                applied = post_and_wait(agent, node.apply("B", f"apply-{turn:04d}"))
                assert applied["state"] == "succeeded", applied
                wait_for(lambda: load.answers[-1].model == "B", 60, what="answers from B")
                posted = time.time()
                restore = node.restore(str(applied["backupId"]), f"restore-{turn:04d}")
                record = post_and_wait(agent, restore)
                assert record["state"] == "succeeded" and record["standby"]["warm"], record
                accepted = agent.agent.jobs[record["jobId"]].accepted_at
                routed = record["timings"]["routedAt"]
                agent_side.append((parse_time(routed) - parse_time(accepted)).total_seconds())
                first = wait_for(
                    lambda since=posted: load.first_from("A", since), 60, what="answers from A"
                )
                client_side.append(first.answered - posted)
            answers = list(load.answers)
    finally:
        agent.close()
        node.close()
    return agent_side, client_side, sum(a.status != 200 for a in answers), len(answers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        agent_side, client_side, failed, total = rounds(Path(folder), args.rounds)
    print(f"standby rollback, {args.rounds} rounds, {total} client requests through nginx")
    emit(
        [
            row(
                "rollback: restore accepted -> routedAt (agent), median",
                median(agent_side),
                "s",
                TARGET_SECONDS,
                "target <",
            ),
            row("rollback: restore accepted -> routedAt (agent), max", max(agent_side), "s"),
            row(
                "rollback: restore posted -> first answer from A (client), median",
                median(client_side),
                "s",
                TARGET_SECONDS,
                "target <",
            ),
            row(
                "rollback: restore posted -> first answer from A (client), max",
                max(client_side),
                "s",
            ),
            row("client requests failed, switches and rollbacks", failed, "requests"),
        ]
    )


if __name__ == "__main__":
    main()
