"""A fleet for daemon tests: a bare repository pushed to with the `git`
binary, a daemon key, in-process daemons stepping it, and the nodes behind
it: the simulated fleet (``FleetKit``) or one real agent per node
(``AgentFleet``), each a real process on 127.0.0.1.

    kit = FleetKit.create(tmp_path, nodes={"n1": {"role": "web"}})
    kit.push({"rollouts/r.yaml": rollout_yaml("r", selector={"role": "web"})})
    daemon = kit.daemon()
    kit.run_until(daemon, lambda s: s["r"]["phase"] == "completed")

    fleet = AgentFleet.create(tmp_path, {"gpu-a1": {"config": OLD}, "gpu-a2": {...}})

Nothing here is a double: the daemon is the real ``Daemon`` with the real
``AgentClient``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from reconciler.daemon.agent_client import AgentClient
from reconciler.daemon.logs import EventLog
from reconciler.daemon.loop import Daemon
from reconciler.daemon.soft_state import SoftState
from reconciler.git.store import GitStore
from reconciler.protocol.signing import load_private_key
from reconciler.protocol.tls import generate_cert
from reconciler.spec.safe_yaml import YamlProblem, load_yaml
from tests.kit.agents import RealAgent, SimFleet, start_agent, start_sim_fleet
from tests.kit.documents import node_yaml
from tests.kit.git import clone, commit_and_push, git, make_bare_repo
from tests.kit.keys import make_key


@dataclass
class RepoKit:
    """A bare fleet repository pushed to with `git`, a working clone, a
    daemon key, and in-process daemons stepping it."""

    root: Path
    bare: Path
    work: Path
    key_path: Path
    daemons: list[Daemon] = field(default_factory=list, kw_only=True)

    agent_timeout = 2.0  # seconds; the agent client's timeout in daemons made here

    def push(self, files: Mapping[str, str | None], message: str = "Change the fleet") -> str:
        return commit_and_push(self.work, files, message)

    def daemon(self, **kwargs: Any) -> Daemon:
        store = GitStore.open(str(self.bare), "main")
        # Wired as ``reconciler run`` wires it: signatures checked as they arrive.
        soft = kwargs.pop("soft", None) or SoftState()
        client = AgentClient(
            load_private_key(self.key_path),
            timeout=self.agent_timeout,
            on_signed=soft.answers.prepare,
        )
        daemon = Daemon(store, client, log=EventLog(stream=sys.stderr), soft=soft, **kwargs)
        self.daemons.append(daemon)
        return daemon

    def statuses(self) -> dict[str, Any]:
        """Every committed status/NAME.yaml on main, as plain data."""
        names = git("ls-tree", "--name-only", "main", "status/", cwd=self.bare).split()
        found: dict[str, Any] = {}
        for path in names:
            if path.endswith(".yaml") and path != "status/fleet.yaml":
                text = git("show", f"main:{path}", cwd=self.bare)
                try:
                    data = load_yaml(path, text.encode())
                except YamlProblem as exc:
                    data = {"unreadable": str(exc.problem)}
                found[path[len("status/") : -len(".yaml")]] = data
        return found

    def run_until(
        self,
        daemon: Daemon,
        done: Callable[[dict[str, Any]], bool],
        timeout: float = 30.0,
        pause: float = 0.05,
    ) -> dict[str, Any]:
        """Reconcile passes until ``done(statuses)``; fails with the statuses seen."""
        deadline = time.monotonic() + timeout
        while True:
            daemon.run_pass()
            statuses = self.statuses()
            if done(statuses):
                return statuses
            if time.monotonic() > deadline:
                raise AssertionError(f"not reached in {timeout}s; statuses: {statuses}")
            time.sleep(pause)

    def close(self) -> None:
        for daemon in self.daemons:
            daemon.client.close()


@dataclass
class FleetKit(RepoKit):
    """RepoKit with the simulated fleet as every node's agent."""

    fleet: SimFleet

    @classmethod
    def create(
        cls,
        root: Path,
        nodes: Mapping[str, Mapping[str, str]],
        *,
        behaviour: str = "default: succeed\n",
        files: Mapping[str, str] | None = None,
        sim_args: tuple[str, ...] = (),
    ) -> FleetKit:
        key = make_key(root / "keys" / "reconciler")
        fleet = start_sim_fleet(root / "sim", list(nodes), key.public, behaviour, sim_args)
        try:
            seed: dict[str, str] = {
                f"nodes/{n}.yaml": node_yaml(n, fleet.url, labels) for n, labels in nodes.items()
            }
            seed.update(files or {})
            bare = make_bare_repo(root, seed, message="Seed the fleet")
            work = clone(bare, root / "work")
        except BaseException:
            fleet.stop()  # never leave a simulator running behind a failed set-up
            raise
        return cls(root, bare, work, key.private, fleet)

    def close(self) -> None:
        super().close()
        self.fleet.stop()


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
        key = make_key(root / "keys" / "reconciler")
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
                agent = start_agent(home, name, key.public, **options)
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
        return cls(root, bare, work, key.private, agents)

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
    signing = make_key(root / "keys" / "agent")
    named = make_key(root / "keys" / "other") if mode == "other" else signing
    return named.line, (() if mode == "unsigned" else ("--key", str(signing.private)))
