"""The demo: the whole product on one machine, told as a story.

A bare fleet repository seeded from ``example-repo/``, a generated key, the
simulated fleet on 127.0.0.1 and the daemon, each a real process; the story
pushes commits with the ``git`` binary as an operator would, uses the
``reconciler`` verbs an operator would, and shows the status table each time
the daemon commits a change. The repository is left in place to explore.

Must not: reach any address but 127.0.0.1, or touch anything outside the
demo directory.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from reconciler.cli.demo_mirror import EXAMPLE_MIRROR, WEIGHTS_PATH, Mirror, demo_weights
from reconciler.cli.examples import example_dir
from reconciler.git.branch import Branch, open_branch
from reconciler.readers.status_reader import StatusCache, read_snapshot
from reconciler.spec.errors import ReconcilerError
from reconciler.spec.paths import NODES_DIR, SETTINGS_PATH, rollout_path
from reconciler.spec.rollout_status import RolloutStatus
from reconciler.text.status_text import render_table

OPERATOR = {"GIT_AUTHOR_NAME": "Alice Operator", "GIT_AUTHOR_EMAIL": "alice@example.com"}
WAIT = 30.0  # seconds any one chapter may take before the demo gives up

Statuses = Mapping[str, RolloutStatus]


# What the simulated nodes do: succeed after a short delay, except the first
# attempt on gpu-b3, which fails the way a missing model does.
def _first_attempt_fails(delay: float) -> str:
    return (
        f'{{action: succeed, delay: {delay}, attempts: {{"1": {{action: fail, delay: {delay}, '
        'error: "model qwen2.5-14b-instruct is not in the local store"}}}'
    )


class Demo:
    wait = WAIT

    def __init__(self, root: Path, out: TextIO, *, delay: float, interval: float) -> None:
        self.root = root
        self.out = out
        self.delay = delay
        self.interval = interval
        self.bare = root / "fleet.git"
        self.work = root / "fleet"
        self.processes: list[subprocess.Popen[str]] = []
        self.colour = out.isatty() and not os.environ.get("NO_COLOR")
        self.env = {
            **os.environ,
            **OPERATOR,
            "GIT_COMMITTER_NAME": OPERATOR["GIT_AUTHOR_NAME"],
            "GIT_COMMITTER_EMAIL": OPERATOR["GIT_AUTHOR_EMAIL"],
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
        }
        self.scripts: dict[str, str] = {"gpu-b3": _first_attempt_fails(delay)}
        self.file_server = Mirror(root / "files", {WEIGHTS_PATH: demo_weights()})
        self.names: list[str] = []
        self._shown: str | None = None
        self._cache = StatusCache()
        self._branch: Branch | None = None

    # -- the story -------------------------------------------------------

    def run(self) -> None:
        started = time.monotonic()
        self.say(f"reconciler demo in {self.root}")
        self.setup()
        self.dry_run_canary()
        self.paused_live_rollout()
        self.failure_and_resume()
        self.staged_model()
        self.audit_trail(started)

    def dry_run_canary(self) -> None:
        """A dry run on the lab canaries."""
        self.chapter(
            "1. A dry-run canary",
            "Alice commits rollouts/llama-canary.yaml: a dry run on the two lab canaries, "
            "one node per batch. Agents report what they would change and change nothing.",
        )
        self.push_rollout("llama-canary", _example_rollout("llama-canary"))
        self.wait_for("llama-canary completes", lambda s: _phase(s, "llama-canary") == "completed")

    def paused_live_rollout(self) -> None:
        """A live rollout that holds after its canary batch."""
        self.chapter(
            "2. A live rollout that pauses after its canary batch",
            "rollouts/qwen-serving.yaml goes live on the serving nodes, two at a time, with "
            "pauseAfter: [1]. After the first batch the rollout holds for a person. One node "
            "will fail its first attempt (the model is missing); retry_once sends it again "
            "by itself.",
        )
        self.push_rollout("qwen-serving", _without_start_at(_example_rollout("qwen-serving")))
        self.wait_for(
            "qwen-serving holds after batch 1",
            lambda s: _hold(s, "qwen-serving") == "pause_after_batch",
        )
        self.operator("resume", "qwen-serving", "canary batch looks healthy")
        self.wait_for("qwen-serving completes", lambda s: _phase(s, "qwen-serving") == "completed")

    def failure_and_resume(self) -> None:
        """A failure that holds, and a resume that retries it."""
        self.chapter(
            "3. A failure holds the rollout; a resume retries it",
            "rollouts/mistral-b3.yaml sends a model to gpu-b3, whose agent now fails the apply "
            "(the node's disk is full). Under the default policy a failure holds the rollout "
            "and names the node. Alice fixes the node, then resumes: a new attempt.",
        )
        self.set_behaviour(
            "gpu-b3", f'{{action: fail, delay: {self.delay}, error: "no space left on device"}}'
        )
        self.push_rollout("mistral-b3", _mistral_b3())
        self.wait_for(
            "mistral-b3 holds with health_failed",
            lambda s: _hold(s, "mistral-b3") == "health_failed",
        )
        self.show_detail("mistral-b3")
        self.set_behaviour("gpu-b3", f"{{action: succeed, delay: {self.delay}, stage: fetch}}")
        self.operator("resume", "mistral-b3", "freed disk space on gpu-b3")
        self.wait_for("mistral-b3 completes", lambda s: _phase(s, "mistral-b3") == "completed")

    def staged_model(self) -> None:
        """A model file downloaded and checked ahead of its batch."""
        self.chapter(
            "4. A model that brings its own file, staged ahead",
            "rollouts/phi-serving.yaml names the model's weights by URL, size and SHA-256, "
            "served by the demo's own HTTP server on 127.0.0.1. Each simulated agent downloads "
            "the file and checks its size and digest before its batch may switch; batch 2 "
            "downloads while batch 1 switches. After batch 1 the rollout holds: batch 2 "
            "is already staged.",
        )
        self.push_rollout(
            "phi-serving", _served_from(_example_rollout("phi-serving"), self.file_server)
        )
        self.wait_for(
            "phi-serving holds after batch 1",
            lambda s: _hold(s, "phi-serving") == "pause_after_batch",
        )
        self.show_detail("phi-serving")
        self.operator("resume", "phi-serving", "batch 2 holds the weights already")
        self.wait_for("phi-serving completes", lambda s: _phase(s, "phi-serving") == "completed")
        self.say(f"the demo's file server answered {self.file_server.downloads()} GET requests")

    def audit_trail(self, started: float) -> None:
        """The git log of it all, and where to look next."""
        self.chapter("The audit trail", "Every transition is a commit; `git log` is the record.")
        log = self.git_out(
            "--git-dir", str(self.bare), "log", "--format=%h  %<(15,trunc)%an %s", "-n", "30"
        )
        self.say(log)
        elapsed = time.monotonic() - started
        me = _command()
        self.say(
            f"\nDone in {elapsed:.0f}s. The repository stays for you to explore:\n"
            f"  origin (the daemon's): {self.bare}\n"
            f"  working clone:         {self.work}\n\n"
            "Try:\n"
            f"  {me} status --repo {self.bare}\n"
            f"  {me} status phi-serving --repo {self.bare}\n"
            f"  git --git-dir {self.bare} log -p -- status/mistral-b3.yaml\n"
            f"  git --git-dir {self.bare} show main:status/README.md\n"
        )

    # -- set-up ----------------------------------------------------------

    def setup(self) -> None:
        self.file_server.start()
        self.say(f"file server for model files on {self.file_server.url}")
        keys = self.root / "keys"
        self.reconciler("keys", "generate", "--out", str(keys))
        self.names = sorted(p.stem for p in (example_dir() / NODES_DIR).glob("*.yaml"))
        behaviour = self.write_behaviour()
        fleet = self.spawn(
            "sim-fleet",
            "--state-dir", str(self.root / "sim-state"),
            "--trust-key", str(keys / "reconciler.pub"),
            "--behaviour", str(behaviour),
            "--listen", "127.0.0.1:0",
            "--nodes", "0",
            log=None,
            errors=self.root / "sim-fleet.log",
        )  # fmt: skip
        assert fleet.stdout is not None
        line = fleet.stdout.readline()
        if not line.startswith("listening on "):
            fleet.wait(5)
            problem = (self.root / "sim-fleet.log").read_text().strip()
            raise ReconcilerError(f"the simulated fleet did not start: {problem or line.strip()}")
        url = "http://" + line.split()[-1]
        self.say(f"simulated fleet listening on {url}")
        self.seed(url)
        self.spawn(
            "run", "--repo", str(self.bare), "--key", str(keys / "reconciler"),
            "--interval", f"{self.interval}s",
            log=self.root / "daemon.log",
        )  # fmt: skip
        self.say(f"daemon started; its log: {self.root / 'daemon.log'}")

    def seed(self, agent_url: str) -> None:
        """The example fleet's nodes and settings, agents pointed at the
        simulated fleet, pushed as the first commit. Rollouts come later."""
        self.git("init", "--quiet", "--bare", "-b", "main", str(self.bare))
        self.git("clone", "--quiet", str(self.bare), str(self.work))
        self.git("-C", str(self.work), "symbolic-ref", "HEAD", "refs/heads/main")
        example = example_dir()
        for folder in (NODES_DIR,):
            shutil.copytree(example / folder, self.work / folder)
        shutil.copy2(example / SETTINGS_PATH, self.work / SETTINGS_PATH)
        for node in (self.work / NODES_DIR).glob("*.yaml"):
            text = re.sub(r"(?m)^(\s*agent:\s*).*$", rf"\g<1>{agent_url}", node.read_text())
            node.write_text(text)
        self.commit_and_push("Seed the fleet: nodes and settings from example-repo")
        self.say(f"fleet repository: {len(self.names)} nodes in {self.bare}")

    # -- acting as the operator -----------------------------------------

    def push_rollout(self, name: str, text: str) -> None:
        path = self.work / rollout_path(name)
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        self.commit_and_push(f"Roll out {name}")
        self.say(f"$ git commit -m 'Roll out {name}' && git push    (as Alice)")

    def operator(self, verb: str, name: str, message: str) -> None:
        self.git("-C", str(self.work), "pull", "--quiet", "--ff-only")
        self.say(f'$ reconciler {verb} {name} --message "{message}" --commit && git push')
        self.reconciler(verb, name, "--repo", str(self.work), "--message", message, "--commit")
        self.git("-C", str(self.work), "push", "--quiet", "origin", "main")

    def set_behaviour(self, node: str, behaviour: str) -> None:
        """Change one simulated node's script (the simulator re-reads it)."""
        self.scripts[node] = behaviour
        self.write_behaviour()
        time.sleep(0.4)  # the simulator checks its script every 0.25 s

    def write_behaviour(self) -> Path:
        path = self.root / "behaviour.yaml"
        lines = [
            "names: [" + ", ".join(self.names) + "]",
            # stage: fetch: the simulated agents really download and check artifacts.
            f"default: {{action: succeed, delay: {self.delay}, stage: fetch}}",
            "initial: {provider: ollama, model: llama3-8b, profile: default}",
            "nodes:",
            *(f"  {node}: {script}" for node, script in sorted(self.scripts.items())),
        ]
        path.write_text("\n".join(lines) + "\n")
        return path

    def commit_and_push(self, message: str) -> None:
        self.git("-C", str(self.work), "pull", "--quiet", "--ff-only", check=False)
        self.git("-C", str(self.work), "add", "-A")
        self.git("-C", str(self.work), "commit", "--quiet", "-m", message)
        self.git("-C", str(self.work), "push", "--quiet", "origin", "main")

    # -- watching --------------------------------------------------------

    def wait_for(self, what: str, done: Callable[[Statuses], bool]) -> Statuses:
        deadline = time.monotonic() + self.wait
        while True:
            statuses = self.statuses()
            if done(statuses):
                self.say(f"-> {what}")
                return statuses
            if time.monotonic() > deadline:
                tail = (self.root / "daemon.log").read_text().splitlines()[-15:]
                raise ReconcilerError(
                    f"the demo waited {self.wait:.0f}s for: {what}",
                    "the daemon's last log lines:\n    " + "\n    ".join(tail),
                )
            time.sleep(0.1)

    def statuses(self) -> Statuses:
        if self._branch is None:
            self._branch = open_branch(str(self.bare), "main")
        snapshot = read_snapshot(self._branch, self._cache)
        # Redraw when something a person would notice changed, not the ages.
        shown = repr(
            sorted((s.name, s.phase, s.progress, s.hold) for s in snapshot.statuses.values())
        )
        if snapshot.statuses and shown != self._shown:
            self._shown = shown
            table = render_table(snapshot.statuses, datetime.now(UTC), colour=self.colour)
            self.say(_indent(table))
        return snapshot.statuses

    def show_detail(self, name: str) -> None:
        out = self.reconciler_out("status", name, "--repo", str(self.bare))
        self.say(_indent(out))

    # -- processes -------------------------------------------------------

    def spawn(
        self, *args: str, log: Path | None, errors: Path | None = None
    ) -> subprocess.Popen[str]:
        """A reconciler process; its output goes to ``log`` (None: a pipe to
        read), its errors to ``errors`` or, by default, with its output."""
        stdout = subprocess.PIPE if log is None else log.open("w")
        stderr = errors.open("w") if errors is not None else subprocess.STDOUT
        process = subprocess.Popen(
            [sys.executable, "-m", "reconciler", *args],
            stdout=stdout,
            stderr=stderr,
            text=True,
            env=self.env,
        )
        self.processes.append(process)
        return process

    def stop(self) -> None:
        self.file_server.stop()
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()

    def reconciler(self, *args: str) -> None:
        self.reconciler_out(*args)

    def reconciler_out(self, *args: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "reconciler", *args],
            capture_output=True,
            text=True,
            env=self.env,
        )
        if proc.returncode != 0:
            raise ReconcilerError(f"reconciler {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def git(self, *args: str, check: bool = True) -> None:
        proc = subprocess.run(["git", *args], capture_output=True, text=True, env=self.env)
        if check and proc.returncode != 0:
            raise ReconcilerError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")

    def git_out(self, *args: str) -> str:
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, env=self.env, check=True
        ).stdout

    def chapter(self, title: str, text: str) -> None:
        bold = ("\033[1m", "\033[0m") if self.colour else ("", "")
        self.say(f"\n{bold[0]}{title}{bold[1]}\n{_wrap(text)}\n")

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)


def run_demo(
    directory: Path | None = None,
    out: TextIO = sys.stdout,
    *,
    delay: float = 0.4,
    interval: float = 0.3,
) -> Path:
    """Run the story; return the demo directory (left in place)."""
    root = demo_directory(directory, "reconciler-demo-")
    demo = Demo(root, out, delay=delay, interval=interval)
    try:
        demo.run()
    finally:
        demo.stop()
    return root


def demo_directory(directory: Path | None, prefix: str) -> Path:
    """``directory`` (new or empty), or a new temporary one; absolute."""
    root = Path(directory) if directory else Path(tempfile.mkdtemp(prefix=prefix))
    root.mkdir(parents=True, exist_ok=True)
    if any(root.iterdir()):
        raise ReconcilerError(f"{root} is not empty", "give the demo a new or empty directory")
    return root.resolve()


def _command() -> str:
    """How the user can run reconciler again: ``reconciler`` when that is on
    PATH, else the program they ran (``.venv/bin/reconciler`` after make demo)."""
    program = Path(sys.argv[0])
    found = shutil.which("reconciler")
    if found and program.name == "reconciler" and Path(found).resolve() == program.resolve():
        return "reconciler"
    if program.name == "reconciler":
        return os.path.relpath(program) if not program.is_absolute() else str(program)
    return f"{Path(sys.executable).name} -m reconciler" if found is None else "reconciler"


def _example_rollout(name: str) -> str:
    return (example_dir() / rollout_path(name)).read_text()


def _without_start_at(text: str) -> str:
    """The example starts on a fixed date; the demo starts now."""
    return re.sub(r"(?m)^\s*startAt:.*\n", "", text)


def _served_from(text: str, server: Mirror) -> str:
    """The example's artifact URLs, pointed at the demo's own file server."""
    return text.replace(EXAMPLE_MIRROR, server.url)


def _mistral_b3() -> str:
    return (
        "# One node, the default policy: a failure holds the rollout for a person.\n"
        "apiVersion: reconciler/v1\n"
        "kind: Rollout\n"
        "metadata:\n"
        "  name: mistral-b3\n"
        "spec:\n"
        "  target: {runtime: hermes, provider: ollama, model: mistral-7b-instruct}\n"
        "  nodeIds: [gpu-b3]\n"
        "  live: true\n"
        "  healthTimeout: 1m\n"
        '  resumeRequest: ""\n'
    )


def _phase(statuses: Statuses, name: str) -> str | None:
    status = statuses.get(name)
    return status.phase if status else None


def _hold(statuses: Statuses, name: str) -> str | None:
    status = statuses.get(name)
    return status.hold.reason if status and status.hold else None


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.rstrip("\n").splitlines())


def _wrap(text: str, width: int = 78) -> str:
    import textwrap

    return textwrap.fill(text, width)
