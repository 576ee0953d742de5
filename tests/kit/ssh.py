"""A real OpenSSH server on 127.0.0.1 for the tests of SSH remotes.

Each server is Debian's ``/usr/sbin/sshd`` in the foreground (``-D -e``)
with its own generated host key, config and ``authorized_keys``, serving
a loopback port the test holds and hands over (sshd takes it as systemd
socket activation), so a server started again with ``port=old.held``
comes back on the same port and nobody else can take it meanwhile. The client runs ``git-upload-pack`` and
``git-receive-pack`` through the login shell, as it would on a forge.

    server = SshServer.start(tmp_path / "sshd", client_pub=pub)
    url = server.url(bare)            # ssh://USER@127.0.0.1:PORT/abs/path
    server.known_hosts_line()         # "[127.0.0.1]:PORT ssh-ed25519 AAAA..."
    server.stop()                     # connections refused, the port still held
    server.close()                    # and let go

``serve`` points every Git command at one repository whatever path the
client asks for: an impostor serving its own copy at the real URL.
"""

from __future__ import annotations

import getpass
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.kit.keys import make_key
from tests.kit.ports import HeldPort, handed_over

SSHD = Path("/usr/sbin/sshd")


def require_sshd() -> None:
    """Skip (with the reason) where no sshd is installed; in CI (.ci/run sets
    RECONCILER_REQUIRE_SSHD and installs openssh-server) a missing sshd fails."""
    if not SSHD.exists():
        reason = f"{SSHD} is not installed (apt-get install openssh-server; .ci/run does)"
        if os.environ.get("RECONCILER_REQUIRE_SSHD"):
            pytest.fail(reason)
        pytest.skip(reason)
    if os.geteuid() == 0:
        # sshd refuses to start as root without its privilege separation folder.
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)


@dataclass
class SshServer:
    root: Path
    port: int
    host_key: Path
    process: subprocess.Popen[bytes]
    user: str
    held: HeldPort

    @classmethod
    def start(
        cls,
        root: Path,
        *,
        client_pub: str,
        port: HeldPort | None = None,
        authorized_keys: str | None = None,
        host_key: Path | None = None,
        serve: Path | None = None,
        log_level: str = "ERROR",
    ) -> SshServer:
        require_sshd()
        root.mkdir(parents=True, exist_ok=True)
        if host_key is None:
            host_key = make_key(root / "host_ed25519", comment="host").private
        (root / "authorized_keys").write_text(authorized_keys or client_pub + "\n")
        lines = [
            "ListenAddress 127.0.0.1",  # not bound: sshd serves the socket handed over
            f"HostKey {host_key}",
            f"PidFile {root / 'sshd.pid'}",
            f"AuthorizedKeysFile {root / 'authorized_keys'}",
            "StrictModes no",
            "UsePAM no",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            f"LogLevel {log_level}",
        ]
        if serve is not None:
            script = root / "serve.sh"
            script.write_text(
                "#!/bin/sh\n"
                'case "$SSH_ORIGINAL_COMMAND" in\n'
                f"  git-upload-pack*) exec git-upload-pack '{serve}' ;;\n"
                f"  git-receive-pack*) exec git-receive-pack '{serve}' ;;\n"
                "esac\nexit 1\n"
            )
            script.chmod(0o755)
            lines.append(f"ForceCommand {script}")
        config = root / "sshd_config"
        config.write_text("\n".join(lines) + "\n")
        held = port or HeldPort()
        command, fds = handed_over([str(SSHD), "-D", "-e", "-f", str(config)], held)
        log = open(root / "sshd.log", "ab")  # noqa: SIM115 - the server's stderr
        process = subprocess.Popen(command, stderr=log, pass_fds=fds)
        log.close()
        server = cls(root, held.port, host_key, process, getpass.getuser(), held)
        server._wait_listening()
        return server

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"sshd exited: {(self.root / 'sshd.log').read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise AssertionError(f"sshd did not listen on {self.port}")

    def url(self, repo: Path) -> str:
        return f"ssh://{self.user}@127.0.0.1:{self.port}{repo}"

    @property
    def host_pub(self) -> Path:
        return Path(f"{self.host_key}.pub")

    def known_hosts_line(self) -> str:
        kind, blob = self.host_pub.read_text().split()[:2]
        return f"[127.0.0.1]:{self.port} {kind} {blob}"

    def log(self) -> str:
        return (self.root / "sshd.log").read_text(errors="replace")

    def stop(self) -> None:
        """Stop sshd; its port stays held, refusing connections."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.held.refuse()

    def close(self) -> None:
        """Stop sshd and let its port go."""
        self.stop()
        self.held.close()


GITOLITE = Path("/usr/bin/gitolite")
GITOLITE_SHELL = Path("/usr/share/gitolite3/gitolite-shell")


def require_gitolite() -> None:
    """As ``require_sshd``, for Debian's gitolite3."""
    if not (GITOLITE.exists() and GITOLITE_SHELL.exists()):
        reason = "gitolite3 is not installed (apt-get install gitolite3; .ci/run does)"
        if os.environ.get("RECONCILER_REQUIRE_SSHD"):
            pytest.fail(reason)
        pytest.skip(reason)


def gitolite_setup(home: Path, admin_pub: Path, conf: str) -> None:
    """A gitolite install in ``home`` (its own HOME), ``conf`` as its rules."""
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(home)}
    subprocess.run(
        ["gitolite", "setup", "-pk", str(admin_pub)], env=env, check=True, capture_output=True
    )
    (home / ".gitolite" / "conf" / "gitolite.conf").write_text(conf)
    subprocess.run(["gitolite", "setup"], env=env, check=True, capture_output=True)


def gitolite_login(home: Path, user: str, pub: str) -> str:
    """An ``authorized_keys`` line that runs gitolite as ``user`` for ``pub``."""
    return (
        f'command="HOME={home} {GITOLITE_SHELL} {user}",no-port-forwarding,'
        f"no-X11-forwarding,no-agent-forwarding,no-pty {pub}\n"
    )
