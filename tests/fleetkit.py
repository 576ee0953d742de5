"""A real fleet for daemon tests: a bare repository pushed to with the `git`
binary, a generated daemon key, and the simulated fleet as a real process
on 127.0.0.1. Nothing here is a double of our own code.

    kit = FleetKit.create(tmp_path, nodes={"n1": {"role": "web"}})
    kit.push({"rollouts/r.yaml": rollout_yaml("r", selector={"role": "web"})})
    daemon = kit.daemon()
    kit.run_until(daemon, lambda s: s["r"]["phase"] == "completed")
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from reconciler.daemon.agent_client import AgentClient
from reconciler.daemon.logs import EventLog
from reconciler.daemon.loop import Daemon
from reconciler.git.store import GitStore
from reconciler.protocol.signing import generate_key, load_private_key
from reconciler.spec.safe_yaml import YamlProblem, load_yaml
from tests.gitutil import clone, commit_and_push, git, make_bare_repo

TARGET = "{runtime: hermes, provider: ollama, model: llama3.1-8b, profile: default}"


def node_yaml(
    name: str,
    agent: str,
    labels: Mapping[str, str],
    maintenance: bool = False,
    agent_key: str | None = None,
    cert_pin: str | None = None,
) -> str:
    label_text = ", ".join(f"{k}: {v}" for k, v in labels.items())
    return (
        "apiVersion: reconciler/v1\nkind: Node\n"
        f"metadata: {{name: {name}}}\n"
        f"spec:\n  agent: {agent}\n  labels: {{{label_text}}}\n"
        f"  maintenance: {'true' if maintenance else 'false'}\n"
        + (f'  agentKey: "{agent_key}"\n' if agent_key else "")
        + (f'  agentCertSha256: "{cert_pin}"\n' if cert_pin else "")
    )


def rollout_yaml(name: str, **spec: Any) -> str:
    """A rollout document; keyword arguments are spec fields in YAML flow text."""
    lines = [
        "apiVersion: reconciler/v1",
        "kind: Rollout",
        f"metadata: {{name: {name}}}",
        "spec:",
        f"  target: {spec.pop('target', TARGET)}",
    ]
    for key, value in spec.items():
        if isinstance(value, dict):
            text = "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
        elif isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (list, tuple)):
            text = "[" + ", ".join(str(v) for v in value) + "]"
        else:
            text = str(value)
        lines.append(f"  {key}: {text}")
    return "\n".join(lines) + "\n"


@dataclass
class SimFleet:
    process: subprocess.Popen[str]
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
    process = subprocess.Popen(
        [
            sys.executable, "-m", "reconciler", "sim-fleet",
            "--state-dir", str(workdir / "state"),
            "--trust-key", str(trust_key),
            "--behaviour", str(script),
            "--listen", "127.0.0.1:0",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("listening on "):
        process.kill()
        raise AssertionError(
            f"sim-fleet did not start: {line}{process.stderr.read() if process.stderr else ''}"
        )
    return SimFleet(process, "http://" + line.split()[-1].strip(), script)


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
        client = AgentClient(load_private_key(self.key_path), timeout=self.agent_timeout)
        daemon = Daemon(store, client, log=EventLog(stream=sys.stderr), **kwargs)
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
        key_path, _ = generate_key(root / "keys")
        fleet = start_sim_fleet(
            root / "sim", list(nodes), root / "keys" / "reconciler.pub", behaviour, sim_args
        )
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
        return cls(root, bare, work, key_path, fleet)

    def close(self) -> None:
        super().close()
        self.fleet.stop()


def node_states(status: Mapping[str, Any]) -> dict[str, str]:
    return {n["name"]: n["state"] for n in status.get("nodes", [])}
