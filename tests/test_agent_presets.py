"""A preset drain on a real agent, as a rollout file declares it: the
daemon's expansion reaches the agent signed, and a runtime whose metrics
are not switched on ends in a ``drain_timeout`` that names the missing
metrics and says how to switch them on.

A real llama-server started without ``--metrics`` (it answers 501 on
/metrics) gives the first fault. The others use a small loopback metrics
endpoint: a text lacking only one of the two gauges, which no released
llama-server produces, and exact gauge values to sum, which a real server
shows only while requests run."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from reconciler.protocol.signing import SigningKey
from reconciler.spec.documents import parse_file
from tests.kit.agents import AgentThread
from tests.kit.jobs import envelope, job
from tests.kit.keys import make_key
from tests.kit.llama import LlamaServer, Models, llama_server_binary

OLD_CONFIG = b"provider: llama.cpp\nmodel: old\nprofile: default\n"
ROLLOUT = """\
apiVersion: reconciler/v1
kind: Rollout
metadata: {{name: llama}}
spec:
  selector: {{role: canary}}
  target: {{runtime: hermes, provider: llama.cpp, model: tiny}}
  live: true
  drain:
    timeout: 1s
    idle: {{runtime: llama.cpp, port: {port}}}
"""


class MetricsEndpoint:
    """``GET /metrics`` on 127.0.0.1 answering ``status`` with ``text``;
    every POST is recorded in ``posts`` and answered 200."""

    def __init__(self, status: int, text: str) -> None:
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = endpoint.text.encode()
                self.send_response(endpoint.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                endpoint.posts.append(
                    (self.path, self.headers.get("Content-Type"), self.rfile.read(length))
                )
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        self.status, self.text = status, text
        self.posts: list[tuple[str, str | None, bytes]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def key(tmp_path: Path) -> SigningKey:
    return make_key(tmp_path / "keys" / "reconciler").signing


@pytest.fixture
def state(tmp_path: Path) -> Path:
    config = tmp_path / "state" / "runtimes" / "hermes.yaml"
    config.parent.mkdir(parents=True)
    config.write_bytes(OLD_CONFIG)
    return tmp_path / "state"


@pytest.fixture
def endpoint() -> Iterator[MetricsEndpoint]:
    served = MetricsEndpoint(200, "")
    yield served
    served.close()


def _drain_error(state: Path, key: SigningKey, port: int) -> str:
    spec = parse_file("rollouts/llama.yaml", ROLLOUT.format(port=port).encode()).rollout
    assert spec is not None and spec.drain is not None
    agent = AgentThread(state, [key])
    try:
        agent.post(envelope(job("apply-1", drain=spec.drain), key))
        record = agent.wait_finished("apply-1")
    finally:
        agent.close()
    assert record["state"] == "failed"
    assert (state / "runtimes" / "hermes.yaml").read_bytes() == OLD_CONFIG
    return str(record["error"])


def test_a_metric_absent_from_the_text_is_named_with_how_to_switch_it_on(
    state: Path, key: SigningKey, endpoint: MetricsEndpoint
) -> None:
    endpoint.text = (
        "# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 0\n"
        "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.5\n"
    )

    error = _drain_error(state, key, endpoint.port)

    assert error.startswith("drain_timeout: not idle within 1s (")
    assert (
        f"llamacpp:requests_processing absent from http://127.0.0.1:{endpoint.port}/metrics: "
        "start llama-server with --metrics"
    ) in error


def test_an_endpoint_that_refuses_metrics_names_both_and_how_to_switch_them_on(
    state: Path, key: SigningKey, endpoint: MetricsEndpoint
) -> None:
    endpoint.status, endpoint.text = 501, '{"error": "This server does not support metrics"}'

    error = _drain_error(state, key, endpoint.port)

    assert (
        f"GET http://127.0.0.1:{endpoint.port}/metrics answered 501, so "
        "llamacpp:requests_processing, llamacpp:requests_deferred could not be read: "
        "start llama-server with --metrics"
    ) in error


@pytest.mark.slow
def test_a_real_llama_server_without_metrics_is_a_drain_timeout_naming_the_metric(
    tmp_path: Path, state: Path, key: SigningKey, models: Models
) -> None:
    server = LlamaServer(llama_server_binary(), models.model(1), tmp_path / "llama.log", "-c 256")
    with server:
        error = _drain_error(state, key, server.port)

    assert error.startswith("drain_timeout: not idle within 1s (")
    assert (
        f"GET http://127.0.0.1:{server.port}/metrics answered 501, so "
        "llamacpp:requests_processing, llamacpp:requests_deferred could not be read: "
        "start llama-server with --metrics"
    ) in error


def test_the_preset_metrics_are_summed_and_idle_lets_the_switch_through(
    state: Path, key: SigningKey, endpoint: MetricsEndpoint
) -> None:
    endpoint.text = (
        "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 0\n"
        "# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 0\n"
    )
    spec = parse_file("rollouts/llama.yaml", ROLLOUT.format(port=endpoint.port).encode()).rollout
    assert spec is not None
    agent = AgentThread(state, [key])
    try:
        agent.post(envelope(job("apply-1", drain=spec.drain), key))
        record = agent.wait_finished("apply-1")
    finally:
        agent.close()

    assert record["state"] == "succeeded", record
    assert record["timings"]["drainedAt"] is not None


def test_one_busy_preset_metric_keeps_the_node_draining(
    state: Path, key: SigningKey, endpoint: MetricsEndpoint
) -> None:
    endpoint.text = (
        "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 0\n"
        "# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 2\n"
    )

    error = _drain_error(state, key, endpoint.port)

    assert "llamacpp:requests_processing + llamacpp:requests_deferred was 2, more than 0" in error


def test_the_preset_warm_up_posts_json_one_token_at_temperature_zero(
    state: Path, key: SigningKey, endpoint: MetricsEndpoint
) -> None:
    text = ROLLOUT.format(port=endpoint.port) + (
        f"  warmup: [{{runtime: llama.cpp, port: {endpoint.port}, times: 2}}]\n"
    )
    spec = parse_file("rollouts/llama.yaml", text.encode()).rollout
    assert spec is not None
    endpoint.text = "llamacpp:requests_processing 0\nllamacpp:requests_deferred 0\n"
    agent = AgentThread(state, [key])
    try:
        agent.post(envelope(job("apply-1", drain=spec.drain, warmup=spec.warmup), key))
        record = agent.wait_finished("apply-1")
    finally:
        agent.close()

    assert record["state"] == "succeeded", record
    body = b'{"prompt": "Hello", "max_tokens": 1, "temperature": 0}'
    assert endpoint.posts == [("/v1/completions", "application/json", body)] * 2
