"""A flood of slow connections against a real agent on 127.0.0.1: 512
connections that each sent one byte of a request fill the agent's cap,
and the daemon's own heartbeat reads must keep being answered."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

from reconciler.daemon.agent_client import AgentClient
from reconciler.node.http_server import MAX_CONNECTIONS
from tests.kit.agents import AgentThread
from tests.kit.keys import make_key


def one_byte(port: int) -> socket.socket | None:
    """A connection that sent the first byte of a request and nothing more."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        return None
    with contextlib.suppress(OSError):
        sock.sendall(b"G")
    return sock


def test_slow_one_byte_connections_give_way_to_the_daemons_reads(tmp_path: Path) -> None:
    daemon_key = make_key(tmp_path / "d" / "reconciler").signing
    agent = AgentThread(tmp_path / "state", [daemon_key])
    slow: list[socket.socket] = []
    answered = 0
    try:
        port = agent.server.port
        slow += filter(None, (one_byte(port) for _ in range(MAX_CONNECTIONS)))
        with AgentClient(daemon_key, timeout=5) as client:
            for _ in range(20):
                # The flood goes on: more one-byte connections between reads.
                slow += filter(None, (one_byte(port) for _ in range(25)))
                beat = client.read_heartbeats([(agent.url, "node-a")])["node-a"]
                answered += beat is not None
        assert agent.call(lambda: len(agent.server.connections)) <= MAX_CONNECTIONS
    finally:
        for sock in slow:
            sock.close()
        agent.close()
    assert answered == 20
