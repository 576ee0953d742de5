"""A model change on three real ``llama-server`` nodes under steady client
load, as Ansible's naive playbook and as our rollout, one after the other
in one run (``bench/peers/ansible.py --model-change``).

Both sides start from the same state: three nodes serving model A (seed
1), model B (seed 2) served by Debian's nginx at a rate that makes a
download take about 2 s, and a client-side balancer sending completions
round robin to the nodes in service (4 clients asking without a pause).

- Ansible: ``serial: 1``, local connection, no facts: ``get_url`` of B
  (with its checksum) into the node's folder, ``copy`` of the config that
  names it, then the restart: the shipped after-apply script
  (``example-repo/deploy/llama-server-after-apply.sh``), which stops the
  node's llama-server and starts it on the new config, waiting until it
  answers. Nothing takes the node out of the balancer.
- Ours: a ``reconciler agent`` per node with that script as its
  ``--after-apply`` and the balancer's drain and undrain as its
  ``--drain-command`` and ``--undrain-command``; the rollout is batches of
  one, staged one download ahead, drained (until the node's
  ``requests_processing`` is 0) and warmed up twice before it is put back.
- Ours with ``--standby`` (the warm standby): each node is an nginx router
  in front of two llama-server slots run by the shipped slot script
  (``example-repo/deploy/llama-server-slot.sh``), the agent started with
  ``--slot-ports``, ``--slot-start-command``, ``--slot-route-command`` and
  ``--slot-stop-command``; the rollout has ``standby: {keepPrevious:
  untilCompleted}`` and no drain: the new model starts in the idle slot,
  is warmed up there, and the router moves to it in one step. A first
  standby rollout, untimed and without load, brings every node's slot a
  up on A. (The rollback from a warm standby is not timed here.)

Figures per side: wall time (Ansible: the playbook; ours: from ``git push``
to the status committed ``completed``), out of service per node, failed
client requests among those sent during the change. Out of service is
measured the same way on both sides, from outside: a probe per node asks
the address the balancer sends that node's requests to for ``/health``
every 50 ms; the node is out while it is drained at the balancer or that
answer is not 200. Ours also reports ``outOfService`` from its status.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
from _common import Row, median, row
from ansible import ansible_env

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the tests package: its kits start the real parts

from reconciler.cli.gguf_models import write_model  # noqa: E402
from reconciler.cli.llama_runtime import Answer, Balancer, LlamaNode, free_port  # noqa: E402
from tests.kit.llama import file_digest, llama_server_binary, node_config  # noqa: E402
from tests.kit.nginx import NginxServer  # noqa: E402

if TYPE_CHECKING:
    from reconciler.daemon.loop import Daemon
    from tests.kit.fleets import RepoKit

T = TypeVar("T")

NODES = ["gpu-1", "gpu-2", "gpu-3"]
CLIENTS = 4
PROBE_SECONDS = 0.05
TIMEOUT = 600.0  # seconds either side may take
STANDBY_NEEDS = (
    "--standby needs the agent's slot flags, the shipped slot script and the "
    "daemon's spec.standby (branches standby-node and standby-daemon)"
)

PLAYBOOK = """\
- hosts: fleet
  gather_facts: false
  serial: 1
  max_fail_percentage: 0
  tasks:
    - name: download the new weights
      get_url:
        url: "{{ artifact_url }}"
        dest: "{{ node_dir }}/model.gguf"
        checksum: "sha256:{{ artifact_sha256 }}"
    - name: point the config at them
      copy: {dest: "{{ config_path }}", content: "{{ config_text }}", backup: yes}
    - name: restart llama-server on the new model
      shell: "{{ restart_command }}"
      environment: {RECONCILER_CONFIG: "{{ config_path }}"}
"""


@dataclass(frozen=True)
class Side:
    """One side's figures."""

    name: str
    wall: float
    out_of_service: dict[str, float]  # per node, seconds
    failed: int  # client requests not answered 200 while the change ran
    requests: int  # client requests sent while the change ran
    recorded: dict[str, float] | None = None  # ours: outOfService in the status


class Probes:
    """A thread per node asking ``/health`` where the balancer sends that
    node's requests, every PROBE_SECONDS; out while drained or not 200."""

    def __init__(self, urls: Mapping[str, str], balancer: Balancer) -> None:
        self.urls = dict(urls)
        self.balancer = balancer
        self.out = dict.fromkeys(self.urls, 0.0)
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(node,), daemon=True) for node in self.urls
        ]

    def __enter__(self) -> Probes:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)

    def _run(self, node: str) -> None:
        with httpx.Client(timeout=2.0) as client:
            last = time.monotonic()
            while not self._stop.is_set():
                serving = node not in self.balancer.drained
                if serving:
                    try:
                        serving = client.get(f"{self.urls[node]}/health").status_code == 200
                    except httpx.HTTPError:
                        serving = False
                now = time.monotonic()
                if not serving:
                    self.out[node] += now - last
                last = now
                self._stop.wait(PROBE_SECONDS)


@contextmanager
def client_load(balancer: Balancer) -> Iterator[Callable[[], list[Answer]]]:
    """Steady load through ``balancer``; yields a call returning the answers
    to requests sent since the load started."""
    since = time.time()
    balancer.start(CLIENTS, max_requests=10**7, max_seconds=TIMEOUT)
    try:
        yield lambda: [a for a in list(balancer.answers) if a.sent >= since]
    finally:
        balancer.stop()


def _under_load(
    name: str, balancer: Balancer, urls: Mapping[str, str], change: Callable[[], T]
) -> tuple[Side, T]:
    """``change`` run and timed under steady load through ``balancer``, the
    nodes at ``urls`` probed meanwhile: side ``name``'s figures, and what
    ``change`` returned."""
    with client_load(balancer) as answered, Probes(urls, balancer) as probes:
        time.sleep(2.0)  # the load runs before the change starts
        start = time.time()
        result = change()
        end = time.time()
        time.sleep(1.0)  # requests sent at the end are answered
        during = [a for a in answered() if start <= a.sent <= end]
    failed = sum(1 for a in during if a.status != 200)
    return Side(name, end - start, dict(probes.out), failed, len(during)), result


def _models(root: Path) -> dict[str, Path]:
    return {
        label: write_model(root / "models" / label / "model.gguf", seed)
        for label, seed in (("A", 1), ("B", 2))
    }


# -- Ansible --------------------------------------------------------------------


def ansible_side(root: Path, models: dict[str, Path], playbook_bin: Path) -> Side:
    """Three llama-servers on A, the naive playbook rolling B."""
    home = root / "ansible"
    binary = llama_server_binary()
    servers = {n: LlamaNode(binary, free_port(), home / "run" / n) for n in NODES}
    initial = home / "initial.yaml"
    initial.parent.mkdir(parents=True, exist_ok=True)
    initial.write_bytes(node_config(models["A"], 1))
    mirror = home / "mirror"
    mirror.mkdir()
    (mirror / "model.gguf").symlink_to(models["B"])
    lines = ["[fleet]"]
    for name, server in servers.items():
        node_dir = home / "nodes" / name
        node_dir.mkdir(parents=True)
        # The node's restart as a script file: the inventory keeps a plain path.
        (node_dir / "restart.sh").write_text(server.after_apply() + "\n")
        lines.append(
            f"{name} ansible_connection=local node_dir={node_dir} "
            f"config_path={node_dir / 'config.yaml'} "
            f"restart_command='bash {node_dir / 'restart.sh'}'"
        )
    (home / "inventory.ini").write_text("\n".join(lines) + "\n")
    (home / "rollout.yml").write_text(PLAYBOOK)
    env = ansible_env(home, playbook_bin)
    size = models["B"].stat().st_size
    balancer = Balancer({n: s.url for n, s in servers.items()})
    try:
        for server in servers.values():
            started = server.start(initial)
            if started.returncode != 0:
                raise RuntimeError(f"llama-server did not start: {started.stderr[-2000:]}")
        with NginxServer(home / "nginx", mirror, rate=size // 2) as nginx:
            downloaded = "{{ node_dir }}/model.gguf"
            extra = {
                "artifact_url": nginx.url("model.gguf"),
                "artifact_sha256": file_digest(models["B"]),
                "config_text": node_config(models["B"], 2)
                .decode()
                .replace(str(models["B"]), downloaded),
            }
            command = [str(playbook_bin), "-i", str(home / "inventory.ini"),
                       "-e", json.dumps(extra), str(home / "rollout.yml")]  # fmt: skip
            side, done = _under_load(
                "Ansible",
                balancer,
                {n: s.url for n, s in servers.items()},
                lambda: subprocess.run(
                    command, env=env, capture_output=True, text=True, check=False, timeout=TIMEOUT
                ),
            )
        if done.returncode != 0:
            raise RuntimeError(f"the playbook failed:\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
        _check_serving(servers, models["B"])
        return side
    finally:
        balancer.close()
        for server in servers.values():
            server.stop()


def _check_serving(servers: Mapping[str, LlamaNode], model: Path) -> None:
    """Every node answers with a file holding ``model``'s bytes."""
    want = file_digest(model)
    for name, server in servers.items():
        answer = httpx.post(
            f"{server.url}/v1/completions",
            json={"prompt": "Hello", "max_tokens": 1, "temperature": 0},
            timeout=60,
        )
        served = Path(answer.json()["model"])
        if file_digest(served) != want:
            raise RuntimeError(f"{name} serves {served}, not the new model")


# -- ours -----------------------------------------------------------------------


def our_side(root: Path, models: dict[str, Path], standby: bool, warmup: bool = True) -> Side:
    """Our rollout of B with drain and warm-up (or, ``standby``, a warm
    standby), under the same load."""
    from tests.kit.llama_fleet import live_rollout, llama_fleet

    home = root / ("standby" if standby else "ours")
    home.mkdir()
    if standby:
        return _standby_side(home, models, warmup)
    with llama_fleet(home, {"A": models["A"], "B": models["B"]}, "B") as world:
        fleet = world.fleet
        daemon = fleet.daemon()
        fleet.run_until(daemon, lambda s: True)  # the first pass: an idle daemon
        text = live_rollout("change", "tiny-llama-2", world, drain=True)
        side = _timed_rollout(
            "ours, drain and warm-up",
            fleet,
            daemon,
            text,
            world.balancer,
            {n: s.url for n, s in world.servers.items()},
        )
        _check_serving(world.servers, models["B"])
        return side


def _roll(fleet: RepoKit, daemon: Daemon, name: str, text: str) -> dict[str, Any]:
    """Rollout ``name`` pushed, the daemon stepped until it ends: its status,
    which must say completed."""
    fleet.push({f"rollouts/{name}.yaml": text})
    ended = ("completed", "paused", "failed", "aborted")
    done = fleet.run_until(
        daemon, lambda s: s.get(name, {}).get("phase") in ended, timeout=TIMEOUT, pause=0.02
    )
    status: dict[str, Any] = done[name]
    if status["phase"] != "completed":
        raise RuntimeError(f"rollout {name} ended {status['phase']}: {status}")
    return status


def _timed_rollout(
    name: str,
    fleet: RepoKit,
    daemon: Daemon,
    text: str,
    balancer: Balancer,
    urls: Mapping[str, str],
) -> Side:
    """Our rollout ``change`` (``text``) under load: side ``name``'s
    figures, with the outOfService its status records."""
    side, status = _under_load(name, balancer, urls, lambda: _roll(fleet, daemon, "change", text))
    recorded = {n["name"]: float(n.get("outOfService", 0)) for n in status["nodes"]}
    return replace(side, recorded=recorded)


def _standby_side(home: Path, models: dict[str, Path], warmup: bool) -> Side:
    """Each node: an nginx router in front of two slots run by the shipped
    slot script, and the agent with the slot flags. A first standby
    rollout (not timed, no load) brings slot a up on A; the timed one
    rolls B into slot b."""
    try:
        from tests.kit.standby import SlotNode  # the node-local parts of a warm standby
    except ImportError:
        raise SystemExit(STANDBY_NEEDS) from None
    from tests.kit.fleets import AgentFleet
    from tests.kit.keys import make_key
    from tests.kit.llama import Models

    key = make_key(home / "slot-keys" / "unused").signing  # SlotNode wants one; unused here
    with ExitStack() as stack:
        parts = {}
        for name in NODES:
            node = SlotNode.create(home / "nodes" / name, Models(home / "models"), key)
            stack.callback(node.close)
            parts[name] = node
        fleet = AgentFleet.create(
            home,
            {
                name: {
                    "config": node_config(models["A"], 1),
                    "labels": {"role": "gpu"},
                    "extra": tuple(node.cli_flags()),
                }
                for name, node in parts.items()
            },
        )
        stack.callback(fleet.close)
        urls = {name: node.router.base_url for name, node in parts.items()}
        balancer = Balancer(urls)
        stack.callback(balancer.close)
        files = parts[NODES[0]]
        daemon = fleet.daemon()
        first = _standby_rollout("first", "tiny-llama-1", files.artifacts["A"], warmup)
        _roll(fleet, daemon, "first", first)
        text = _standby_rollout("change", "tiny-llama-2", files.artifacts["B"], warmup)
        side = _timed_rollout("ours, warm standby", fleet, daemon, text, balancer, urls)
        if any(node.serving() != "B" for node in parts.values()):
            raise RuntimeError("a node does not serve the new model after the standby rollout")
        return side


def _standby_rollout(name: str, model: str, artifact: Any, warmup: bool) -> str:
    """A batch-of-one live rollout with a warm standby, staged one download
    ahead, warmed up twice on the new slot's own port when ``warmup``."""
    from tests.kit.documents import rollout_yaml
    from tests.kit.llama_fleet import WARMUP_BODY

    warm = (
        {
            "warmup": (
                '[{http: {url: "http://127.0.0.1:{slotPort}/v1/completions", method: POST, '
                f'body: "{WARMUP_BODY}", expectStatus: 200, timeout: 30s}}, times: 2}}]'
            )
        }
        if warmup
        else {}
    )
    entry = (
        f"{{name: weights, url: '{artifact.url}', sha256: {artifact.sha256}, "
        f"size: {artifact.size}, path: model.gguf}}"
    )
    return rollout_yaml(
        name,
        target=f"{{runtime: hermes, provider: llama.cpp, model: {model}, profile: default, "
        f"artifacts: [{entry}]}}",
        selector={"role": "gpu"},
        batchSize=1,
        live=True,
        stage="{ahead: 1, maxConcurrent: 1, timeout: 5m}",
        standby="{keepPrevious: untilCompleted}",
        **warm,
    )


# -- both -----------------------------------------------------------------------


def measure_model_change(
    playbook_bin: Path, standby: bool, standby_warmup: bool = True
) -> list[Row]:
    """Ansible's side, then ours (and the standby variant when asked); each
    side printed as soon as it ends."""
    if standby and importlib.util.find_spec("tests.kit.standby") is None:
        raise SystemExit(STANDBY_NEEDS)  # before minutes of the other sides
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-model-change-") as tmp:
        root = Path(tmp)
        models = _models(root)
        theirs = ansible_side(root, models, playbook_bin)
        rows += _report(theirs, theirs)
        rows += _report(our_side(root, models, False), theirs)
        if standby:
            rows += _report(our_side(root, models, True, standby_warmup), theirs)
    return rows


def _report(side: Side, theirs: Side) -> list[Row]:
    out = list(side.out_of_service.values())
    recorded = (
        f"; outOfService in the status {', '.join(f'{v:.2f}' for v in side.recorded.values())} s"
        if side.recorded
        else ""
    )
    print(
        f"{side.name}: wall {side.wall:.1f} s, out of service per node "
        f"{', '.join(f'{v:.2f}' for v in out)} s, failed requests {side.failed} of "
        f"{side.requests}{recorded}; load average "
        f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}",
        flush=True,
    )
    label = f"model change, 3 llama-server nodes, {side.name}"
    return [
        row(f"ansible: {label}, wall", side.wall, "s", theirs.wall, "Ansible"),
        row(f"ansible: {label}, out of service per node, max", max(out), "s"),
        row(f"ansible: {label}, out of service per node, median", median(out), "s"),
        row(f"ansible: {label}, failed client requests", side.failed, "requests"),
        row(f"ansible: {label}, client requests during the change", side.requests, "requests"),
    ]
