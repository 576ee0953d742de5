"""Helpers for the agent, simulated-fleet and agent-client tests: keys made
per test, jobs and envelopes, a plain stdlib HTTP client (independent of the
client under test), and agents / simulated fleets served on 127.0.0.1 port 0,
either in a thread (fast) or as a real subprocess."""

from __future__ import annotations

import asyncio
import http.client
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from reconciler.node.agent import Agent, AgentConfig
from reconciler.node.http_server import Handler, HttpServer
from reconciler.node.simulated_fleet import Script, SimFleet, parse_script
from reconciler.node.state_dir import StateDir
from reconciler.protocol.effects import SendJob
from reconciler.protocol.job_payload import build_payload
from reconciler.protocol.signing import (
    SigningKey,
    canonical_json,
    generate_key,
    load_private_key,
    make_envelope,
)
from reconciler.spec.model import Target

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def new_key(directory: Path) -> tuple[SigningKey, Path]:
    private, public = generate_key(directory)
    return load_private_key(private), public


def job(job_id: str = "apply-0001", **changes: Any) -> SendJob:
    base = SendJob(
        job_id=job_id,
        kind="apply",
        node="node-a",
        rollout="llama",
        attempt=1,
        mode="live",
        target=Target("hermes", "vllm", "llama3.1-8b", "default"),
        source_commit=COMMIT,
    )
    return replace(base, **changes)


def envelope(send: SendJob, key: SigningKey, issued_at: datetime | None = None) -> dict[str, Any]:
    return make_envelope(build_payload(send, issued_at or datetime.now(UTC)), key)


def request(
    base: str, method: str, path: str, body: Any = None, timeout: float = 10
) -> tuple[int, Any]:
    """One HTTP request with the standard library; the answer's JSON (or bytes)."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        data = body if isinstance(body, bytes) or body is None else canonical_json(body)
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method, path, body=data, headers=headers)
        answer = conn.getresponse()
        raw = answer.read()
        try:
            return answer.status, json.loads(raw)
        except ValueError:
            return answer.status, raw
    finally:
        conn.close()


def wait_for(check: Callable[[], Any], timeout: float = 10, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Served:
    """A handler served by ``HttpServer`` on its own event loop thread."""

    def __init__(
        self,
        handler: Handler,
        on_close: Callable[[], None] = lambda: None,
        server_options: dict[str, Any] | None = None,
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = HttpServer(handler, "127.0.0.1", 0, **(server_options or {}))
        self._on_close = on_close
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)
        self.url = f"http://127.0.0.1:{self.server.port}"

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the server's loop (the only thread that may touch its state)."""

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self._on_close()


class AgentThread(Served):
    """A real ``Agent`` on a real port, in this process."""

    def __init__(
        self,
        state_dir: Path,
        trust: Sequence[SigningKey],
        server_options: dict[str, Any] | None = None,
        **config: Any,
    ) -> None:
        self.state = StateDir.open(state_dir)
        settings: dict[str, Any] = {
            "node": "node-a",
            "trusted": {k.key_id: k.trusted() for k in trust},
            "runtimes": frozenset({"hermes"}),
            "allow_live": True,
        }
        settings.update(config)
        self.agent = Agent(AgentConfig(**settings), self.state)
        super().__init__(self.agent.handle, self._shutdown, server_options)
        self.node = settings["node"]

    def _shutdown(self) -> None:
        self.agent.close()
        self.state.close()

    def post(self, body: Any, node: str | None = None) -> tuple[int, Any]:
        return request(self.url, "POST", f"/v1/nodes/{node or self.node}/jobs", body)

    def get(self, what: str, node: str | None = None) -> tuple[int, Any]:
        return request(self.url, "GET", f"/v1/nodes/{node or self.node}/{what}")

    def wait_finished(self, job_id: str) -> dict[str, Any]:
        def finished() -> dict[str, Any] | None:
            status, record = self.get(f"jobs/{job_id}")
            return record if status == 200 and record["state"] in ("succeeded", "failed") else None

        result: dict[str, Any] = wait_for(finished, what=f"job {job_id} to finish")
        return result


class FleetThread(Served):
    """A ``SimFleet`` on a real port, in this process."""

    def __init__(
        self,
        state_dir: Path,
        trust: Sequence[SigningKey],
        names: Sequence[str] = ("node-a", "node-b", "node-c"),
        script: Script | str | None = None,
        clock: Callable[[], datetime] | None = None,
        key_seed: str | None = None,
    ) -> None:
        if isinstance(script, str):
            from reconciler.spec.safe_yaml import load_yaml

            script = parse_script(load_yaml("behaviour.yaml", script.encode()))
        extra = {"clock": clock} if clock else {}
        self.fleet = SimFleet(
            names=list(names),
            trusted={k.key_id: k.trusted() for k in trust},
            state_dir=state_dir,
            runtimes=["hermes"],
            script=script,
            key_seed=key_seed,
            **extra,
        )
        super().__init__(self.fleet.handle, self.fleet.close)

    def set_script(self, text: str) -> None:
        from reconciler.spec.safe_yaml import load_yaml

        script = parse_script(load_yaml("behaviour.yaml", text.encode()))
        self.call(lambda: self.fleet.set_script(script))

    def stats(self) -> dict[str, Any]:
        status, data = request(self.url, "GET", "/v1/sim/stats")
        assert status == 200
        result: dict[str, Any] = data
        return result


def start_process(args: Sequence[str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``python -m reconciler ARGS`` as a subprocess; returns it and its base URL."""
    handle = open(log, "ab")  # noqa: SIM115 - owned by the child
    process = subprocess.Popen(
        [sys.executable, "-m", "reconciler", *args],
        stdout=subprocess.PIPE,
        stderr=handle,
    )
    handle.close()
    assert process.stdout is not None
    line = process.stdout.readline().decode()
    if not line.startswith("listening on "):
        process.kill()
        process.wait()
        raise AssertionError(f"{args[0]} did not start: {line!r}\n{log.read_text()}")
    return process, "http://" + line.split()[-1]
