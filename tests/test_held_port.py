"""The test kit's promise about ports: a port a test holds is its own.
Nothing can bind it beside the holder, whatever socket options it sets;
it refuses connections until it listens, and listens again on the same
port after serving, however many connections linger in TIME_WAIT."""

from __future__ import annotations

import socket

import pytest

from tests.kit.ports import HeldPort

OPTIONS = {
    "plain": (),
    "SO_REUSEADDR": (socket.SO_REUSEADDR,),
    "SO_REUSEPORT": (socket.SO_REUSEPORT,),
    "both": (socket.SO_REUSEADDR, socket.SO_REUSEPORT),
}


def can_bind(port: int, options: tuple[int, ...]) -> bool:
    with socket.socket() as other:
        for option in options:
            other.setsockopt(socket.SOL_SOCKET, option, 1)
        try:
            other.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def refused(port: int) -> bool:
    with socket.socket() as client:
        try:
            client.connect(("127.0.0.1", port))
        except ConnectionRefusedError:
            return True
        return False


def serve_one(held: HeldPort) -> None:
    """One connection that carries a byte, closed by the server first
    (TIME_WAIT on the held port)."""
    server = held.listen()
    with socket.create_connection(("127.0.0.1", held.port), timeout=10) as client:
        accepted, _ = server.accept()
        client.sendall(b"x")
        assert accepted.recv(1) == b"x"
        accepted.close()
        assert client.recv(1) == b""


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
def test_nobody_binds_a_held_port_while_it_refuses_or_listens(
    held_port: HeldPort, options: tuple[int, ...]
) -> None:
    assert refused(held_port.port)
    assert not can_bind(held_port.port, options)

    held_port.listen()
    assert not can_bind(held_port.port, options)

    serve_one(held_port)
    held_port.refuse()
    assert refused(held_port.port)
    assert not can_bind(held_port.port, options)


def test_a_held_port_listens_again_after_serving(held_port: HeldPort) -> None:
    for _ in range(3):
        serve_one(held_port)
        held_port.refuse()
        assert refused(held_port.port)
    serve_one(held_port)


def test_refusing_twice_leaves_the_next_listen_working(held_port: HeldPort) -> None:
    held_port.refuse()
    held_port.refuse()

    serve_one(held_port)
