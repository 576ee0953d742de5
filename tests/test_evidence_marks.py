"""The dashboard's evidence marks (docs/trust.md): nodes without
``agentKey`` are marked "unsigned evidence" and plain ``http://`` agents
are marked, each once the fleet has started to use keys or TLS, so a
repository written for version 1 keeps its dashboard. Real repositories,
the real simulated fleet, the in-process daemon."""

from __future__ import annotations

from pathlib import Path

from reconciler.protocol.evidence import derived_agent_key
from reconciler.spec.model import Node
from reconciler.text.evidence_marks import evidence_dashboard_section, evidence_marks
from tests.kit.documents import node_yaml
from tests.kit.fleets import FleetKit
from tests.kit.git import git
from tests.markdown_render import plain_text

SEED = "marks"
PIN = "ab" * 32


def node(name: str, agent: str = "http://127.0.0.1:8710", key: bool = False) -> Node:
    return Node(
        name, agent, agent_key=derived_agent_key(SEED, name).public_openssh if key else None
    )


def test_a_version_1_fleet_is_not_marked() -> None:
    nodes = (node("gpu-a1"), node("gpu-a2"))
    assert evidence_marks(nodes).marked == ()
    assert evidence_dashboard_section(nodes) == ""


def test_once_one_node_has_a_key_the_others_give_unsigned_evidence() -> None:
    nodes = (node("gpu-a2"), node("gpu-a1", key=True), node("gpu-a3"))
    found = evidence_marks(nodes)
    assert found.marked == (
        ("gpu-a2", ("unsigned evidence",)),
        ("gpu-a3", ("unsigned evidence",)),
    )
    text = evidence_dashboard_section(nodes)
    assert "2 of 3 nodes give unsigned evidence" in text
    assert "plain" not in text  # nobody uses TLS: http is not marked


def test_once_one_agent_is_https_plain_http_agents_are_marked() -> None:
    nodes = (node("gpu-a1", "https://127.0.0.1:8711"), node("gpu-a2", "http://127.0.0.1:8712"))
    assert evidence_marks(nodes).marked == (("gpu-a2", ("plain http",)),)
    both = (*nodes, node("gpu-a3", key=True))
    assert evidence_marks(both).marked == (
        ("gpu-a1", ("unsigned evidence",)),
        ("gpu-a2", ("unsigned evidence", "plain http")),
        ("gpu-a3", ("plain http",)),
    )


def test_a_large_fleet_lists_200_marked_nodes_and_counts_the_rest() -> None:
    nodes = tuple(node(f"n{i:05d}", key=i == 0) for i in range(1000))
    text = evidence_dashboard_section(nodes)
    assert "999 of 1000 nodes give unsigned evidence" in text
    assert text.count(" | unsigned evidence |") == 200
    assert plain_text(text).endswith("... and 799 more")


def dashboard(kit: FleetKit) -> str:
    return git("show", "main:status/README.md", cwd=kit.bare)


def test_the_daemon_marks_nodes_once_the_fleet_uses_keys_and_tls(tmp_path: Path) -> None:
    kit = FleetKit.create(
        tmp_path, {"gpu-a1": {}, "gpu-a2": {}, "gpu-a3": {}}, sim_args=("--key-seed", SEED)
    )
    try:
        daemon = kit.daemon()
        daemon.run_pass()
        before = dashboard(kit)
        assert "## Evidence" not in before and "unsigned" not in before  # version 1: as it was

        key = derived_agent_key(SEED, "gpu-a1").public_openssh
        kit.push({"nodes/gpu-a1.yaml": node_yaml("gpu-a1", kit.fleet.url, {}, agent_key=key)})
        daemon.run_pass()
        text = dashboard(kit)
        assert text.startswith(before.rstrip("\n"))  # only a section is added
        assert "2 of 3 nodes give unsigned evidence" in text
        assert "| `gpu-a2` | unsigned evidence |" in text
        assert "| `gpu-a3` | unsigned evidence |" in text
        assert "`gpu-a1`" not in text.split("## Evidence")[1]
        assert "plain http" not in text

        https = node_yaml("gpu-b1", "https://127.0.0.1:9", {}, cert_pin=PIN)
        kit.push({"nodes/gpu-b1.yaml": https})
        daemon.run_pass()
        text = dashboard(kit)
        assert "3 of 4 nodes give unsigned evidence" in text
        assert "3 of 4 nodes are reached over plain `http://`" in text
        assert "| `gpu-a1` | plain http |" in text
        assert "| `gpu-a2` | unsigned evidence · plain http |" in text
        assert "| `gpu-b1` | unsigned evidence |" in text

        # Back to a version 1 fleet: the section goes.
        kit.push(
            {
                "nodes/gpu-a1.yaml": node_yaml("gpu-a1", kit.fleet.url, {}),
                "nodes/gpu-b1.yaml": None,
            }
        )
        daemon.run_pass()
        assert dashboard(kit) == before
    finally:
        kit.close()
