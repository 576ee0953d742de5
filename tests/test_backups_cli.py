"""``reconciler backups NODE`` asks the node's real agent (on 127.0.0.1),
found through the node file on the branch."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from reconciler.cli import main as cli
from reconciler.spec.model import Target
from tests.kit.agents import AgentThread
from tests.kit.documents import make_status, node_yaml, status_text
from tests.kit.git import git, make_repo
from tests.kit.jobs import envelope, job
from tests.kit.keys import make_key
from tests.kit.ports import HeldPort


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentThread]:
    """An agent for node-a that has applied two live jobs, so it keeps two backups."""
    key = make_key(tmp_path / "keys" / "reconciler").signing
    config = tmp_path / "state" / "runtimes" / "hermes.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("provider: ollama\nmodel: llama3-old\nprofile: default\n")
    served = AgentThread(tmp_path / "state", [key])
    served.post(envelope(job("apply-0001", rollout="llama-canary"), key))
    served.wait_finished("apply-0001")
    second = job(
        "apply-0002", rollout="mistral-lab", target=Target("hermes", "ollama", "mistral-7b")
    )
    served.post(envelope(second, key))
    served.wait_finished("apply-0002")
    yield served
    served.close()


def test_backups_lists_the_agents_backups_newest_first(
    tmp_path: Path,
    identity: dict[str, str],
    agent: AgentThread,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fleet = make_repo(
        tmp_path / "fleet",
        {"nodes/node-a.yaml": node_yaml("node-a", agent=agent.url, maintenance=None)},
    )

    assert cli.main(["backups", "node-a", "--repo", str(fleet)]) == 0

    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"node-a ({agent.url}): 2 backups, newest first"
    assert lines[1].split() == ["BACKUP", "RUNTIME", "CREATED", "JOB", "ROLLOUT", "PROVIDER/MODEL"]
    newest, oldest = lines[2].split(), lines[3].split()
    assert newest[3:] == ["apply-0002", "mistral-lab", "vllm/llama3.1-8b"]
    assert oldest[3:] == ["apply-0001", "llama-canary", "ollama/llama3-old"]
    assert newest[1] == oldest[1] == "hermes"
    assert newest[2] >= oldest[2]  # createdAt, RFC 3339 text

    assert cli.main(["backups", "node-a", "--repo", str(fleet), "--format", "json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["jobId"] for r in records] == ["apply-0002", "apply-0001"]
    assert records[1]["provider"] == "ollama" and records[1]["model"] == "llama3-old"

    assert cli.main(["backups", "node-a", "--repo", str(fleet), "-o", "yaml"]) == 0
    assert YAML(typ="safe", pure=True).load(capsys.readouterr().out) == records


def test_an_unknown_node_names_the_known_ones(
    tmp_path: Path, identity: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = make_repo(
        tmp_path / "fleet", {"nodes/node-a.yaml": node_yaml("node-a", maintenance=None)}
    )

    assert cli.main(["backups", "node-z", "--repo", str(fleet)]) == 1

    err = capsys.readouterr().err
    assert "no node named 'node-z'" in err and "nodes: node-a" in err


def test_an_unreachable_agent_is_a_clear_failure(
    tmp_path: Path,
    identity: dict[str, str],
    held_port: HeldPort,
    capsys: pytest.CaptureFixture[str],
) -> None:
    port = held_port.port  # nothing listens on it
    fleet = make_repo(
        tmp_path / "fleet",
        {
            "nodes/node-a.yaml": node_yaml(
                "node-a", agent=f"http://127.0.0.1:{port}", maintenance=None
            )
        },
    )

    assert cli.main(["backups", "node-a", "--repo", str(fleet)]) == 1

    assert f"cannot reach the agent of node-a at http://127.0.0.1:{port}" in capsys.readouterr().err


def test_from_a_laptop_that_cannot_reach_the_agent_the_recorded_backups_are_shown(
    tmp_path: Path,
    identity: dict[str, str],
    held_port: HeldPort,
    capsys: pytest.CaptureFixture[str],
) -> None:
    port = held_port.port  # nothing listens on it: the agent's network is elsewhere
    status = make_status("llama-canary", "completed", [("node-a", 1, "succeeded")])
    status = replace(
        status,
        nodes=(replace(status.nodes[0], first_backup_id="bk-first", backup_id="bk-later"),),
    )
    fleet = make_repo(
        tmp_path / "fleet",
        {
            "nodes/node-a.yaml": node_yaml(
                "node-a", agent=f"http://127.0.0.1:{port}", maintenance=None
            ),
            **status_text(status),
        },
    )

    assert cli.main(["backups", "node-a", "--repo", str(fleet)]) == 1

    out, err = capsys.readouterr()
    assert "node-a: backups recorded in the status files" in out
    assert re.search(r"^llama-canary\s+bk-first\s+bk-later\s+succeeded$", out, re.M)
    assert f"cannot reach the agent of node-a at http://127.0.0.1:{port}" in err
    assert "(from this machine)" in err
    assert "run reconciler backups node-a there (for example over ssh)" in " ".join(err.split())


def test_with_allowed_signers_backups_follows_the_verified_node_file(
    tmp_path: Path,
    identity: dict[str, str],
    agent: AgentThread,
    held_port: HeldPort,
    capsys: pytest.CaptureFixture[str],
) -> None:
    alice = make_key(tmp_path / "alice", comment="alice").private
    signers = tmp_path / "allowed_signers"
    signers.write_text(f"alice@example.com {alice.with_suffix('.pub').read_text()}")
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    git("init", "-q", "-b", "main", cwd=fleet)
    node = fleet / "nodes" / "node-a.yaml"
    node.parent.mkdir()
    node.write_text(node_yaml("node-a", agent=agent.url, maintenance=None))
    git("add", "-A", cwd=fleet)
    git("-c", "gpg.format=ssh", "-c", f"user.signingKey={alice}", "commit", "-qS",
        "-m", "Add node-a", cwd=fleet)  # fmt: skip
    # Without a key: the node's address moved to one the pusher chose.
    elsewhere = f"http://127.0.0.1:{held_port.port}"
    node.write_text(node_yaml("node-a", agent=elsewhere, maintenance=None))
    git("commit", "-qam", "Move node-a", cwd=fleet)

    assert cli.main(["backups", "node-a", "--repo", str(fleet)]) == 1
    assert f"cannot reach the agent of node-a at {elsewhere}" in capsys.readouterr().err
    argv = ["backups", "node-a", "--repo", str(fleet), "--allowed-signers", str(signers)]
    assert cli.main(argv) == 0
    assert capsys.readouterr().out.startswith(f"node-a ({agent.url}): 2 backups")
