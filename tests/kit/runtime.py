"""A stand-in inference runtime on 127.0.0.1: an edge we do not own (vLLM,
Ollama), shaped like one. The tests run the real llama-server
(tests/kit/llama.py); this one stays for what a real server cannot be made
to do (a loaded model answering 500) and for the benches, whose figures
must not depend on a model's speed.

- ``GET /metrics``: Prometheus text with the in-flight gauge
  ``vllm:num_requests_running`` (one series per model, as vLLM labels them);
- ``POST /v1/completions``: answers after ``delay`` seconds with the model
  it serves; refused (503) while loading; a model named in ``broken``
  loads but answers 500. The agent's warm-up asks here;
- ``POST /lb/v1/completions``: the same as the node's load balancer entry,
  which also refuses (503) while the node is drained: client load asks here;
- ``POST /admin/drain``, ``/admin/undrain``, ``/admin/load?model=M``: what
  the agent's node-local commands call (``commands`` writes them as small
  scripts). Loading cuts off the requests in flight, as a restart does.

``failed`` counts the requests a client saw fail: cut off, refused while
loading, or answered 500. Refusals while drained are counted apart
(``refused_drained``): a load balancer sends those elsewhere.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

METRIC = "vllm:num_requests_running"


class StandInRuntime:
    def __init__(
        self,
        model: str = "old",
        *,
        delay: float = 0.0,
        load_seconds: float = 0.0,
        serve: bool = True,
    ) -> None:
        self.model = model
        self.delay = delay
        self.load_seconds = load_seconds
        self.broken: set[str] = set()
        self.drained = False
        self.loading = False
        self.in_flight = 0
        self.generation = 0  # bumped by each load: requests of an older one are cut off
        self.failed = 0
        self.refused_drained = 0
        self.served = 0
        self.events: list[str] = []  # drain, undrain, load M, in order
        self.released = threading.Event()  # ends every generation now (answered)
        # (start, end) of each time the node took no client requests: drained
        # or loading, on ``time.monotonic``; the one under way has no end yet.
        self.out_of_service: list[tuple[float, float]] = []
        self._out_since: float | None = None
        self.lock = threading.Lock()
        self.url = ""
        self.server: _Server | None = None
        if serve:  # else a RuntimeFleet serves it
            self.server = _Server({"": self})
            self.url = self.server.url

    def metrics_text(self) -> str:
        with self.lock:
            running = self.in_flight
            model = self.model
        return (
            f"# HELP {METRIC} Requests running.\n# TYPE {METRIC} gauge\n"
            f'{METRIC}{{model_name="{model}"}} {running}\n'
            f'{METRIC}{{model_name="other"}} 0\n'
        )

    @staticmethod
    def _answer(handler: BaseHTTPRequestHandler, status: int, text: str) -> None:
        body = text.encode()
        handler.send_response(status)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def get(self, handler: BaseHTTPRequestHandler, path: str) -> None:
        if path == "/metrics":
            self._answer(handler, 200, self.metrics_text())
        else:
            self._answer(handler, 404, "no such path")

    def post(self, handler: BaseHTTPRequestHandler, path: str) -> None:
        parts = urlsplit(path)
        if parts.path in ("/v1/completions", "/lb/v1/completions"):
            delay = float(parse_qs(parts.query).get("delay", [self.delay])[0])
            self._complete(handler, delay, through_balancer=parts.path.startswith("/lb/"))
        elif parts.path in ("/admin/drain", "/admin/undrain"):
            with self.lock:
                self.drained = parts.path == "/admin/drain"
                self.events.append(parts.path.removeprefix("/admin/"))
                self._note_service()
            self._answer(handler, 200, "ok")
        elif parts.path == "/admin/load":
            model = parse_qs(parts.query)["model"][0]
            self._load(model)
            self._answer(handler, 200, f"loaded {model}")
        else:
            self._answer(handler, 404, "no such path")

    def _load(self, model: str) -> None:
        with self.lock:
            self.events.append(f"load {model}")
            self.loading = True
            self.generation += 1
            self._note_service()
        time.sleep(self.load_seconds)
        with self.lock:
            self.model = model
            self.loading = False
            self._note_service()

    def _note_service(self) -> None:
        """Called with ``lock`` held after ``drained`` or ``loading`` changed."""
        out, now = self.drained or self.loading, time.monotonic()
        if out and self._out_since is None:
            self._out_since = now
        elif not out and self._out_since is not None:
            self.out_of_service.append((self._out_since, now))
            self._out_since = None

    def _complete(
        self, handler: BaseHTTPRequestHandler, delay: float, *, through_balancer: bool
    ) -> None:
        with self.lock:
            if self.drained and through_balancer:
                self.refused_drained += 1
                refused = "draining"
            elif self.loading:
                self.failed += 1
                refused = "loading"
            else:
                refused = ""
                self.in_flight += 1
                generation = self.generation
        if refused:
            self._answer(handler, 503, refused)
            return
        cut = False
        try:
            deadline = time.monotonic() + delay
            while time.monotonic() < deadline and not self.released.is_set():
                time.sleep(0.01)
                if self.generation != generation:
                    cut = True
                    break
        finally:
            with self.lock:
                self.in_flight -= 1
                broken = self.model in self.broken
                if cut or broken:
                    self.failed += 1
                else:
                    self.served += 1
                model = self.model
        if cut:
            handler.close_connection = True  # cut off mid-answer, as a restart does
            return
        self._answer(handler, 500 if broken else 200, json.dumps({"model": model}))

    def load(self, workers: int = 3, delay: float = 0.05) -> ClientLoad:
        return ClientLoad(self, workers, delay)

    def commands(self, folder: Path) -> dict[str, str]:
        """Shell commands for the agent's options: ``drain``, ``undrain``,
        and ``after_apply`` (loads the model of the config just written)."""
        folder.mkdir(parents=True, exist_ok=True)
        script = folder / "runtime_ctl.py"
        script.write_text(_CTL)
        call = f"{sys.executable} -I -S {script} {self.url}"
        return {
            "drain": f"{call} /admin/drain",
            "undrain": f"{call} /admin/undrain",
            "after_apply": f'{call} "/admin/load?model=$RECONCILER_MODEL"',
        }

    def close(self) -> None:
        if self.server is not None:
            self.server.close()

    def __enter__(self) -> StandInRuntime:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class ClientLoad:
    """Clients asking the node's balancer entry without a pause, until
    ``stop``; ``statuses`` counts their answers (0: cut off)."""

    def __init__(self, runtime: StandInRuntime, workers: int, delay: float) -> None:
        self.url = f"{runtime.url}/lb/v1/completions?delay={delay}"
        self.statuses: dict[int, int] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._ask) for _ in range(workers)]
        for thread in self.threads:
            thread.start()

    def _ask(self) -> None:
        with httpx.Client(timeout=60) as client:
            while not self.stopping.is_set():
                try:
                    status = client.post(self.url).status_code
                except httpx.HTTPError:
                    status = 0
                with self.lock:
                    self.statuses[status] = self.statuses.get(status, 0) + 1

    def stop(self) -> dict[int, int]:
        self.stopping.set()
        for thread in self.threads:
            thread.join()
        return dict(self.statuses)


# A POST with nothing but the socket module: it starts in milliseconds, as a
# node's own drain command would.
_CTL = """\
import socket, sys
from urllib.parse import urlsplit
parts = urlsplit(sys.argv[1] + sys.argv[2])
with socket.create_connection((parts.hostname, parts.port), timeout=60) as s:
    path = parts.path + ("?" + parts.query if parts.query else "")
    s.sendall(f"POST {path} HTTP/1.0\\r\\nHost: x\\r\\nContent-Length: 0\\r\\n\\r\\n".encode())
    answer = b""
    while chunk := s.recv(65536):
        answer += chunk
sys.exit(0 if answer.split(b" ", 2)[1] == b"200" else 1)
"""


class _Server:
    """One loopback HTTP server for runtimes: ``/NAME/...`` goes to the
    runtime of that name (``""``: the only one, at the root)."""

    def __init__(self, runtimes: dict[str, StandInRuntime]) -> None:
        routes = runtimes

        def route(path: str) -> tuple[StandInRuntime, str] | None:
            if "" in routes:
                return routes[""], path
            name, _, rest = path.lstrip("/").partition("/")
            return (routes[name], "/" + rest) if name in routes else None

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                found = route(self.path)
                if found is None:
                    StandInRuntime._answer(self, 404, "no such runtime")
                else:
                    found[0].get(self, found[1])

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                found = route(self.path)
                if found is None:
                    StandInRuntime._answer(self, 404, "no such runtime")
                else:
                    found[0].post(self, found[1])

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class RuntimeFleet:
    """One stand-in runtime per node behind one port: node N's is at
    ``/N/`` (so a rollout's ``http://127.0.0.1:PORT/{node}/metrics`` reaches
    each node's own)."""

    def __init__(self, names: list[str], model: str = "old", **options: Any) -> None:
        self.runtimes = {n: StandInRuntime(model, serve=False, **options) for n in names}
        self.server = _Server(self.runtimes)
        self.url = self.server.url
        for name, runtime in self.runtimes.items():
            runtime.url = f"{self.url}/{name}"

    def close(self) -> None:
        self.server.close()

    def __enter__(self) -> RuntimeFleet:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
