"""One rule for a node's agent address (``spec.agent_url``): what validates
is what the engine dispatches to. A path prefix and a host name with ``_``
used to pass the document checks and then hold the rollout with
``dispatch_refused``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.cli import main as cli
from reconciler.spec.agent_url import is_usable_agent_url
from reconciler.spec.documents import parse_file
from tests.engine_world import World
from tests.kit.documents import node_yaml, rollout_yaml
from tests.kit.fleets import FleetKit

# Accepted by the old document checks and refused by the old engine rule.
PREFIXED = "http://127.0.0.1:8710/agent"
UNDERSCORED = "http://my_host:8710"

USABLE = [
    "http://10.0.0.5:8710",
    "https://gpu-a1.example:443/",
    "http://[::1]:8710",
    PREFIXED,
    UNDERSCORED,
    "http://agent",
]
UNUSABLE = [
    "ftp://10.0.0.1",
    "http://host:0",
    "http://host:65536",
    "http://host:",
    "http://user@host:8710",
    "http://host:8710/?q=1",
    "http://host:8710/#top",
    "http:// host",
    "http://",
]


@pytest.mark.parametrize("url", USABLE)
def test_the_rule_accepts_usable_addresses_in_documents_and_engine_alike(url: str) -> None:
    # An https:// agent also needs its certificate pinned (docs/trust.md).
    pin = "ab" * 32 if url.startswith("https://") else None
    parsed = parse_file("nodes/n.yaml", node_yaml("n", url, {"role": "web"}, cert_pin=pin).encode())
    assert is_usable_agent_url(url)
    assert parsed.node is not None and parsed.problems == ()


@pytest.mark.parametrize("url", UNUSABLE)
def test_the_rule_refuses_unusable_addresses_in_documents_and_engine_alike(url: str) -> None:
    parsed = parse_file("nodes/n.yaml", node_yaml("n", url, {"role": "web"}).encode())
    assert not is_usable_agent_url(url)
    assert parsed.node is None and any("agent" in str(p) for p in parsed.problems)


def test_validate_accepts_a_path_prefix_and_an_underscored_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "nodes").mkdir()
    (tmp_path / "rollouts").mkdir()
    (tmp_path / "nodes" / "prefixed.yaml").write_text(node_yaml("prefixed", PREFIXED, {"r": "w"}))
    (tmp_path / "nodes" / "underscored.yaml").write_text(
        node_yaml("underscored", UNDERSCORED, {"r": "w"})
    )
    (tmp_path / "rollouts" / "web.yaml").write_text(rollout_yaml("web", selector={"r": "w"}))

    assert cli.main(["validate", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "ok: 2 nodes, 1 rollout\n"


@pytest.mark.parametrize("url", [PREFIXED, UNDERSCORED])
def test_the_engine_dispatches_to_an_address_that_validates(url: str) -> None:
    w = World(["a"])
    w.set_node("a", agent=url)
    w.rollout()

    w.step(0)

    assert w.hold() is None and w.sent_now() == ["a"]


@pytest.fixture
def kit(tmp_path: Path) -> Iterator[FleetKit]:
    kit = FleetKit.create(tmp_path, {"web-1": {"role": "web"}})
    yield kit
    kit.close()


def test_a_real_pass_records_jobs_for_a_path_prefix_and_an_underscored_host(
    kit: FleetKit,
) -> None:
    # The daemon is killed after its status commit and before it sends, so
    # nothing ever looks up my_host (tests reach loopback addresses only).
    kit.push(
        {
            "nodes/prefixed.yaml": node_yaml("prefixed", PREFIXED, {"role": "edge"}),
            "nodes/underscored.yaml": node_yaml("underscored", UNDERSCORED, {"role": "edge"}),
            "rollouts/edge.yaml": rollout_yaml("edge", selector={"role": "edge"}, batchSize=2),
        }
    )
    daemon = subprocess.run(
        [sys.executable, "-m", "reconciler", "run", "--repo", str(kit.bare),
         "--key", str(kit.key_path), "--once"],
        env={**os.environ, "RECONCILER_CRASH_AT": "after_push"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert daemon.returncode == -signal.SIGKILL, daemon.stdout + daemon.stderr

    status = kit.statuses()["edge"]
    assert status["phase"] == "running" and status.get("hold") is None
    nodes = {n["name"]: n for n in status["nodes"]}
    assert {n: nodes[n]["state"] for n in nodes} == {
        "prefixed": "dispatched",
        "underscored": "dispatched",
    }
    assert all(nodes[n].get("jobId") for n in nodes)
