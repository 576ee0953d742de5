"""A real file server for tests: Debian's ``nginx`` serving a folder on a
loopback port, with a temporary prefix and config (pid, logs and temporary
files inside it), a ``limit_rate`` for slow downloads, real ``Range``
answers, and https with a certificate of its own CA when asked.

    with NginxServer(tmp_path / "nginx", files, rate=20 * 1024 * 1024) as nginx:
        url = nginx.url("model.gguf")

The listening socket is bound (port 0) and held by the test, and nginx
inherits it (the ``NGINX`` variable it reads on a binary upgrade), so the
port is never let go. Without the binary the test is skipped, saying why;
in CI (``CI=true``, where ``.ci/run`` installs the package) a missing
binary fails instead.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from reconciler.cli.nginx_router import router_config
from tests.kit.servers import require_binary


def require_nginx() -> str:
    return require_binary("RECONCILER_NGINX", "/usr/sbin/nginx", "nginx", "to serve the artifacts")


class NginxServer:
    """nginx serving ``files`` (a folder) on 127.0.0.1; ``rate``: bytes a
    second per connection (None: uncapped); ``tls``: (cert, key) files;
    ``gzip``: compress answers for clients that accept it; ``redirects``:
    path -> URL answered with a 302 to it; ``listener``: a socket already
    bound (not yet listening: connections to it are refused until nginx
    starts), instead of a fresh one."""

    def __init__(
        self,
        root: Path,
        files: Path,
        *,
        rate: int | None = None,
        tls: tuple[Path, Path] | None = None,
        gzip: bool = False,
        redirects: Mapping[str, str] | None = None,
        listener: socket.socket | None = None,
    ) -> None:
        self.binary = require_nginx()
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        (root / "tmp").mkdir(exist_ok=True)
        self.socket = listener or socket.socket()
        if listener is None:
            self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(128)
        self.port: int = self.socket.getsockname()[1]
        self.scheme = "https" if tls else "http"
        (root / "nginx.conf").write_text(self._config_text(files, rate, tls, gzip, redirects or {}))
        self.log = root / "error.log"
        self.log.write_bytes(b"")
        self.process = subprocess.Popen(
            [self.binary, "-p", f"{root}/", "-c", str(root / "nginx.conf"), "-e", str(self.log)],
            pass_fds=[self.socket.fileno()],
            env={**os.environ, "NGINX": f"{self.socket.fileno()};"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        self._wait_started()

    def _config_text(
        self,
        files: Path,
        rate: int | None,
        tls: tuple[Path, Path] | None,
        gzip: bool,
        redirects: Mapping[str, str],
    ) -> str:
        return _config(self.port, files, rate, tls, gzip, redirects)

    def url(self, name: str) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}/{name}"

    def requests(self, at_least: int = 0) -> list[str]:
        """The access log's lines, ``METHOD PATH STATUS BYTES RANGE``, once
        there are ``at_least`` (nginx logs a request after answering it)."""
        path = self.root / "access.log"
        deadline = time.monotonic() + 30
        while True:
            lines = path.read_text().splitlines() if path.exists() else []
            if len(lines) >= at_least or time.monotonic() > deadline:
                return lines
            time.sleep(0.02)

    def _wait_started(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"nginx exited: {self.log.read_text(errors='replace')}")
            if "start worker process" in self.log.read_text(errors="replace"):
                return
            time.sleep(0.05)
        raise AssertionError("nginx did not start within 30 s")

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.socket.close()

    def __enter__(self) -> NginxServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class NginxRouter(NginxServer):
    """nginx as a node-local router, as docs/standby.md sets it up: every
    request goes to the one server the include file ``upstream`` names
    (``server 127.0.0.1:PORT;``), which the slot route command rewrites
    before it runs ``reload_command``. ``initial``: the port named first."""

    def __init__(self, root: Path, upstream: Path, initial: int) -> None:
        self.upstream = upstream
        upstream.write_text(f"server 127.0.0.1:{initial};\n")
        super().__init__(root, root)

    def _config_text(
        self,
        files: Path,
        rate: int | None,
        tls: tuple[Path, Path] | None,
        gzip: bool,
        redirects: Mapping[str, str],
    ) -> str:
        # The demo's router as shipped, logging what it saw of its clients
        # too: a probe cut off by the router is explained by its log.
        return router_config(self.port, self.upstream, log_level="info")

    def reload_command(self) -> str:
        """``nginx -s reload`` for this instance (its prefix, config and log)."""
        return (
            f"{self.binary} -p {self.root}/ -c {self.root / 'nginx.conf'} -e {self.log} -s reload"
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _config(
    port: int,
    files: Path,
    rate: int | None,
    tls: tuple[Path, Path] | None,
    gzip: bool,
    redirects: Mapping[str, str],
) -> str:
    user = "user root root;\n" if os.geteuid() == 0 else ""  # workers must read tmp_path
    listen = f"listen 127.0.0.1:{port}" + (" ssl" if tls else "") + ";"
    certificate = f"ssl_certificate {tls[0]};\nssl_certificate_key {tls[1]};\n" if tls else ""
    limit = f"limit_rate {rate};" if rate else ""
    return (
        "daemon off;\nmaster_process on;\nworker_processes 1;\n"
        + user
        + "pid nginx.pid;\nerror_log error.log notice;\n"
        "events { worker_connections 256; }\n"
        "http {\n"
        "  log_format plain '$request_method $uri $status $body_bytes_sent $http_range';\n"
        "  access_log access.log plain;\n"
        "  client_body_temp_path tmp; proxy_temp_path tmp; fastcgi_temp_path tmp;\n"
        "  uwsgi_temp_path tmp; scgi_temp_path tmp;\n"
        "  types { application/octet-stream bin gguf; }\n"
        + ("  gzip on; gzip_types application/octet-stream; gzip_min_length 1;\n" if gzip else "")
        + f"  server {{\n    {listen}\n    {certificate}    root {files};\n"
        f"    location / {{ {limit} }}\n"
        + "".join(
            f"    location = {path} {{ return 302 {to}; }}\n" for path, to in redirects.items()
        )
        + "  }\n"
        "}\n"
    )


def make_ca_and_cert(folder: Path) -> tuple[Path, Path, Path]:
    """A CA (``ca.crt``) and a certificate it signed for 127.0.0.1
    (``server.crt``, ``server.key``)."""
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test artifact CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_path, cert_path, key_path = folder / "ca.crt", folder / "server.crt", folder / "server.key"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return ca_path, cert_path, key_path
