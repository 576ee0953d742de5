"""The model demo (``reconciler demo --models``): version 4's story on three
real llama-server nodes on this machine.

Each node is a real ``reconciler agent`` whose ``--after-apply`` is the
shipped llama-server-after-apply.sh, restarting llama.cpp's llama-server
($RECONCILER_LLAMA_SERVER, built by `make llama-server`) on the model each
apply names. Two small GGUF models (written with ``gguf``) are served by a
local HTTP mirror; rollouts stage them by digest, drain each node under
client load, warm it up, and a rollback puts the first model back.

Must not: reach any address but 127.0.0.1, download anything, or touch
anything outside the demo directory.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from reconciler.cli.demo_mirror import Mirror
from reconciler.cli.demo_story import Demo, Statuses, _indent, _phase, demo_directory
from reconciler.cli.examples import example_dir
from reconciler.cli.gguf_models import write_model
from reconciler.cli.llama_runtime import (
    BINARY_VARIABLE,
    IDLE_METRICS,
    Answer,
    Balancer,
    LlamaNode,
    NodeRouter,
    cache_binary,
    find_binary,
    free_port,
)
from reconciler.spec.errors import ReconcilerError
from reconciler.spec.paths import SETTINGS_PATH

NODES = ("gpu-1", "gpu-2", "gpu-3")
MODELS = {"tiny-a": 1, "tiny-b": 2}  # model name -> seed of its weights
LOAD_WORKERS = 4
LOAD_REQUESTS = 20_000  # the client load's bounds
LOAD_SECONDS = 300.0


class ModelsDemo(Demo):
    wait = 180.0  # a chapter stages, drains and restarts three servers

    def __init__(self, root: Path, out: TextIO, binary: Path, *, interval: float) -> None:
        super().__init__(root, out, delay=0.0, interval=interval)
        self.binary = binary
        self.files: dict[str, Path] = {}  # model name -> its file in the mirror
        self.digests: dict[str, str] = {}
        self.servers = {
            n: LlamaNode(binary, free_port(), root / "nodes" / n / "llama-server") for n in NODES
        }
        self.balancer = Balancer({n: s.url for n, s in self.servers.items()})
        self.router = NodeRouter({n: s.url for n, s in self.servers.items()})
        self.mirror: Mirror | None = None

    def run(self) -> None:
        self.say(f"reconciler demo --models in {self.root}\nllama-server: {self.binary}")
        self.setup()
        self.chapter(
            "1. A first model, staged by digest",
            "rollouts/tiny-a.yaml names a GGUF file on the mirror with its sha256 and size. "
            "Each agent downloads it into its content-addressed store, checks the digest, "
            "writes the runtime config, and llama-server-after-apply.sh starts llama-server "
            "on it; two warm-up completions before the node counts as serving.",
        )
        self.push_rollout("tiny-a", self.rollout("tiny-a", batch=3, drain=False))
        self.wait_for("tiny-a completes", lambda s: _phase(s, "tiny-a") == "completed")
        self.say(_indent(self.serving()))

        self.chapter(
            "2. A new model under client load, one node at a time",
            f"{LOAD_WORKERS} clients send completions through a load balancer. "
            "rollouts/tiny-b.yaml stages the next batch while one is applied; each node is "
            "drained (taken out of the balancer), the agent waits until llama-server has no "
            f"request running ({IDLE_METRICS[0]}), restarts it on the new file, warms it up "
            "and puts it back.",
        )
        self.balancer.start(LOAD_WORKERS, max_requests=LOAD_REQUESTS, max_seconds=LOAD_SECONDS)
        try:
            self.push_rollout("tiny-b", self.rollout("tiny-b", batch=1, drain=True))
            self.wait_for("tiny-b completes", lambda s: _phase(s, "tiny-b") == "completed")
        finally:
            answers = self.balancer.stop()
        self.say(_indent(self.load_report(answers)))
        self.show_detail("tiny-b")
        self.say(_indent(self.serving()))

        self.chapter(
            "3. Rolled back",
            "Alice rolls tiny-b back on every node: each agent restores its previous config "
            "byte for byte and the after-apply script restarts llama-server on tiny-a.",
        )
        self.git("-C", str(self.work), "pull", "--quiet", "--ff-only")
        self.say(
            '$ reconciler rollback tiny-b --all --message "back to tiny-a" --commit && git push'
        )
        self.reconciler(
            "rollback", "tiny-b", "--all", "--repo", str(self.work),
            "--message", "back to tiny-a", "--commit",
        )  # fmt: skip
        self.git("-C", str(self.work), "push", "--quiet", "origin", "main")
        self.wait_for("every node of tiny-b is rolled back", _rolled_back)
        self.say(_indent(self.serving()))
        self.say(
            f"\nThe repository stays for you to explore: {self.bare}\n"
            f"Each node's agent and llama-server logs: {self.root / 'nodes'}"
        )

    # -- set-up ----------------------------------------------------------

    def setup(self) -> None:
        keys = self.root / "keys"
        self.reconciler("keys", "generate", "--out", str(keys))
        mirror = self.root / "mirror"
        for name, seed in MODELS.items():
            path = write_model(mirror / name / "model.gguf", seed, name)
            self.files[name] = path
            self.digests[name] = hashlib.sha256(path.read_bytes()).hexdigest()
        self.mirror = Mirror(mirror, {})  # the models are written there already
        self.mirror.start()
        self.say(f"mirror on {self.mirror_url}: " + ", ".join(
            f"{n}/model.gguf ({p.stat().st_size} bytes)" for n, p in self.files.items()
        ))  # fmt: skip
        urls = {name: self.start_agent(name, keys / "reconciler.pub") for name in NODES}
        self.seed_nodes(urls)
        self.spawn(
            "run", "--repo", str(self.bare), "--key", str(keys / "reconciler"),
            "--interval", f"{self.interval}s",
            log=self.root / "daemon.log",
        )  # fmt: skip
        self.say(f"daemon started; its log: {self.root / 'daemon.log'}")

    @property
    def mirror_url(self) -> str:
        assert self.mirror is not None
        return self.mirror.url

    def start_agent(self, name: str, trust: Path) -> str:
        home = self.root / "nodes" / name
        home.mkdir(parents=True, exist_ok=True)
        commands = self.balancer.commands(name)
        agent = self.spawn(
            "agent", "--node", name, "--state-dir", str(home / "state"),
            "--trust-key", str(trust), "--runtime", "hermes",
            "--listen", "127.0.0.1:0", "--allow-live-apply",
            "--after-apply", self.servers[name].after_apply(),
            "--after-apply-timeout", "90s",
            "--drain-command", commands["drain"],
            "--undrain-command", commands["undrain"],
            log=None, errors=home / "agent.log",
        )  # fmt: skip
        assert agent.stdout is not None
        line = agent.stdout.readline()
        if not line.startswith("listening on "):
            agent.wait(5)
            problem = (home / "agent.log").read_text().strip()
            raise ReconcilerError(f"the agent of {name} did not start: {problem or line}")
        return "http://" + line.split()[-1]

    def seed_nodes(self, urls: Mapping[str, str]) -> None:
        self.git("init", "--quiet", "--bare", "-b", "main", str(self.bare))
        self.git("clone", "--quiet", str(self.bare), str(self.work))
        self.git("-C", str(self.work), "symbolic-ref", "HEAD", "refs/heads/main")
        shutil.copy2(example_dir() / SETTINGS_PATH, self.work / SETTINGS_PATH)
        (self.work / "nodes").mkdir()
        for name, url in urls.items():
            (self.work / "nodes" / f"{name}.yaml").write_text(
                "apiVersion: reconciler/v1\nkind: Node\n"
                f"metadata: {{name: {name}}}\n"
                f"spec: {{agent: '{url}', labels: {{role: llama}}}}\n"
            )
        self.commit_and_push("Seed the fleet: three llama-server nodes")
        self.say(f"fleet repository: {len(urls)} nodes in {self.bare}")

    def rollout(self, model: str, *, batch: int, drain: bool) -> str:
        path = self.files[model]
        lines = [
            "apiVersion: reconciler/v1",
            "kind: Rollout",
            f"metadata: {{name: {model}}}",
            "spec:",
            "  target:",
            f"    {{runtime: hermes, provider: llama.cpp, model: {model}, profile: default,",
            "     artifacts: [{name: weights, path: model.gguf,",
            f"                  url: '{self.mirror_url}/{model}/model.gguf',",
            f"                  sha256: '{self.digests[model]}', size: {path.stat().st_size}}}]}}",
            "  selector: {role: llama}",
            "  live: true",
            f"  batchSize: {batch}",
            "  healthTimeout: 2m",
            "  stage: {ahead: 1, timeout: 2m}",
            "  warmup:",
            f"    - http: {{url: '{self.router.url}/{{node}}/v1/completions', method: POST,",
            '              body: \'{"prompt": "Hello", "max_tokens": 1, "temperature": 0}\',',
            "              expectStatus: 200, timeout: 30s}",
            "      times: 2",
        ]
        if drain:
            lines += [
                "  drain:",
                "    timeout: 1m",
                f"    idle: {{url: '{self.router.url}/{{node}}/metrics',",
                f"           metric: [{', '.join(repr(m) for m in IDLE_METRICS)}], max: 0}}",
            ]
        return "\n".join(lines) + "\n"

    # -- what the nodes serve --------------------------------------------

    def which(self, served: str) -> str:
        """The model name whose bytes the file an answer names holds."""
        try:
            digest = hashlib.sha256(Path(served).read_bytes()).hexdigest()
        except OSError:
            return f"? ({served})"
        return next((n for n, d in self.digests.items() if d == digest), f"? ({served})")

    def serving(self) -> str:
        probe = Balancer({n: s.url for n, s in self.servers.items()})
        try:
            probe.start(1, max_requests=len(NODES), max_seconds=60)
            answers = probe.wait()
        finally:
            probe.close()
        return "\n".join(
            f"{a.node}: answers from {self.which(a.model)} ({a.model})"
            if a.status == 200
            else f"{a.node}: no answer ({a.status})"
            for a in sorted(answers, key=lambda a: a.node)
        )

    def load_report(self, answers: list[Answer]) -> str:
        failed = [a for a in answers if a.status != 200]
        models = Counter(self.which(a.model) for a in answers if a.status == 200)
        lines = [
            f"client load: {len(answers)} requests, {len(failed)} failed; "
            + ", ".join(f"{count} answered by {name}" for name, count in sorted(models.items()))
        ]
        statuses = self.statuses()
        status = statuses.get("tiny-b")
        for node in status.nodes if status else ():
            if node.out_of_service is not None:
                lines.append(
                    f"{node.name}: out of service {node.out_of_service:.2f}s (drain to serving)"
                )
        return "\n".join(lines)

    def stop(self) -> None:
        self.balancer.close()
        self.router.close()
        if self.mirror is not None:
            self.mirror.stop()
        super().stop()
        for server in self.servers.values():
            server.stop()


def _rolled_back(statuses: Statuses) -> bool:
    status = statuses.get("tiny-b")
    return status is not None and all(n.state == "rolled_back" for n in status.nodes)


def llama_server_or_fail() -> Path:
    found = find_binary()
    if found is None:
        raise ReconcilerError(
            f"llama-server not found (${BINARY_VARIABLE}, or {cache_binary()})",
            hint="run `make llama-server` once, or `make demo-models`, which builds it",
        )
    return found


def run_models_demo(
    directory: Path | None = None, out: TextIO = sys.stdout, *, interval: float = 0.3
) -> Path:
    """Run the story; return the demo directory (left in place)."""
    binary = llama_server_or_fail()
    root = demo_directory(directory, "reconciler-demo-models-")
    demo = ModelsDemo(root, out, binary, interval=interval)
    try:
        demo.run()
    finally:
        demo.stop()
    return root
