"""The model demo (``reconciler demo --models``): version 4's story on three
real llama-server nodes on this machine.

Each node is a real ``reconciler agent`` whose ``--after-apply`` is the
shipped llama-server-after-apply.sh, restarting llama.cpp's llama-server
($RECONCILER_LLAMA_SERVER, built by `make llama-server`) on the model each
apply names. Three small GGUF models (written with ``gguf``), each signed
by their producer's key with OpenSSF Model Signing, are served by a local
HTTP mirror; rollouts stage them by digest and check the signature on each
node, drain each node under client load, warm it up, a rollback puts the
first model back, and golden prompts keep a model that answers differently
from ever serving. Each node also has its own nginx in front of two
llama-server slots (the shipped llama-server-slot.sh starts, stops and
routes them): a rollout with a warm standby switches without a drain, and a
rollback routes back to the slot kept warm.

Must not: reach any address but 127.0.0.1, download anything, or touch
anything outside the demo directory.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from reconciler.cli.demo_mirror import Mirror
from reconciler.cli.demo_story import Demo, Statuses, _hold, _indent, _phase, demo_directory
from reconciler.cli.examples import example_dir
from reconciler.cli.gguf_models import write_model
from reconciler.cli.llama_runtime import (
    BINARY_VARIABLE,
    IDLE_METRICS,
    SERVER_ARGS,
    Answer,
    Balancer,
    LlamaNode,
    NodeRouter,
    cache_binary,
    find_binary,
    free_port,
    slot_script,
)
from reconciler.cli.nginx_router import NginxRouter, nginx_or_fail
from reconciler.spec.errors import ReconcilerError
from reconciler.spec.paths import SETTINGS_PATH
from reconciler.spec.times import parse_time

NODES = ("gpu-1", "gpu-2", "gpu-3")
MODELS = {"tiny-a": 1, "tiny-b": 2, "tiny-c": 3}  # model name -> seed of its weights
GOLDEN_PROMPTS = ("The capital of France is", "Once upon a time")
SIGNER = "tiny-release"
LOAD_WORKERS = 4
LOAD_REQUESTS = 20_000  # the client load's bounds
LOAD_SECONDS = 300.0
TERMINAL = ("completed", "aborted", "failed")  # phases a rollout never leaves


class ModelsDemo(Demo):
    wait = 180.0  # a chapter stages, drains and restarts three servers

    def __init__(
        self, root: Path, out: TextIO, binary: Path, nginx: Path, *, interval: float
    ) -> None:
        super().__init__(root, out, delay=0.0, interval=interval)
        self.binary = binary
        self.nginx = nginx
        self.files: dict[str, Path] = {}  # model name -> its file in the mirror
        self.digests: dict[str, str] = {}
        self.signatures: dict[str, Path] = {}  # model name -> its signature in the mirror
        self.servers = {
            n: LlamaNode(binary, free_port(), root / "nodes" / n / "llama-server") for n in NODES
        }
        self.balancer = Balancer({n: s.url for n, s in self.servers.items()})
        self.router = NodeRouter({n: s.url for n, s in self.servers.items()})
        # Slot a on a port of its own; slot b is the port the server above
        # listens on, so the first switch to b restarts that server.
        self.slot_a = {
            n: LlamaNode(binary, free_port(), s.run_dir) for n, s in self.servers.items()
        }
        self.routers: dict[str, NginxRouter] = {}  # node -> its nginx
        self.mirror: Mirror | None = None

    def run(self) -> None:
        self.say(f"reconciler demo --models in {self.root}\nllama-server: {self.binary}")
        self.setup()
        self.chapter(
            "1. A first model, staged by digest",
            "rollouts/tiny-a.yaml names a GGUF file on the mirror with its sha256 and size. "
            "Each agent downloads it into its content-addressed store, checks the digest "
            f"and the producer's signature ({SIGNER}, named in reconciler.yaml), "
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
        self.roll_back_all("tiny-b", "back to tiny-a")
        self.wait_for("every node of tiny-b is rolled back", _rolled_back)
        self.say(_indent(self.serving()))
        self.golden_prompts()
        self.warm_standby()
        self.say(
            f"\nThe repository stays for you to explore: {self.bare}\n"
            f"Each node's agent and llama-server logs: {self.root / 'nodes'}"
        )

    def golden_prompts(self) -> None:
        self.chapter(
            "4. Golden prompts keep a model that answers differently from serving",
            "evals/golden.yaml holds two prompts and the answers tiny-a gives them. "
            "rollouts/tiny-c.yaml names the suite: after warm-up, before the node takes "
            "requests again, its agent asks the prompts. tiny-c has other weights, so gpu-1 "
            "fails its evals, goes back to tiny-a byte for byte and is undrained; the rollout "
            "holds. No client request reached tiny-c.",
        )
        self.push_file("evals/golden.yaml", self.golden_suite())
        self.balancer.start(LOAD_WORKERS, max_requests=LOAD_REQUESTS, max_seconds=LOAD_SECONDS)
        try:
            evals = (
                f"{{evals: [{{name: golden, suite: golden, url: '{self.router.url}/{{node}}'}}]}}"
            )
            self.push_rollout("tiny-c", self.rollout("tiny-c", batch=1, drain=True, health=evals))
            self.wait_for("tiny-c holds: gpu-1 failed its evals", _held_on_evals)
        finally:
            answers = self.balancer.stop()
        self.say(_indent(self.load_report(answers, ("tiny-c",))))
        self.show_detail("tiny-c")
        self.say(_indent(self.serving()))

    def warm_standby(self) -> None:
        self.chapter(
            "5. A warm standby: switch without a cold start, roll back in a second",
            "Alice aborts tiny-c, held since chapter 4. Each node has its own nginx in front of two llama-server slots, run by the "
            "shipped llama-server-slot.sh; slot b's port is the one llama-server has served "
            f"on so far. {LOAD_WORKERS} clients now send completions through the nginx "
            "routers. rollouts/standby-b.yaml asks for standby: {keepPrevious: "
            "untilCompleted}: each agent starts tiny-b in slot a beside the server "
            "that serves, warms it up on the slot's port and routes nginx to it; no drain. "
            "Then rollouts/standby-a.yaml brings tiny-a back in slot b the same way on "
            "a first batch of two nodes and holds after it (pauseAfter: [1]); tiny-b "
            "stays warm in slot a. Alice rolls it back: each agent routes nginx back to "
            "slot a and stops slot b, with no download and no start; gpu-3 was never "
            "changed.",
        )
        # A held rollout keeps its nodes: a later one could not roll them back.
        self.operator("abort", "tiny-c", "tiny-c fails its golden prompts")
        self.wait_for("tiny-c is aborted", lambda s: _phase(s, "tiny-c") == "aborted")
        routers = {n: r.url for n, r in self.routers.items()}
        load = Balancer(routers)
        load.start(LOAD_WORKERS, max_requests=LOAD_REQUESTS, max_seconds=LOAD_SECONDS)
        try:
            self.push_rollout(
                "standby-b", self.rollout("tiny-b", batch=3, drain=False, standby="standby-b")
            )
            self.wait_for("standby-b completes", lambda s: _phase(s, "standby-b") == "completed")
            first_batch = self.rollout("tiny-a", batch=2, drain=False, standby="standby-a")
            self.push_rollout("standby-a", first_batch + "  pauseAfter: [1]\n")
            self.wait_for(
                "standby-a holds after its first batch",
                lambda s: _hold(s, "standby-a") == "pause_after_batch",
            )
            self.say(_indent(self.serving(routers)))
            self.roll_back_to_warm_slots()
        finally:
            answers = load.stop()
            load.close()
        rollouts = ("standby-b", "standby-a")
        self.say(_indent(self.load_report(answers, rollouts, "routed, no drain")))
        self.show_detail("standby-a")
        self.say(_indent(self.serving(routers)))

    def roll_back_all(self, rollout: str, message: str) -> None:
        """Alice's rollback of every node of ``rollout``, committed and pushed."""
        self.git("-C", str(self.work), "pull", "--quiet", "--ff-only")
        self.say(
            f'$ reconciler rollback {rollout} --all --message "{message}" --commit && git push'
        )
        self.reconciler(
            "rollback", rollout, "--all", "--repo", str(self.work),
            "--message", message, "--commit",
        )  # fmt: skip
        self.git("-C", str(self.work), "push", "--quiet", "origin", "main")

    def roll_back_to_warm_slots(self) -> None:
        self.roll_back_all("standby-a", "back to tiny-b")
        rolled = self.wait_for("every node of standby-a is rolled back", _standby_rolled_back)
        self.say(_indent(self.restore_times(rolled)))
        if _phase(self.statuses(), "standby-a") not in TERMINAL:
            self.operator("abort", "standby-a", "rolled back to tiny-b")
        self.wait_for("standby-a ends and its releases are answered", _standby_a_released)

    def restore_times(self, statuses: Statuses) -> str:
        """Each node's restore as its agent recorded it (STATE/jobs/JOB.json):
        from accepted to routed back, on the agent's clock."""
        status = statuses["standby-a"]
        lines = []
        for node in status.nodes:
            if node.restore is None:
                lines.append(f"{node.name}: never changed by standby-a, nothing to restore")
                continue
            jobs = self.root / "nodes" / node.name / "state" / "jobs"
            record = json.loads((jobs / f"{node.restore.job_id}.json").read_text())
            routed = (record.get("timings") or {}).get("routedAt")
            standby = record.get("standby") or {}
            took = (
                f"{(parse_time(routed) - parse_time(record['accepted_at'])).total_seconds():.2f}s"
                if routed
                else "?"
            )
            lines.append(
                f"{node.name}: restore {record['state']}, accepted to routedAt {took}, "
                f"serving slot {standby.get('serving')}, warm: {standby.get('warm')}"
            )
        return "\n".join(lines)

    def golden_suite(self) -> str:
        """A suite of tiny-a's own answers, asked of a node serving it."""
        url = self.servers[NODES[0]].url
        said = []
        for prompt in GOLDEN_PROMPTS:
            body = {"prompt": prompt, "max_tokens": 16, "temperature": 0, "seed": 1}
            answer = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
            answer.raise_for_status()
            said.append(answer.json()["choices"][0]["text"].strip())
        document = {
            "apiVersion": "reconciler/v1",
            "kind": "EvalSuite",
            "metadata": {"name": "golden"},
            "spec": {
                "request": {"maxTokens": 16, "temperature": 0, "seed": 1},
                "cases": [
                    {"name": f"prompt-{i}", "prompt": p, "expect": {"equals": a}}
                    for i, (p, a) in enumerate(zip(GOLDEN_PROMPTS, said, strict=True), 1)
                ],
            },
        }
        return json.dumps(document, indent=2) + "\n"  # JSON is YAML; escapes keep answers exact

    def push_file(self, path: str, text: str) -> None:
        self.git("-C", str(self.work), "pull", "--quiet", "--ff-only")
        (self.work / path).parent.mkdir(parents=True, exist_ok=True)
        (self.work / path).write_text(text)
        self.commit_and_push(f"Add {path}")
        self.say(f"$ git commit -m 'Add {path}' && git push    (as Alice)")

    # -- set-up ----------------------------------------------------------

    def setup(self) -> None:
        keys = self.root / "keys"
        self.reconciler("keys", "generate", "--out", str(keys))
        mirror = self.root / "mirror"
        producer_key = write_producer_key(self.root / "producer" / f"{SIGNER}.pem")
        for name, seed in MODELS.items():
            path = write_model(mirror / name / "model.gguf", seed, name)
            self.files[name] = path
            self.digests[name] = hashlib.sha256(path.read_bytes()).hexdigest()
            self.signatures[name] = sign_model(path.parent, producer_key, mirror / f"{name}.sig")
        self.mirror = Mirror(mirror, {})  # the models are written there already
        self.mirror.start()
        self.say(f"mirror on {self.mirror_url}: " + ", ".join(
            f"{n}/model.gguf ({p.stat().st_size} bytes) and {n}.sig"
            for n, p in self.files.items()
        ))  # fmt: skip
        for name in NODES:
            self.routers[name] = NginxRouter(
                self.nginx, self.root / "nodes" / name / "nginx", self.servers[name].port
            )
        self.say("nginx in front of each node: " + ", ".join(
            f"{n} {r.url}" for n, r in self.routers.items()
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
            *self.slot_flags(name),
            log=None, errors=home / "agent.log",
        )  # fmt: skip
        assert agent.stdout is not None
        line = agent.stdout.readline()
        if not line.startswith("listening on "):
            agent.wait(5)
            problem = (home / "agent.log").read_text().strip()
            raise ReconcilerError(f"the agent of {name} did not start: {problem or line}")
        return "http://" + line.split()[-1]

    def slot_flags(self, name: str) -> list[str]:
        """The agent's slots: llama-server-slot.sh behind the node's nginx.
        Applies without ``standby`` still run the after-apply script."""
        router, server = self.routers[name], self.servers[name]
        settings = {
            "LLAMA_SERVER": str(self.binary),
            "LLAMA_SERVER_RUN_DIR": str(server.run_dir),
            "LLAMA_SERVER_MODE": "pidfile",
            "LLAMA_SERVER_ARGS": SERVER_ARGS,
            "LLAMA_SERVER_READY_TIMEOUT": "60",
            "NGINX_UPSTREAM_FILE": str(router.upstream),
            "NGINX_RELOAD": router.reload_command(),
            "NGINX_PID_FILE": str(router.pid_file),
        }
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in settings.items())
        script = f"{prefix} bash {shlex.quote(str(slot_script()))}"
        return [
            "--slot-ports", f"{self.slot_a[name].port},{server.port}",
            "--slot-start-command", f"{script} start",
            "--slot-route-command", f"{script} route",
            "--slot-stop-command", f"{script} stop",
        ]  # fmt: skip

    def seed_nodes(self, urls: Mapping[str, str]) -> None:
        self.git("init", "--quiet", "--bare", "-b", "main", str(self.bare))
        self.git("clone", "--quiet", str(self.bare), str(self.work))
        self.git("-C", str(self.work), "symbolic-ref", "HEAD", "refs/heads/main")
        shutil.copy2(example_dir() / SETTINGS_PATH, self.work / SETTINGS_PATH)
        with (self.work / SETTINGS_PATH).open("a") as settings:
            settings.write(self.model_signers())
        (self.work / "nodes").mkdir()
        for name, url in urls.items():
            (self.work / "nodes" / f"{name}.yaml").write_text(
                "apiVersion: reconciler/v1\nkind: Node\n"
                f"metadata: {{name: {name}}}\n"
                f"spec: {{agent: '{url}', labels: {{role: llama}}}}\n"
            )
        self.commit_and_push("Seed the fleet: three llama-server nodes")
        self.say(f"fleet repository: {len(urls)} nodes in {self.bare}")

    def model_signers(self) -> str:
        """The settings' ``modelSigners``: the producer's key for every tiny model."""
        public = (self.root / "producer" / f"{SIGNER}.pub").read_text()
        key = "".join(f"        {line}\n" for line in public.strip().splitlines())
        return (
            "\n  # The producer whose signature every node checks before a tiny model serves.\n"
            f"  modelSigners:\n    - name: {SIGNER}\n      publicKey: |\n{key}"
            '      models: ["tiny-*"]\n'
        )

    def rollout(
        self,
        model: str,
        *,
        batch: int,
        drain: bool,
        health: str | None = None,
        standby: str | None = None,
    ) -> str:
        """``standby``: the rollout's name, for a rollout with a warm
        standby (warmed up on the new slot's port)."""
        path, signature = self.files[model], self.signatures[model]
        warmup = f"{self.router.url}/{{node}}" if standby is None else "http://127.0.0.1:{slotPort}"
        lines = [
            "apiVersion: reconciler/v1",
            "kind: Rollout",
            f"metadata: {{name: {standby or model}}}",
            "spec:",
            "  target:",
            f"    {{runtime: hermes, provider: llama.cpp, model: {model}, profile: default,",
            "     artifacts: [{name: weights, path: model.gguf,",
            f"                  url: '{self.mirror_url}/{model}/model.gguf',",
            f"                  sha256: '{self.digests[model]}', size: {path.stat().st_size}}}],",
            f"     signature: {{url: '{self.mirror_url}/{model}.sig',",
            f"                  sha256: '{_sha256(signature)}', size: {signature.stat().st_size}}}}}",
            "  selector: {role: llama}",
            "  live: true",
            f"  batchSize: {batch}",
            "  healthTimeout: 2m",
            "  stage: {ahead: 1, timeout: 2m}",
            "  warmup:",
            f"    - http: {{url: '{warmup}/v1/completions', method: POST,",
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
        if standby is not None:
            lines += ["  standby: {keepPrevious: untilCompleted}"]
        if health is not None:
            lines += ["  onFailure: pause", f"  health: {health}"]
        return "\n".join(lines) + "\n"

    # -- what the nodes serve --------------------------------------------

    def which(self, served: str) -> str:
        """The model name whose bytes the file an answer names holds."""
        try:
            digest = hashlib.sha256(Path(served).read_bytes()).hexdigest()
        except OSError:
            return f"? ({served})"
        return next((n for n, d in self.digests.items() if d == digest), f"? ({served})")

    def serving(self, urls: Mapping[str, str] | None = None) -> str:
        """What each node answers with: its server's port, or ``urls``."""
        probe = Balancer(urls or {n: s.url for n, s in self.servers.items()})
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

    def load_report(
        self,
        answers: list[Answer],
        rollouts: tuple[str, ...] = ("tiny-b",),
        how: str = "drain to serving",
    ) -> str:
        failed = [a for a in answers if a.status != 200]
        models = Counter(self.which(a.model) for a in answers if a.status == 200)
        lines = [
            f"client load: {len(answers)} requests, {len(failed)} failed; "
            + ", ".join(f"{count} answered by {name}" for name, count in sorted(models.items()))
        ]
        statuses = self.statuses()
        for rollout in rollouts:
            status = statuses.get(rollout)
            for node in status.nodes if status else ():
                if node.out_of_service is not None:
                    lines.append(
                        f"{rollout} {node.name}: out of service {node.out_of_service:.2f}s ({how})"
                    )
        return "\n".join(lines)

    def stop(self) -> None:
        self.balancer.close()
        self.router.close()
        if self.mirror is not None:
            self.mirror.stop()
        super().stop()
        for server in (*self.servers.values(), *self.slot_a.values()):
            server.stop()
        for router in self.routers.values():
            router.close()


def _rolled_back(statuses: Statuses) -> bool:
    status = statuses.get("tiny-b")
    return status is not None and all(n.state == "rolled_back" for n in status.nodes)


def _standby_rolled_back(statuses: Statuses) -> bool:
    """Every node standby-a changed is rolled back."""
    status = statuses.get("standby-a")
    return status is not None and all(
        n.state == "rolled_back" for n in status.nodes if n.attempt > 0
    )


def _standby_a_released(statuses: Statuses) -> bool:
    """standby-a ended and every slot it kept warm had its release answered."""
    status = statuses.get("standby-a")
    if status is None or status.phase not in TERMINAL:
        return False
    kept = [n.standby for n in status.nodes if n.standby is not None]
    return all(k.released_at is not None or k.release_error for k in kept)


def _held_on_evals(statuses: Statuses) -> bool:
    status = statuses.get("tiny-c")
    return (
        status is not None
        and status.hold is not None
        and any("eval_failed" in n.error for n in status.nodes)
    )


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_producer_key(private: Path) -> Path:
    """A producer's P-256 key pair (``NAME.pem``, and ``NAME.pub`` beside it)."""
    key = ec.generate_private_key(ec.SECP256R1())
    private.parent.mkdir(parents=True, exist_ok=True)
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    private.with_suffix(".pub").write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private


def sign_model(directory: Path, key: Path, signature: Path) -> Path:
    """As a producer signs a release: the reference library's own command."""
    done = subprocess.run(
        [sys.executable, "-m", "model_signing", "sign", "key", str(directory),
         "--private_key", str(key), "--signature", str(signature)],
        capture_output=True,
        text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise ReconcilerError(f"model_signing could not sign {directory}: {done.stderr.strip()}")
    return signature


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
    nginx = nginx_or_fail()
    root = demo_directory(directory, "reconciler-demo-models-")
    demo = ModelsDemo(root, out, binary, nginx, interval=interval)
    try:
        demo.run()
    finally:
        demo.stop()
    return root
