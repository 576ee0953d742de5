"""The chaos lab: real processes on 127.0.0.1, started, broken and restarted
on purpose.

A ``Lab`` owns everything one scenario needs: a daemon key, a bare fleet
repository and a person's clone of it (driven with the ``git`` binary), the
simulated fleet (``python -m reconciler sim-fleet``) and real node agents
(``python -m reconciler agent``) as subprocesses, and the daemon itself as a
subprocess (``python -m reconciler run --repo BARE --key KEY --interval
0.2s``) that can be SIGKILLed at a named crash point (``RECONCILER_CRASH_AT``,
see ``reconciler.daemon.crashpoints``) and started again without it.

The lab reads what the daemon did only the way an operator can: the
committed status files (``invariants.read_statuses``), the daemon's JSON log,
and the agents' own records (``GET /v1/sim/stats``, the simulator's journal,
the real agent's state directory). Closing the lab stops every process it
started, by its own handle.

Must not: import the daemon or the engine in-process; everything under test
runs in its own process.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pygit2

from tests.kit.git import clone, commit, git, git_env, make_bare_repo
from tests.kit.keys import make_key
from tests.kit.ports import HeldPort

from .invariants import Snapshot, read_statuses

PYTHON = sys.executable
DAEMON_NAME = "reconciler"  # the committer name of the daemon's status commits
START_TIMEOUT = 20.0  # seconds for a process to say it listens


class LabError(AssertionError):
    """The scenario could not go on: a process would not start, or the
    expected state was not reached in time. The message says what was seen."""


def _child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = git_env()
    env.pop("RECONCILER_CRASH_AT", None)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


# -- processes -------------------------------------------------------------


class Process:
    """A subprocess started by the lab, its output in a log file."""

    def __init__(
        self,
        name: str,
        args: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        stdout_pipe: bool = False,
    ) -> None:
        self.name = name
        self.args = list(args)
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in _closed()
        self.popen = subprocess.Popen(
            self.args,
            stdout=subprocess.PIPE if stdout_pipe else self._log,
            stderr=self._log,
            env=_child_env(env),
            start_new_session=True,  # a Ctrl-C of the test run does not reach it twice
        )
        self.started = time.monotonic()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None if still running after ``timeout``."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout``: the exit code."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            if self.wait(timeout) is None:
                self.popen.kill()
                self.popen.wait(5)
        self._closed()
        return int(self.popen.returncode)

    def kill(self) -> None:
        if self.alive():
            self.popen.kill()
            self.popen.wait(5)
        self._closed()

    def _closed(self) -> None:
        if self.popen.stdout is not None:
            self.popen.stdout.close()
        self._log.close()

    def log_text(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def read_listen_line(self) -> str:
        """``HOST:PORT`` from the ``listening on HOST:PORT`` line a server
        prints first on stdout."""
        assert self.popen.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT
        os.set_blocking(self.popen.stdout.fileno(), False)
        buffer = b""
        while time.monotonic() < deadline:
            chunk = self.popen.stdout.read()
            if chunk:
                buffer += chunk
                for line in buffer.decode(errors="replace").splitlines():
                    if line.startswith("listening on "):
                        return line.split()[-1].strip()
            if not self.alive():
                break
            time.sleep(0.02)
        self.kill()
        raise LabError(f"{self.name} did not start: stdout {buffer!r}\n{self.log_text()[-2000:]}")


class SimProcess(Process):
    """``reconciler sim-fleet``: many simulated nodes behind one port."""

    def __init__(self, root: Path, names: Sequence[str], trust_key: Path, behaviour: Any) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.state_dir = root / "state"
        self.behaviour_path = root / "behaviour.yaml"
        self._write_behaviour({"names": list(names), **(behaviour or {})})
        super().__init__(
            "sim-fleet",
            [
                PYTHON, "-m", "reconciler", "sim-fleet",
                "--state-dir", str(self.state_dir),
                "--trust-key", str(trust_key),
                "--behaviour", str(self.behaviour_path),
                "--listen", "127.0.0.1:0",
            ],
            root / "sim.log",
            stdout_pipe=True,
        )  # fmt: skip
        self.names = list(names)
        self.url = "http://" + self.read_listen_line()

    def _write_behaviour(self, data: Mapping[str, Any]) -> None:
        # JSON is YAML; a rename gives the file a new inode, which the
        # simulator's reload check (mtime, size, inode) always notices.
        tmp = self.behaviour_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, self.behaviour_path)

    def set_behaviour(self, behaviour: Mapping[str, Any]) -> None:
        """Replace the script (names kept); returns once the simulator reloaded it."""
        before = self.log_text().count("behaviour reloaded")
        self._write_behaviour({"names": self.names, **behaviour})
        deadline = time.monotonic() + 5
        while self.log_text().count("behaviour reloaded") <= before:
            if time.monotonic() > deadline:
                raise LabError(
                    f"sim-fleet did not reload its behaviour:\n{self.log_text()[-1000:]}"
                )
            time.sleep(0.05)

    def stats(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.url}/v1/sim/stats", timeout=10).json())

    def journal(self) -> list[dict[str, Any]]:
        """Every event of the simulator's journal (accepts and finishes)."""
        path = self.state_dir / "sim-journal.jsonl"
        events: list[dict[str, Any]] = []
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                with contextlib.suppress(ValueError):
                    events.append(json.loads(line))
        return events


class AgentProcess(Process):
    """``reconciler agent``: one real node agent, live applies allowed."""

    def __init__(
        self,
        root: Path,
        node: str,
        trust_key: Path,
        *,
        initial: Mapping[str, str] | None = None,
        allow_live: bool = True,
    ) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.node = node
        self.state_dir = root / "state"
        if initial is not None and not (self.state_dir / "runtimes" / "hermes.yaml").exists():
            config = self.state_dir / "runtimes" / "hermes.yaml"
            config.parent.mkdir(parents=True, exist_ok=True)
            config.write_text("".join(f"{k}: {v}\n" for k, v in initial.items()))
        args = [
            PYTHON, "-m", "reconciler", "agent",
            "--node", node,
            "--state-dir", str(self.state_dir),
            "--trust-key", str(trust_key),
            "--runtime", "hermes",
            "--listen", "127.0.0.1:0",
        ]  # fmt: skip
        if allow_live:
            args.append("--allow-live-apply")
        super().__init__(f"agent {node}", args, root / "agent.log", stdout_pipe=True)
        self.url = "http://" + self.read_listen_line()
        self.port = int(self.url.rsplit(":", 1)[1])

    def config(self) -> str:
        path = self.state_dir / "runtimes" / "hermes.yaml"
        return path.read_text() if path.exists() else ""

    def backups(self) -> list[dict[str, Any]]:
        answer = httpx.get(f"{self.url}/v1/nodes/{self.node}/backups", timeout=10)
        return list(answer.json())

    def job_ids(self) -> list[str]:
        """Every job id this agent ever accepted (its journal, one file each)."""
        return sorted(p.stem for p in (self.state_dir / "jobs").glob("*.json"))

    def job(self, job_id: str) -> dict[str, Any] | None:
        answer = httpx.get(f"{self.url}/v1/nodes/{self.node}/jobs/{job_id}", timeout=10)
        return None if answer.status_code == 404 else dict(answer.json())


class DaemonProcess(Process):
    """``reconciler run``, with its JSON log."""

    def __init__(
        self, log_path: Path, repo: str, key: Path, crash_at: str | None, extra: Sequence[str]
    ) -> None:
        self.crash_at = crash_at
        env = {"RECONCILER_CRASH_AT": crash_at} if crash_at else {}
        super().__init__(
            f"daemon (crash at {crash_at})" if crash_at else "daemon",
            [
                PYTHON, "-m", "reconciler", "run",
                "--repo", repo,
                "--key", str(key),
                "--interval", "0.2s",
                "--poll", "0.5s",
                "--log-format", "json",
                *extra,
            ],
            log_path,
            env=env,
        )  # fmt: skip

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """The log's events (optionally only those named ``name``)."""
        found: list[dict[str, Any]] = []
        for line in self.log_text().splitlines():
            if not line.startswith("{"):
                continue
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if name is None or event.get("event") == name:
                    found.append(event)
        return found

    def wait_started(self) -> None:
        """Until the daemon has logged ``start`` and had a moment to set up
        its branch watcher and signal handlers (both come right after)."""
        deadline = time.monotonic() + START_TIMEOUT
        while self.alive() and not self.events("start") and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.alive() and time.monotonic() - self.started < 2.0:
            time.sleep(0.5)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM once the daemon handles it (a SIGTERM during the imports
        at start-up kills a Python process before any handler exists)."""
        self.wait_started()
        return super().stop(timeout)

    def crashed(self, timeout: float) -> bool:
        """True when the process died of SIGKILL within ``timeout``."""
        return self.wait(timeout) == -signal.SIGKILL


# -- documents -------------------------------------------------------------


def settings_text(offline_after: str = "2s") -> str:
    return f"apiVersion: reconciler/v1\nkind: Settings\nspec:\n  offlineAfter: {offline_after}\n"


# -- the lab ---------------------------------------------------------------


class Lab:
    """One scenario's world. Use as a context manager: every process it
    started is stopped on the way out, whatever happened."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        made = make_key(self.root / "keys" / "reconciler")
        self.key, self.public_key = made.private, made.public
        self.processes: list[Process] = []
        self.held: list[HeldPort] = []
        self.daemons: list[DaemonProcess] = []
        self.bare: Path | None = None
        self.work: Path | None = None
        self._repo: pygit2.Repository | None = None
        self._people = 0

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for process in reversed(self.processes):
            with contextlib.suppress(Exception):
                process.kill() if isinstance(process, DaemonProcess) else process.stop(5)
        for held in self.held:
            held.close()

    def closed_url(self) -> str:
        """``http://127.0.0.1:PORT`` of a port held for the lab's life, where
        nothing listens: connections are refused, and nobody else can take it."""
        held = HeldPort()
        self.held.append(held)
        return held.url

    # -- agents ------------------------------------------------------------

    def sim(self, names: Sequence[str], behaviour: Mapping[str, Any] | None = None) -> SimProcess:
        sim = SimProcess(self.root / "sim", names, self.public_key, behaviour)
        self.processes.append(sim)
        return sim

    def agent(self, node: str, *, initial: Mapping[str, str] | None = None) -> AgentProcess:
        agent = AgentProcess(self.root / "agents" / node, node, self.public_key, initial=initial)
        self.processes.append(agent)
        return agent

    # -- the repository ----------------------------------------------------

    def init_repo(self, files: Mapping[str, str]) -> None:
        """The bare fleet repository with ``files`` in its first commit, and
        a person's clone of it."""
        self.bare = make_bare_repo(self.root, dict(files))
        self.work = clone(self.bare, self.root / "work")
        self._repo = pygit2.Repository(str(self.bare))

    @property
    def repo(self) -> pygit2.Repository:
        assert self._repo is not None, "init_repo first"
        return self._repo

    def person(self, name: str | None = None) -> Path:
        """Another person's fresh clone of the fleet repository."""
        assert self.bare is not None
        self._people += 1
        (self.root / "people").mkdir(exist_ok=True)
        return clone(self.bare, self.root / "people" / (name or f"p{self._people}"))

    def push(
        self, files: Mapping[str, str | bytes | None], message: str, work: Path | None = None
    ) -> str:
        """Commit ``files`` (None deletes) as a person and push, pulling
        (rebase) first and again whenever the push is refused because the
        daemon (or anyone) pushed meanwhile. Returns the pushed commit."""
        work = work or self.work
        assert work is not None
        git("pull", "--quiet", "--rebase", "origin", "main", cwd=work)
        self.commit_local(work, files, message)
        return self.push_committed(work)

    @staticmethod
    def commit_local(work: Path, files: Mapping[str, str | bytes | None], message: str) -> None:
        """Write ``files`` in the clone ``work`` and commit them, not pushed yet."""
        commit(work, files, message)

    @staticmethod
    def push_committed(work: Path) -> str:
        """Push the clone's HEAD to main; when refused, pull with rebase and
        push again. Returns the commit that landed."""
        for _ in range(500):
            pushed = subprocess.run(
                ["git", "push", "--quiet", "origin", "HEAD:main"],
                cwd=work,
                env=git_env(),
                capture_output=True,
                text=True,
            )
            if pushed.returncode == 0:
                return git("rev-parse", "HEAD", cwd=work)
            git("pull", "--quiet", "--rebase", "origin", "main", cwd=work)
        raise LabError(f"could not push from {work}: {pushed.stderr}")

    def force_push(self, commit: str) -> None:
        """A person moves main to ``commit`` with ``git push --force``."""
        assert self.work is not None
        git("fetch", "--quiet", "origin", cwd=self.work)
        git("push", "--quiet", "--force", "origin", f"{commit}:main", cwd=self.work)
        git("reset", "--quiet", "--hard", commit, cwd=self.work)

    def tip(self) -> str | None:
        if self._repo is None:
            return None  # renamed away (remove_repo)
        try:
            ref = self._repo.references.get("refs/heads/main")
        except (pygit2.GitError, OSError):
            return None
        return str(ref.target) if ref is not None else None

    def snapshot(self, commit: str | None = None) -> Snapshot:
        """The status files at ``commit`` (default: the tip of main)."""
        commit = commit or self.tip()
        assert commit is not None
        return read_statuses(self.repo, commit)

    def file_at_tip(self, path: str) -> bytes | None:
        tip = self.tip()
        assert tip is not None
        try:
            entry = self.repo[tip].peel(pygit2.Tree)[path]
        except KeyError:
            return None
        blob = self.repo[entry.id]
        return bytes(blob.data) if isinstance(blob, pygit2.Blob) else None

    # -- the daemon --------------------------------------------------------

    def daemon(
        self, *, crash_at: str | None = None, remote: bool = False, args: Iterable[str] = ()
    ) -> DaemonProcess:
        """Start ``reconciler run`` on the bare repository (as a ``file://``
        remote with ``remote``), SIGKILLed at ``crash_at`` if given."""
        assert self.bare is not None
        extra = list(args)
        repo = str(self.bare)
        if remote:
            repo = self.bare.resolve().as_uri()
            extra += ["--cache-dir", str(self.root / "mirror-cache")]
        daemon = DaemonProcess(
            self.root / f"daemon-{len(self.daemons) + 1}.log", repo, self.key, crash_at, extra
        )
        self.processes.append(daemon)
        self.daemons.append(daemon)
        return daemon

    def daemon_events(self, name: str | None = None) -> list[dict[str, Any]]:
        """Events of every daemon this lab started, in start order."""
        return [e for d in self.daemons for e in d.events(name)]

    # -- waiting -----------------------------------------------------------

    def wait(
        self,
        done: Callable[[Snapshot], bool],
        *,
        what: str,
        timeout: float = 45.0,
        daemon: DaemonProcess | None = None,
    ) -> Snapshot:
        """Poll the committed status until ``done`` holds. Fails early when
        ``daemon`` exits, and with the statuses seen when time runs out."""
        deadline = time.monotonic() + timeout
        seen: Snapshot | None = None
        while True:
            tip = self.tip()
            if tip is not None:
                with contextlib.suppress(pygit2.GitError, KeyError, OSError):
                    seen = self.snapshot(tip)
                    if done(seen):
                        return seen
            if daemon is not None and not daemon.alive():
                raise LabError(
                    f"{what}: the daemon exited ({daemon.popen.returncode}); "
                    f"log tail:\n{daemon.log_text()[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise LabError(f"{what}: not reached in {timeout:.0f}s; {describe(seen)}")
            time.sleep(0.1)

    def unchanged_for(self, seconds: float) -> bool:
        """True when main did not move for ``seconds``."""
        before = self.tip()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.1)
            if self.tip() != before:
                return False
        return True

    def remove_repo(self) -> Path:
        """Rename the bare repository away (the remote becomes unreachable)."""
        assert self.bare is not None
        away = self.bare.with_name(self.bare.name + ".away")
        self._repo = None
        shutil.move(str(self.bare), str(away))
        return away

    def restore_repo(self, away: Path) -> None:
        assert self.bare is not None
        shutil.move(str(away), str(self.bare))
        self._repo = pygit2.Repository(str(self.bare))


def describe(snapshot: Snapshot | None) -> str:
    """Rollout phases and node states, for failure messages."""
    if snapshot is None:
        return "no status read"
    parts = []
    for name, status in sorted(snapshot.statuses.items()):
        hold = f" hold={status.hold.reason}" if status.hold else ""
        reason = f" reason={status.reason}" if status.reason else ""
        nodes = " ".join(f"{n.name}={n.state}/{n.attempt}" for n in status.nodes)
        parts.append(f"{name}: {status.phase}{hold}{reason} [{nodes}]")
    for name, why in sorted(snapshot.broken.items()):
        parts.append(f"{name}: unreadable ({why})")
    return "; ".join(parts) or "no status files"
