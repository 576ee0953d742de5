"""Our node side in tests, on 127.0.0.1 ports the servers bind themselves
(port 0) and report, or are handed (``tests.kit.ports``):

- ``start_agent`` / ``RealAgent``: a ``reconciler agent`` process with its
  own state directory;
- ``start_sim_fleet`` / ``SimFleet``: a ``reconciler sim-fleet`` process;
- ``start_process``: any ``python -m reconciler ARGS`` that prints
  ``listening on HOST:PORT`` first;
- ``AgentThread``, ``FleetThread`` (``Served``): a real ``Agent`` or
  ``SimFleet`` served by ``HttpServer`` on its own event loop thread, in
  this process (fast).

    agent = start_agent(tmp_path / "a1", "gpu-a1", trust_key, config=b"provider: ...\\n")
    agent.config_bytes()      # STATE/runtimes/hermes.yaml, byte for byte
    agent.journal()           # every job record the agent keeps, as plain data
    agent.stop()

Nothing here is a double: the agents are the real command or the real
``Agent`` class.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from reconciler.node.agent import Agent, AgentConfig
from reconciler.node.http_server import Handler, HttpServer
from reconciler.node.state_dir import StateDir
from reconciler.protocol.signing import SigningKey
from reconciler.simulation.fleet import Script, parse_script
from reconciler.simulation.fleet import SimFleet as SimulatedFleet
from reconciler.spec.safe_yaml import load_yaml
from tests.kit.http import request
from tests.kit.ports import HeldPort, handed_over
from tests.kit.waiting import wait_for

RUNTIME = "hermes"


def listened_address(line: str) -> str | None:
    """``HOST:PORT`` from a server's first line on stdout: ``listening on
    HOST:PORT``, or with ``--log-format json`` a JSON line naming ``address``."""
    if line.startswith("{"):
        try:
            address = json.loads(line).get("address")
        except ValueError:
            return None
        return address if isinstance(address, str) else None
    return line.split()[-1].strip() if line.startswith("listening on ") else None


def start_process(
    args: Sequence[str], log: Path, held: HeldPort | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """``python -m reconciler ARGS`` (its stderr appended to ``log``), once
    it printed ``listening on HOST:PORT``: the process and its base URL
    (``https://`` with ``--tls-cert``). With ``held``, it is handed that
    port's socket instead of binding one."""
    command = [sys.executable, "-m", "reconciler", *args]
    command, fds = handed_over(command, held) if held is not None else (command, ())
    with open(log, "ab") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, pass_fds=fds)
    assert process.stdout is not None
    line = process.stdout.readline().decode()
    address = listened_address(line)
    if address is None:
        process.kill()
        process.wait()
        raise AssertionError(f"{args[0]} did not start: {line!r}\n{log.read_text()}")
    scheme = "https" if "--tls-cert" in args else "http"
    url = f"{scheme}://" + address
    if held is not None and not url.endswith(f":{held.port}"):
        process.kill()
        process.wait()
        raise AssertionError(f"{args[0]} did not serve the port handed to it: {line!r}")
    return process, url


@dataclass
class RealAgent:
    """One ``reconciler agent`` process and its state directory."""

    node: str
    state: Path
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    runtime: str = RUNTIME
    args: tuple[str, ...] = ()
    held: HeldPort | None = None  # the port it comes back on after a restart

    @property
    def config_path(self) -> Path:
        return self.state / "runtimes" / f"{self.runtime}.yaml"

    def config_bytes(self) -> bytes | None:
        """The runtime's config file as it is on disk, or None if there is none."""
        try:
            return self.config_path.read_bytes()
        except FileNotFoundError:
            return None

    def get(self, what: str) -> Any:
        """``GET /v1/nodes/NODE/WHAT`` (``heartbeat``, ``backups``, ``jobs/ID``) as JSON."""
        answer = httpx.get(f"{self.url}/v1/nodes/{self.node}/{what}", timeout=10)
        answer.raise_for_status()
        return answer.json()

    def backups(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.get("backups")
        return result

    def journal(self) -> list[dict[str, Any]]:
        """Every job record in ``STATE/jobs/``, oldest accepted first."""
        records = [
            json.loads(p.read_bytes())
            for p in (self.state / "jobs").glob("*.json")
            if not p.name.startswith(".")
        ]
        return sorted(records, key=lambda r: (r["accepted_at"], r["job_id"]))

    def jobs_of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.journal() if r["payload"]["kind"] == kind]

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Until no job of this agent is accepted or running."""
        deadline = time.monotonic() + timeout
        while any(r["state"] in ("accepted", "running") for r in self.journal()):
            if time.monotonic() > deadline:
                raise AssertionError(f"agent {self.node} still busy after {timeout}s")
            time.sleep(0.02)

    def restart(self) -> None:
        """Stop and start again on the same state directory and address
        (start it with ``keep_port`` to keep the node file valid)."""
        self.stop()
        if self.held is None:
            raise AssertionError(f"agent {self.node} was started without keep_port")
        self.process, _ = start_process(self.args, self.log, self.held)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        if self.held is not None:
            self.held.refuse()  # down is down: connections refused, not queued

    def close(self) -> None:
        """Stop, and let the port go."""
        self.stop()
        if self.held is not None:
            self.held.close()


def start_agent(
    root: Path,
    node: str,
    trust_key: Path,
    *,
    config: bytes | None = None,
    runtime: str = RUNTIME,
    live: bool = True,
    after_apply: str | None = None,
    retention: int | None = None,
    keep_port: bool = False,
    extra: Sequence[str] = (),
) -> RealAgent:
    """Start ``reconciler agent`` for ``node`` with state under ``root``.

    ``config`` is written to ``STATE/runtimes/RUNTIME.yaml`` first: the
    node's configuration before any rollout. The agent listens on a port
    the OS chooses and prints the address it got as its first line; with
    ``keep_port`` the port is held by the test and handed to the agent
    (socket activation), so ``restart`` brings it back on the same one."""
    state = root / "state"
    (state / "runtimes").mkdir(parents=True, exist_ok=True)
    if config is not None:
        (state / "runtimes" / f"{runtime}.yaml").write_bytes(config)
    args = [
        "agent",
        "--node", node,
        "--state-dir", str(state),
        "--trust-key", str(trust_key),
        "--runtime", runtime,
        "--listen", "127.0.0.1:0",
    ]  # fmt: skip
    if live:
        args.append("--allow-live-apply")
    if after_apply is not None:
        args += ["--after-apply", after_apply]
    if retention is not None:
        args += ["--backup-retention", str(retention)]
    args += list(extra)
    held = HeldPort() if keep_port else None
    log = root / "agent.log"
    try:
        process, url = start_process(args, log, held)
    except BaseException:
        if held is not None:
            held.close()
        raise
    return RealAgent(node, state, url, process, log, runtime, tuple(args), held)


@dataclass
class SimFleet:
    """One ``reconciler sim-fleet`` process and its behaviour file."""

    process: subprocess.Popen[bytes]
    url: str
    behaviour: Path

    def stats(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.url}/v1/sim/stats", timeout=5).json())

    def set_behaviour(self, text: str) -> None:
        self.behaviour.write_text(text)
        time.sleep(0.6)  # the simulator re-reads its script every 0.25 s

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def start_sim_fleet(
    workdir: Path,
    names: list[str],
    trust_key: Path,
    behaviour: str = "default: succeed\n",
    extra: tuple[str, ...] = (),
) -> SimFleet:
    workdir.mkdir(parents=True, exist_ok=True)
    script = workdir / "behaviour.yaml"
    script.write_text("names: [" + ", ".join(names) + "]\n" + behaviour)
    args = [
        "sim-fleet",
        "--state-dir", str(workdir / "state"),
        "--trust-key", str(trust_key),
        "--behaviour", str(script),
        "--listen", "127.0.0.1:0",
        *extra,
    ]  # fmt: skip
    process, url = start_process(args, workdir / "sim.log")
    return SimFleet(process, url, script)


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
            script = parse_script(load_yaml("behaviour.yaml", script.encode()))
        extra = {"clock": clock} if clock else {}
        self.fleet = SimulatedFleet(
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
        script = parse_script(load_yaml("behaviour.yaml", text.encode()))
        self.call(lambda: self.fleet.set_script(script))

    def stats(self) -> dict[str, Any]:
        status, data = request(self.url, "GET", "/v1/sim/stats")
        assert status == 200
        result: dict[str, Any] = data
        return result
