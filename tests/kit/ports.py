"""Loopback ports for tests that nobody else can take.

A port a test let go of is free for anyone: another test's server, another
engineer's sshd, or the local end of an outgoing connection can take it
before the server it was meant for binds it. So a test never hands out a
port it does not hold:

- a server we run binds port 0 and reports the port it got (``reconciler
  agent`` and ``sim-fleet`` print ``listening on HOST:PORT``; in-process
  servers read their socket);
- "a port where nothing listens" is a ``HeldPort``: bound, so no one else
  can bind it, and not listening, so every connection is refused;
- a server that must come back on the same port (an agent restarted behind
  an unchanged node file) is handed the held, listening socket
  (``HeldPort.listen``; the agent takes it as systemd socket activation),
  and the port goes back to refusing when the server stops
  (``HeldPort.refuse``);
- a program that can neither bind 0 and say so nor take a socket (sshd,
  prometheus) gets ``start_on_free_port``: a port held until just before
  it starts, and a new port when it lost the race, seen from its own exit
  and log, never from a probe another listener could answer.

Linux only: un-listening a socket while keeping its port is
``shutdown(SHUT_RD)`` on a listening socket bound to an explicit port.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

LOOPBACK = "127.0.0.1"


class HeldPort:
    """A loopback port held for this object's life: bound without
    ``SO_REUSEADDR`` (no one else can bind it), listening only between
    ``listen`` and ``refuse``. Use as a context manager, or ``close``."""

    def __init__(self) -> None:
        # A socket bound to port 0 gives its port back when it stops
        # listening; one bound to the port by number keeps it. Two sockets
        # with SO_REUSEPORT get the number without a moment of it being free.
        first = _reuseport_socket()
        first.bind((LOOPBACK, 0))
        self.port: int = first.getsockname()[1]
        self.socket = _reuseport_socket()
        try:
            self.socket.bind((LOOPBACK, self.port))
        finally:
            first.close()
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 0)
        # Listening once recomputes the port's sharing rules without
        # SO_REUSEPORT, so from here no socket can join this one.
        self.listening = False
        self.listen()
        self.refuse()

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def listen(self, backlog: int = 128) -> socket.socket:
        """Start listening; returns the socket, for the server it is handed to."""
        # Connections the server closed linger in TIME_WAIT on this port;
        # listening again beside them needs SO_REUSEADDR, which only a
        # listening socket may have here (see refuse).
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.listen(backlog)
        self.listening = True
        return self.socket

    def refuse(self) -> None:
        """Stop listening, keep the port: connections are refused again and
        any not yet accepted are reset."""
        if self.listening:
            # Only ever on a listening socket: on one that is not, shutdown
            # marks it, and every connection accepted after the next listen,
            # as closed for reading.
            self.socket.shutdown(socket.SHUT_RD)
            self.listening = False
        # A bound socket that is not listening and has SO_REUSEADDR lets any
        # other socket with SO_REUSEADDR bind the port beside it.
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)

    def close(self) -> None:
        self.socket.close()

    def __enter__(self) -> HeldPort:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _reuseport_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    return sock


class PortTaken(Exception):
    """The program could not bind the port it was given: someone took it
    between our letting it go and the program's bind."""


def start_on_free_port(start: Callable[[int], T], attempts: int = 5) -> T:
    """``start(port)`` on a port held until just before the call; again on
    another port while it raises ``PortTaken``."""
    for _ in range(attempts - 1):
        with HeldPort() as held:
            port = held.port
        try:
            return start(port)
        except PortTaken:
            continue
    with HeldPort() as held:
        port = held.port
    return start(port)


def wait_listening(
    process: subprocess.Popen[bytes], port: int, log: Path, what: str, timeout: float = 30
) -> None:
    """Until ``process`` itself listens on ``LOOPBACK:port`` (its own socket,
    not another listener's). Raises ``PortTaken`` when it exited because the
    address was in use, ``AssertionError`` when it exited otherwise or
    ``timeout`` passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            text = log.read_text(errors="replace")
            if "address already in use" in text.lower():
                raise PortTaken(f"{what}: port {port} was taken")
            raise AssertionError(f"{what} exited ({process.returncode}): {text[-2000:]}")
        if listens(process.pid, port):
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} did not listen on {port} in {timeout:.0f}s")


def listens(pid: int, port: int) -> bool:
    """True when process ``pid`` holds a socket listening on ``LOOPBACK:port``
    (read from /proc: the listening socket's inode among the process's
    descriptors)."""
    wanted = f"0100007F:{port:04X}"
    inodes = set()
    with open("/proc/net/tcp", encoding="ascii") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if fields[1] == wanted and fields[3] == "0A":  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return False
    fds = Path(f"/proc/{pid}/fd")
    for fd in os.listdir(fds):
        try:
            if os.readlink(fds / fd) in inodes:
                return True
        except OSError:
            continue  # closed meanwhile
    return False


# Run as `python -c HAND_OVER FD PROGRAM ARGS...`: what systemd does for a
# socket unit, descriptor FD becomes 3 and LISTEN_PID the program's own pid.
HAND_OVER = """
import os, sys
fd = int(sys.argv[1])
if fd != 3:
    os.dup2(fd, 3)
    os.close(fd)
os.environ.update(LISTEN_FDS="1", LISTEN_PID=str(os.getpid()))
os.execv(sys.argv[2], sys.argv[2:])
"""


def handed_over(args: list[str], held: HeldPort) -> tuple[list[str], tuple[int, ...]]:
    """(command, pass_fds) that start ``args`` with ``held``'s socket handed
    over, listening, as systemd socket activation does (``args[0]`` a path)."""
    fd = held.listen().fileno()
    return [sys.executable, "-c", HAND_OVER, str(fd), *args], (fd,)
