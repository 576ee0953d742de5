"""A node-local nginx router for the model demo, as docs/standby.md sets one
up: every request goes to the one server named by an upstream include file
(``server 127.0.0.1:PORT;``), which the shipped slot script's ``route``
rewrites before it reloads nginx.

Must not: listen on any address but 127.0.0.1, or write outside its folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from reconciler.cli.llama_runtime import free_port
from reconciler.spec.errors import ReconcilerError

NGINX_VARIABLE = "RECONCILER_NGINX"
DEBIAN_NGINX = "/usr/sbin/nginx"  # not on a normal user's PATH


def find_nginx(environ: Mapping[str, str] = os.environ) -> Path | None:
    """$RECONCILER_NGINX, else ``nginx`` on the PATH, else Debian's; None when none is."""
    named = environ.get(NGINX_VARIABLE) or shutil.which("nginx") or DEBIAN_NGINX
    path = Path(named)
    return path if path.is_file() and os.access(path, os.X_OK) else None


def nginx_or_fail() -> Path:
    found = find_nginx()
    if found is None:
        raise ReconcilerError(
            f"nginx not found (${NGINX_VARIABLE}, the PATH, or {DEBIAN_NGINX}): "
            "each demo node routes its clients through its own nginx",
            hint="install it (Debian, Ubuntu: `sudo apt-get install nginx`), "
            f"or name the binary in ${NGINX_VARIABLE}",
        )
    return found


class NginxRouter:
    """nginx on a loopback port of its own, run from ``root`` (config, pid,
    logs and temporary files inside it), proxying to the port named in
    ``root/upstream.conf``; ``initial``: the port named first."""

    def __init__(self, binary: Path, root: Path, initial: int) -> None:
        self.binary = binary
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        (root / "tmp").mkdir(exist_ok=True)
        self.upstream = root / "upstream.conf"
        self.upstream.write_text(f"server 127.0.0.1:{initial};\n")
        self.port = free_port()
        self.config = root / "nginx.conf"
        self.config.write_text(router_config(self.port, self.upstream))
        self.log = root / "error.log"
        self.log.write_bytes(b"")
        self.process = subprocess.Popen(
            self._command(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        self._wait_started()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.root / "nginx.pid"

    def _command(self) -> list[str]:
        return [
            str(self.binary),
            "-p",
            f"{self.root}/",
            "-c",
            str(self.config),
            "-e",
            str(self.log),
        ]

    def reload_command(self) -> str:
        """``nginx -s reload`` for this instance, for the slot script's ``NGINX_RELOAD``."""
        return " ".join([*self._command(), "-s", "reload"])

    def _wait_started(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ReconcilerError(
                    f"nginx in {self.root} exited: {self.log.read_text(errors='replace').strip()}"
                )
            if "start worker process" in self.log.read_text(errors="replace"):
                return
            time.sleep(0.05)
        raise ReconcilerError(f"nginx in {self.root} did not start within 30 s; see {self.log}")

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def router_config(port: int, upstream: Path, log_level: str = "notice") -> str:
    """nginx.conf for a router on 127.0.0.1:``port`` to the one server the
    include file ``upstream`` names; ``log_level``: error_log's (``info``
    adds what nginx saw of each client connection)."""
    user = "user root root;\n" if os.geteuid() == 0 else ""  # workers must read the folder
    return (
        "daemon off;\nmaster_process on;\nworker_processes 1;\n"
        + user
        + f"pid nginx.pid;\nerror_log error.log {log_level};\n"
        "events { worker_connections 256; }\n"
        "http {\n"
        "  access_log off;\n"
        "  client_body_temp_path tmp; proxy_temp_path tmp; fastcgi_temp_path tmp;\n"
        "  uwsgi_temp_path tmp; scgi_temp_path tmp;\n"
        f"  upstream runtime {{ include {upstream}; keepalive 8; }}\n"
        f"  server {{\n    listen 127.0.0.1:{port};\n"
        "    location / {\n"
        "      proxy_pass http://runtime;\n"
        "      proxy_http_version 1.1;\n"
        '      proxy_set_header Connection "";\n'
        "      proxy_read_timeout 300s;\n"
        "    }\n  }\n"
        "}\n"
    )
