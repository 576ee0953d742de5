"""What the daemon writes to stderr (docs/operating.md): with ``--log-format
json`` only JSON lines, whatever logs (our modules, libraries, threads), and
lines that repeat folded into a count."""

from __future__ import annotations

import io
import json
import logging
import subprocess
from pathlib import Path

import pytest

from reconciler.daemon.logs import REPEATS_KEPT, EventLog, routed_logging
from tests.kit.daemons import DaemonProcess
from tests.kit.documents import node_yaml, rollout_yaml
from tests.kit.git import clone, commit_and_push, git, make_bare_repo
from tests.kit.keys import Key, make_key
from tests.kit.ports import HeldPort

SWEEP_EVERY_SECOND = (
    "apiVersion: reconciler/v1\nkind: Settings\nspec:\n  fleetCheck: {interval: 1s}\n"
)


@pytest.mark.slow
def test_with_json_logs_every_line_of_a_daemon_with_an_unreachable_agent_is_json(
    tmp_path: Path, held_port: HeldPort
) -> None:
    key = make_key(tmp_path / "keys" / "reconciler")
    agent = f"http://127.0.0.1:{held_port.port}"
    bare = make_bare_repo(
        tmp_path,
        {
            "nodes/web-1.yaml": node_yaml("web-1", agent),
            "rollouts/web.yaml": rollout_yaml("web", nodeIds=["web-1"]),
            "reconciler.yaml": SWEEP_EVERY_SECOND,
        },
        message="A rollout to a node whose agent refuses connections",
    )
    with DaemonProcess(
        bare, key.private, "--log-format", "json", "--interval", "0.1s",
        "--agent-timeout", "0.5s",
    ) as daemon:  # fmt: skip
        daemon.wait_line(lambda line: "dispatched" in line, 60, "the job recorded")
        # The agent reads' own log lines (stdlib logging), sweep after sweep.
        daemon.wait_line(lambda line: "unusable" in line, 60, "the agent client's line")
        count = len(daemon.lines)
        daemon.wait_line(lambda line: len(daemon.lines) > count + 2, 60, "more lines")

    assert daemon.lines
    records = [json.loads(line) for line in daemon.lines]  # each one parses
    assert all({"time", "level", "event", "message"} <= set(r) for r in records)
    assert any(r["event"] == "stopped" for r in records)
    unusable = [r for r in records if "unusable" in r["message"]]
    assert unusable[0]["level"] == "warning"
    assert unusable[0]["logger"] == "reconciler.daemon.agent_reads"
    # Repeats past five a minute are folded, and counted when the daemon stops.
    assert len([r for r in unusable if "repeated" not in r]) <= 5 * 2


def test_standard_library_records_become_lines_of_the_chosen_format() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    before = list(root.handlers)
    with routed_logging(EventLog("json", stream=stream)):
        logging.getLogger("reconciler.daemon.agent_client").warning("agent at %s: %s", "x", "down")
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logging.getLogger("some.library").exception("it failed")
    logging.getLogger("reconciler.daemon.agent_client").warning("after: not routed")
    assert root.handlers == before

    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert (first["level"], first["event"], first["message"]) == (
        "warning", "agent_client", "agent at x: down",
    )  # fmt: skip
    assert first["logger"] == "reconciler.daemon.agent_client"
    assert (second["level"], second["event"]) == ("error", "library")
    assert "RuntimeError: boom" in second["traceback"]


def test_a_line_repeated_more_than_five_times_a_minute_is_folded_into_a_count() -> None:
    now = [0.0]
    stream = io.StringIO()
    log = EventLog("json", stream=stream, clock=lambda: now[0])
    for _ in range(12):
        log.warning("poll_failed", "remote unreachable", remote="origin")
        now[0] += 1
    log.warning("poll_failed", "remote unreachable", remote="other")  # not alike
    now[0] = 61.0
    log.info("poll_recovered", "remote answers again")

    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(r["event"], r.get("remote"), r.get("repeated")) for r in records] == [
        *[("poll_failed", "origin", None)] * 5,
        ("poll_failed", "other", None),
        ("poll_failed", "origin", 7),
        ("poll_recovered", None, None),
    ]


@pytest.mark.slow
def test_a_refused_push_is_one_warning_naming_the_commit_and_why(
    tmp_path: Path, held_port: HeldPort
) -> None:
    key = make_key(tmp_path / "keys" / "reconciler")
    alice = make_key(tmp_path / "people" / "alice")
    signers = tmp_path / "allowed_signers"
    signers.write_text(f"alice@example.com {Key(alice.private).text}\n")
    bare = make_bare_repo(
        tmp_path,
        {"nodes/web-1.yaml": node_yaml("web-1", f"http://127.0.0.1:{held_port.port}")},
        message="Seed the fleet",
    )
    work = clone(bare, tmp_path / "work")
    with DaemonProcess(
        bare, key.private, "--log-format", "json", "--allowed-signers", str(signers),
        "--interval", "0.1s",
    ) as daemon:  # fmt: skip
        daemon.wait_line(lambda line: '"start"' in line)
        commit_and_push(work, {"rollouts/web.yaml": rollout_yaml("web", nodeIds=["web-1"])},
                        "Roll out web, unsigned")  # fmt: skip
        unsigned = git("rev-parse", "HEAD", cwd=work)
        daemon.wait_line(lambda line: unsigned in line and "push_refused" in line, 60)
        # Passes go on (a status commit says why nothing happens, passes re-read).
        commit_and_push(work, {"nodes/web-2.yaml": node_yaml("web-2")}, "Another, unsigned")
        second = git("rev-parse", "HEAD", cwd=work)
        daemon.wait_line(lambda line: second in line and "push_refused" in line, 60)

    refused = [json.loads(line) for line in daemon.seen(lambda line: "push_refused" in line)]
    mine = [r for r in refused if r["commit"] in (unsigned, second)]
    assert [r["commit"] for r in mine] == [unsigned, second]
    assert all(r["level"] == "warning" and r["author"] for r in mine)
    assert "not signed" in mine[0]["message"] or "signature" in mine[0]["message"]


@pytest.mark.slow
def test_a_signed_push_waiting_for_approval_is_no_push_refused_warning(
    tmp_path: Path, held_port: HeldPort
) -> None:
    key = make_key(tmp_path / "keys" / "reconciler")
    alice = make_key(tmp_path / "people" / "alice")
    signers = tmp_path / "allowed_signers"
    signers.write_text(f"alice@example.com {Key(alice.private).text}\n")
    bare = make_bare_repo(
        tmp_path,
        {"nodes/web-1.yaml": node_yaml("web-1", f"http://127.0.0.1:{held_port.port}")},
        message="Seed the fleet",
    )
    work = clone(bare, tmp_path / "work")
    with DaemonProcess(
        bare, key.private, "--log-format", "json", "--allowed-signers", str(signers),
        "--require-approvals", "1", "--interval", "0.1s",
    ) as daemon:  # fmt: skip
        daemon.wait_line(lambda line: '"start"' in line)
        signing = ("-c", "gpg.format=ssh", "-c", f"user.signingKey={alice.private}")
        for _ in range(10):  # made again on the tip when a status commit came first
            git("fetch", "-q", "origin", cwd=work)
            git("reset", "-q", "--hard", "origin/main", cwd=work)
            (work / "rollouts").mkdir(exist_ok=True)
            (work / "rollouts" / "web.yaml").write_text(rollout_yaml("web", nodeIds=["web-1"]))
            git("add", "-A", cwd=work)
            git(*signing, "commit", "-q", "-S", "-m", "Roll out web, signed", cwd=work)
            pushed = subprocess.run(["git", "push", "-q", "origin", "HEAD:main"], cwd=work)
            if pushed.returncode == 0:
                break
        signed = git("rev-parse", "HEAD", cwd=work)
        daemon.wait_line(lambda line: signed in line and "awaiting_approval" in line, 60)
        commit_and_push(work, {"nodes/web-2.yaml": node_yaml("web-2")}, "Another, unsigned")
        unsigned = git("rev-parse", "HEAD", cwd=work)
        daemon.wait_line(lambda line: unsigned in line and "push_refused" in line, 60)

    waiting = [json.loads(line) for line in daemon.seen(lambda line: signed in line)]
    refused = [json.loads(line) for line in daemon.seen(lambda line: "push_refused" in line)]
    assert [r["commit"] for r in refused if r["commit"] in (signed, unsigned)] == [unsigned]
    assert [(w["event"], w["level"]) for w in waiting if "author" in w] == [
        ("awaiting_approval", "info")
    ]
    assert "needs 1 approval" in next(w["message"] for w in waiting if "author" in w)


def test_a_flood_of_distinct_lines_is_written_whole_and_not_kept_past_the_bound() -> None:
    stream = io.StringIO()
    log = EventLog("json", stream=stream, clock=lambda: 0.0)
    for i in range(REPEATS_KEPT + 500):
        log.info("sent", "apply accepted", node=f"n{i}")
    assert len(stream.getvalue().splitlines()) == REPEATS_KEPT + 500
    assert len(log._repeats.windows) <= REPEATS_KEPT + 1
