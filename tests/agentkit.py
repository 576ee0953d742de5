"""Real node agents for end-to-end tests: ``reconciler agent`` processes on
127.0.0.1 (port chosen by the OS), each with its own state directory, and a
fleet repository whose node files point at them.

    agent = start_agent(tmp_path / "a1", "gpu-a1", trust_key, config=b"provider: ...\\n")
    agent.config_bytes()      # STATE/runtimes/hermes.yaml, byte for byte
    agent.journal()           # every job record the agent keeps, as plain data
    agent.backups()           # GET /v1/nodes/NODE/backups
    agent.stop()

    fleet = AgentFleet.create(tmp_path, {"gpu-a1": {"config": OLD}, "gpu-a2": {...}})
    fleet.push({"rollouts/r.yaml": rollout_yaml("r", nodeIds=[...], live=True)})
    daemon = fleet.daemon()
    fleet.run_until(daemon, lambda s: s["r"]["phase"] == "completed")

Nothing here is a double: the agents are the real command, the repository is
a bare repository pushed to with the `git` binary, the daemon is the real
``Daemon`` with the real ``AgentClient``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from reconciler.daemon.loop import Daemon
from reconciler.protocol.signing import generate_key
from reconciler.protocol.tls import generate_cert
from tests.fleetkit import RepoKit, node_yaml
from tests.gitutil import clone, git, make_bare_repo
from tests.kit.ports import HeldPort, handed_over

RUNTIME = "hermes"


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
        self.process = _launch(self.node, self.args, self.log, self.held).process

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
        sys.executable, "-m", "reconciler", "agent",
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
    return _launch(node, tuple(args), root / "agent.log", HeldPort() if keep_port else None)


def _launch(node: str, args: tuple[str, ...], log: Path, held: HeldPort | None) -> RealAgent:
    command, fds = handed_over(list(args), held) if held is not None else (list(args), ())
    with open(log, "ab") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, pass_fds=fds)
    assert process.stdout is not None
    line = process.stdout.readline().decode()
    if not line.startswith("listening on "):
        process.kill()
        process.wait()
        raise AssertionError(f"agent {node} did not start: {line!r}\n{log.read_text()}")
    state = Path(args[args.index("--state-dir") + 1])
    runtime = args[args.index("--runtime") + 1]
    scheme = "https" if "--tls-cert" in args else "http"
    url = f"{scheme}://" + line.split()[-1]
    if held is not None and url.rsplit(":", 1)[1] != str(held.port):
        process.kill()
        process.wait()
        raise AssertionError(f"agent {node} did not serve on the port handed to it: {line!r}")
    return RealAgent(node, state, url, process, log, runtime, args, held)


class Clock:
    """The daemon's clock: real time plus an offset a test can move forward
    (deadlines pass without waiting). Agents check a job's ``issuedAt`` is
    at most 2 minutes ahead of their own clock, so keep the offset below that."""

    def __init__(self) -> None:
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return (datetime.now(UTC) + self.offset).replace(microsecond=0)

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)


@dataclass
class AgentFleet(RepoKit):
    """RepoKit with one real agent per node (``nodes/NODE.yaml`` points at
    it) and a clock the test can move."""

    agents: dict[str, RealAgent]
    clock: Clock = field(default_factory=Clock)

    agent_timeout = 5.0

    @classmethod
    def create(
        cls,
        root: Path,
        nodes: Mapping[str, Mapping[str, Any]],
        *,
        files: Mapping[str, str] | None = None,
    ) -> AgentFleet:
        """``nodes``: name -> keyword arguments of ``start_agent`` (``config``,
        ``after_apply``, ...) plus optional ``labels`` and ``agent_key``:
        ``"own"`` (the agent signs with ``--key``, its node file carries the
        matching ``agentKey``), ``"other"`` (it signs with one key, the node
        file names another) or ``"unsigned"`` (the node file has a key, the
        agent runs without ``--key``), and ``tls`` (see ``_agent_tls``)."""
        key_path, public = generate_key(root / "keys")
        agents: dict[str, RealAgent] = {}
        seed: dict[str, str] = {}
        try:
            for name, options in nodes.items():
                options = dict(options)
                labels = options.pop("labels", {"role": "gpu"})
                home = root / "agents" / name
                agent_key, extra = _agent_keys(home, options.pop("agent_key", None))
                pin, tls_extra = _agent_tls(home, name, options.pop("tls", None))
                options["extra"] = (*options.get("extra", ()), *extra, *tls_extra)
                agent = start_agent(home, name, public, **options)
                agents[name] = agent
                url = agent.url.replace("http://", "https://") if pin else agent.url
                seed[f"nodes/{name}.yaml"] = node_yaml(
                    name, url, labels, agent_key=agent_key, cert_pin=pin
                )
        except BaseException:
            for agent in agents.values():
                agent.close()
            raise
        seed.update(files or {})
        bare = make_bare_repo(root, seed, message="Seed the fleet")
        work = clone(bare, root / "work")
        return cls(root, bare, work, key_path, agents)

    def pull(self) -> None:
        git("pull", "--quiet", "--rebase", "origin", "main", cwd=self.work)

    def git_push(self) -> None:
        """Push what is committed in the working clone (after pulling the daemon's commits)."""
        self.pull()
        git("push", "--quiet", "origin", "HEAD:main", cwd=self.work)

    def daemon(self, **kwargs: Any) -> Daemon:
        kwargs.setdefault("clock", self.clock)
        return super().daemon(**kwargs)

    def close(self) -> None:
        super().close()
        for agent in self.agents.values():
            agent.close()


def _agent_tls(root: Path, node: str, mode: str | None) -> tuple[str | None, tuple[str, ...]]:
    """(the node file's agentCertSha256, the agent's extra arguments) for
    ``mode``: ``"pinned"`` (HTTPS with the pinned certificate), ``"other"``
    (HTTPS, the node file pins another certificate) or ``"downgrade"`` (the
    node file says https:// with a pin, the agent serves plain HTTP)."""
    if mode is None:
        return None, ()
    crt, key, pin = generate_cert(root / "tls", node)
    if mode == "other":
        _, _, pin = generate_cert(root / "tls-other", node)
    if mode == "downgrade":
        return pin, ()
    return pin, ("--tls-cert", str(crt), "--tls-key", str(key))


def _agent_keys(root: Path, mode: str | None) -> tuple[str | None, tuple[str, ...]]:
    """(the node file's agentKey line, the agent's extra arguments) for ``mode``."""
    if mode is None:
        return None, ()
    signing, signing_pub = generate_key(root / "keys", "agent")
    named_pub = signing_pub
    if mode == "other":
        _, named_pub = generate_key(root / "keys", "other")
    line = named_pub.read_text().strip()
    return line, (() if mode == "unsigned" else ("--key", str(signing)))


def node_map(status: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A status's node records by name."""
    return {n["name"]: n for n in status.get("nodes", [])}


def rollback_outcomes(record: Mapping[str, Any]) -> dict[str, str]:
    """``{node: outcome}`` of one rollback record of a status."""
    return {n["name"]: n["outcome"] for n in record.get("nodes", [])}


__all__ = [
    "AgentFleet",
    "Clock",
    "RealAgent",
    "node_map",
    "rollback_outcomes",
    "start_agent",
]
