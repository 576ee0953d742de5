"""llama.cpp's llama-server on this machine, for the model demo (and the
tests): where the binary is, nodes whose server the shipped after-apply
script (example-repo/deploy/llama-server-after-apply.sh) restarts, and a
client-side load balancer that sends bounded client load to the nodes in
service and takes a node out when its drain command says so.

Must not: reach any address but 127.0.0.1, or download anything.
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from reconciler.cli.examples import example_dir
from reconciler.spec.runtime_presets import PRESETS

# The pinned source release the Makefile's `llama-server` target builds.
LLAMA_VERSION = "11434.0.0"
BINARY_VARIABLE = "RECONCILER_LLAMA_SERVER"
# Small models, two requests at once: what the tests and the demo need.
SERVER_ARGS = "--metrics -c 256 -np 2"
IDLE_METRICS = PRESETS["llama.cpp"].idle_metrics


def cache_binary(environ: Mapping[str, str] = os.environ) -> Path:
    """Where `make llama-server` puts the binary."""
    cache = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "reconciler" / f"llama-server-{LLAMA_VERSION}" / "llama-server"


def find_binary(environ: Mapping[str, str] = os.environ) -> Path | None:
    """$RECONCILER_LLAMA_SERVER, else the build cache; None when neither is
    an executable file."""
    named = environ.get(BINARY_VARIABLE)
    path = Path(named) if named else cache_binary(environ)
    return path if path.is_file() and os.access(path, os.X_OK) else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def after_apply_script() -> Path:
    return example_dir() / "deploy" / "llama-server-after-apply.sh"


def slot_script() -> Path:
    """The shipped slot commands (start, stop, route behind nginx)."""
    return example_dir() / "deploy" / "llama-server-slot.sh"


@dataclass(frozen=True)
class LlamaNode:
    """One node's llama-server, run by the shipped after-apply script in its
    pid-file mode from ``run_dir``."""

    binary: Path
    port: int
    run_dir: Path
    args: str = SERVER_ARGS

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.run_dir / f"{self.port}.pid"

    @property
    def log(self) -> Path:
        return self.run_dir / f"{self.port}.log"

    def environment(self) -> dict[str, str]:
        return {
            "LLAMA_SERVER": str(self.binary),
            "LLAMA_SERVER_PORT": str(self.port),
            "LLAMA_SERVER_RUN_DIR": str(self.run_dir),
            "LLAMA_SERVER_MODE": "pidfile",
            "LLAMA_SERVER_ARGS": self.args,
            "LLAMA_SERVER_READY_TIMEOUT": "60",
        }

    def after_apply(self) -> str:
        """The agent's ``--after-apply`` command for this node."""
        settings = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.environment().items())
        # Through bash: an installed wheel need not keep the script's mode.
        return f"{settings} bash {shlex.quote(str(after_apply_script()))}"

    def start(self, config: Path) -> subprocess.CompletedProcess[str]:
        """Run the after-apply script for ``config`` as the agent would."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.environment(), "RECONCILER_CONFIG": str(config)}
        return subprocess.run(
            ["bash", str(after_apply_script())],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def stop(self) -> None:
        """SIGTERM the server in the pid file, SIGKILL after 10 s: only while
        that pid is still a llama-server on this port, since a pid file can
        outlive its process and pids are reused."""
        try:
            pid = int(self.pid_file.read_text())
        except (OSError, ValueError):
            return
        if _serves_port(pid, self.port):
            stop_process(pid)


def _serves_port(pid: int, port: int) -> bool:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(a == b"--port" and b == str(port).encode() for a, b in itertools.pairwise(args))


def stop_process(pid: int, grace: float = 10.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@dataclass(frozen=True)
class Answer:
    """One client request: the node it went to, the HTTP status (0: no
    answer, cut off or refused), the ``model`` field of the answer (the
    file the server loaded), and when it was sent and answered (epoch
    seconds, comparable with the agents' timings on one machine)."""

    node: str
    status: int
    model: str
    sent: float
    answered: float


class Balancer:
    """Client load over the nodes in service, round robin, as a load
    balancer in front of them would send it; ``POST /drain/NODE`` and
    ``/undrain/NODE`` on ``control_url`` take a node out and put it back
    (the agents' ``--drain-command`` and ``--undrain-command`` call them).

    A drain answers once every request already sent to the node has been
    written to it, so the agent's wait for idle then sees it running."""

    def __init__(self, nodes: Mapping[str, str]) -> None:
        self.nodes = dict(nodes)  # name -> base URL
        self.drained: set[str] = set()
        self.events: list[str] = []  # "drain NODE", "undrain NODE", in order
        self.answers: list[Answer] = []
        self._sending = dict.fromkeys(self.nodes, 0)
        self._turn = 0
        self._changed = threading.Condition()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._control = _control_server(self)
        self.control_url = f"http://127.0.0.1:{self._control.server_address[1]}"
        threading.Thread(target=self._control.serve_forever, daemon=True).start()

    def commands(self, node: str) -> dict[str, str]:
        """The node's ``drain`` and ``undrain`` shell commands."""
        post = f"{shlex.quote(sys.executable)} -I -S -c {shlex.quote(_POST)}"
        return {
            verb: f"{post} {shlex.quote(f'{self.control_url}/{verb}/{node}')}"
            for verb in ("drain", "undrain")
        }

    def set_drained(self, node: str, drained: bool) -> None:
        with self._changed:
            if drained:
                self.drained.add(node)
            else:
                self.drained.discard(node)
            self.events.append(f"{'drain' if drained else 'undrain'} {node}")
            self._changed.notify_all()
            if drained:
                self._changed.wait_for(lambda: self._sending[node] == 0, timeout=30)

    def start(
        self,
        workers: int,
        *,
        max_requests: int,
        max_seconds: float,
        body: Mapping[str, Any] | None = None,
    ) -> None:
        """``workers`` clients asking without a pause until ``stop``, at most
        ``max_requests`` requests in all and for ``max_seconds``."""
        payload = json.dumps(body or {"prompt": "Hello", "max_tokens": 8, "temperature": 0})
        budget = iter(range(max_requests))
        deadline = time.monotonic() + max_seconds
        self._stopping.clear()
        for _ in range(workers):
            thread = threading.Thread(target=self._ask, args=(payload, budget, deadline))
            thread.start()
            self._threads.append(thread)

    def _ask(self, payload: str, budget: Any, deadline: float) -> None:
        while not self._stopping.is_set() and time.monotonic() < deadline:
            with self._changed:
                if next(budget, None) is None:
                    return
                node = self._choose(deadline)
                if node is None:
                    return
                self._sending[node] += 1
            self._send(node, payload)

    def _choose(self, deadline: float) -> str | None:
        """The next node in service (called with ``_changed`` held)."""
        names = list(self.nodes)
        while not self._stopping.is_set() and time.monotonic() < deadline:
            for step in range(len(names)):
                name = names[(self._turn + step) % len(names)]
                if name not in self.drained:
                    self._turn = (self._turn + step + 1) % len(names)
                    return name
            self._changed.wait(0.1)
        return None

    def _send(self, node: str, payload: str) -> None:
        url = self.nodes[node]
        host, _, port = url.removeprefix("http://").partition(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=120)
        sent = time.time()
        status, model = 0, ""
        try:
            try:
                connection.request(
                    "POST", "/v1/completions", payload, {"Content-Type": "application/json"}
                )
            finally:
                with self._changed:
                    self._sending[node] -= 1
                    self._changed.notify_all()
            response = connection.getresponse()
            text = response.read()
            status = response.status
            model = str(json.loads(text).get("model", "")) if status == 200 else ""
        except (OSError, http.client.HTTPException, ValueError):
            status = status or 0
        finally:
            connection.close()
        with self._changed:
            self.answers.append(Answer(node, status, model, sent, time.time()))

    def stop(self) -> list[Answer]:
        """Ends the load (requests in flight finish) and returns every answer."""
        self._stopping.set()
        with self._changed:
            self._changed.notify_all()
        for thread in self._threads:
            thread.join()
        self._threads.clear()
        with self._changed:
            return list(self.answers)

    def wait(self) -> list[Answer]:
        """Waits for the load to use up its requests or its time."""
        for thread in self._threads:
            thread.join()
        return self.stop()

    def close(self) -> None:
        self.stop()
        self._control.shutdown()
        self._control.server_close()


class NodeRouter:
    """One loopback port in front of several nodes' servers: ``/NODE/PATH``
    is forwarded to that node's ``PATH``, so a rollout's
    ``http://127.0.0.1:PORT/{node}/metrics`` reaches each node's own server
    when all of them run on one machine. The answers are the servers' own."""

    def __init__(self, nodes: Mapping[str, str]) -> None:
        routes = dict(nodes)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                self._forward("GET")

            def do_POST(self) -> None:
                self._forward("POST")

            def _forward(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                node, _, rest = self.path.lstrip("/").partition("/")
                status, kind, text = 404, "text/plain", b"no such node"
                if node in routes:
                    status, kind, text = _relay(routes[node], method, "/" + rest, body)
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _relay(base: str, method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
    """One request to ``base``; 502 when it does not answer."""
    host, _, port = base.removeprefix("http://").partition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        headers = {"Content-Type": "application/json"} if body else {}
        connection.request(method, path, body or None, headers)
        answer = connection.getresponse()
        return answer.status, answer.getheader("Content-Type") or "text/plain", answer.read()
    except (OSError, http.client.HTTPException) as exc:
        return 502, "text/plain", str(exc).encode()
    finally:
        connection.close()


def _control_server(balancer: Balancer) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            verb, _, node = self.path.strip("/").partition("/")
            if verb in ("drain", "undrain") and node in balancer.nodes:
                balancer.set_drained(node, verb == "drain")
                self.send_response(200)
            else:
                self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    return server


# A POST with the standard library only, run by a node's drain command.
_POST = """\
import sys, urllib.request
request = urllib.request.Request(sys.argv[1], method="POST")
with urllib.request.urlopen(request, timeout=60) as answer:
    sys.exit(0 if answer.status == 200 else 1)
"""
