"""The listening socket a service manager handed over: systemd socket
activation (``sd_listen_fds``), for the agent.

A ``.socket`` unit binds the port, then starts the service with the socket
as descriptor 3 and ``LISTEN_FDS=1``, ``LISTEN_PID=<the service's pid>``.
The agent then serves on that socket, so it can listen on a port it has no
right to bind, and connections made while it restarts wait instead of
being refused.

Must not: bind or listen itself, or accept more than one socket; the
variables are removed once read, so no child (an ``--after-apply``
command) takes the socket for its own.
"""

from __future__ import annotations

import os
import socket
from collections.abc import MutableMapping

FIRST_FD = 3  # SD_LISTEN_FDS_START
VARIABLES = ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES")


def inherited_socket(
    environ: MutableMapping[str, str] = os.environ,
) -> socket.socket | None:
    """The socket handed to this process, or None when none was (or the
    variables were meant for another process). ValueError when more than one
    socket was handed over, or descriptor 3 is not a stream socket."""
    count, pid = environ.get("LISTEN_FDS"), environ.get("LISTEN_PID")
    if count is None or pid != str(os.getpid()):
        return None
    for name in VARIABLES:
        environ.pop(name, None)
    if count != "1":
        raise ValueError(
            f"LISTEN_FDS={count}: the agent serves one socket; give its socket unit "
            "one ListenStream="
        )
    try:
        sock = socket.socket(fileno=FIRST_FD)
    except OSError as exc:
        raise ValueError(f"LISTEN_FDS=1 but descriptor 3 is not a socket: {exc}") from None
    if sock.type != socket.SOCK_STREAM:
        sock.detach()
        raise ValueError("LISTEN_FDS=1 but descriptor 3 is not a stream (TCP) socket")
    sock.set_inheritable(False)
    return sock
