"""The agent started by systemd socket activation: it serves the socket it
was handed, never binds ``--listen``, and leaves nothing for its children."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from reconciler.node.activation import inherited_socket
from tests.kit.agents import start_agent
from tests.kit.keys import make_key
from tests.kit.ports import HeldPort


def test_an_agent_handed_a_socket_serves_it_and_comes_back_on_it_after_a_restart(
    tmp_path: Path,
) -> None:
    trust = make_key(tmp_path / "keys" / "reconciler").public
    agent = start_agent(tmp_path / "a1", "gpu-a1", trust, config=b"model: m\n", keep_port=True)
    try:
        assert agent.held is not None
        assert agent.url == agent.held.url
        assert httpx.get(f"{agent.url}/v1/nodes/gpu-a1/heartbeat", timeout=10).status_code == 200

        agent.stop()
        with pytest.raises(httpx.ConnectError):  # down: refused, not queued
            httpx.get(f"{agent.url}/v1/nodes/gpu-a1/heartbeat", timeout=10)

        agent.restart()
        assert httpx.get(f"{agent.url}/v1/nodes/gpu-a1/heartbeat", timeout=10).status_code == 200
    finally:
        agent.close()


def test_listen_variables_for_another_process_are_left_alone() -> None:
    environ = {"LISTEN_FDS": "1", "LISTEN_PID": str(os.getpid() + 1)}

    assert inherited_socket(environ) is None
    assert environ == {"LISTEN_FDS": "1", "LISTEN_PID": str(os.getpid() + 1)}


def test_without_listen_variables_there_is_no_socket() -> None:
    assert inherited_socket({}) is None


def test_more_than_one_socket_is_refused_saying_what_to_change() -> None:
    environ = {"LISTEN_FDS": "2", "LISTEN_PID": str(os.getpid()), "LISTEN_FDNAMES": "a:b"}

    with pytest.raises(ValueError, match="one ListenStream="):
        inherited_socket(environ)
    assert environ == {}  # read once: no child takes them for its own


def test_the_socket_on_descriptor_3_is_taken_and_not_passed_on(held_port: HeldPort) -> None:
    listening = held_port.listen()
    saved = os.dup(3) if _is_open(3) else None
    os.dup2(listening.fileno(), 3)
    environ = {"LISTEN_FDS": "1", "LISTEN_PID": str(os.getpid())}
    try:
        sock = inherited_socket(environ)
        assert sock is not None
        assert sock.getsockname() == ("127.0.0.1", held_port.port)
        assert not sock.get_inheritable()
        assert environ == {}
        sock.detach()  # descriptor 3 is put back below
    finally:
        if saved is not None:
            os.dup2(saved, 3)
            os.close(saved)
        else:
            os.close(3)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_a_descriptor_3_that_is_no_socket_is_refused(tmp_path: Path) -> None:
    saved = os.dup(3) if _is_open(3) else None
    with open(tmp_path / "plain", "w") as plain:
        os.dup2(plain.fileno(), 3)
    try:
        with pytest.raises(ValueError, match="descriptor 3 is not a socket"):
            inherited_socket({"LISTEN_FDS": "1", "LISTEN_PID": str(os.getpid())})
    finally:
        if saved is not None:
            os.dup2(saved, 3)
            os.close(saved)
        else:
            os.close(3)
