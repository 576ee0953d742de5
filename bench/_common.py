"""Shared helpers for the benchmarks: result rows, statistics, generated
fleet repositories, the simulated fleet and the daemon as real processes.

Every bench script prints its figures for people and, for ``bench/all.py``,
one machine-readable line per figure::

    BENCH-ROW {"figure": ..., "value": ..., "unit": ..., "reference": ..., "ratio": ...}

(only with ``BENCH_ROWS=1`` in the environment, which the runner sets).

``ratio`` is value / reference (same unit), so under 1 means under the
target or faster than the reference; None when there is nothing to divide by.

Must not be imported by the package: benches only.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import pygit2
from pygit2.enums import FileMode

ROW_PREFIX = "BENCH-ROW "
ROWS_ENV = "BENCH_ROWS"
AUTHOR = pygit2.Signature("Bench Operator", "bench@example.com", 1_780_000_000, 0)
TARGET_FLOW = "{runtime: hermes, provider: ollama, model: llama3.1-8b, profile: default}"


@dataclass(frozen=True)
class Row:
    figure: str
    value: float
    unit: str
    reference: str = ""  # "target < 1" or "git CLI 35.2": what the value is set against
    ratio: float | None = None  # value / reference value


def row(
    figure: str, value: float, unit: str, reference: float | None = None, label: str = ""
) -> Row:
    """A row; with ``reference`` the ratio is value / reference and the
    reference column reads ``LABEL REFERENCE`` (e.g. ``target < 1``)."""
    if reference is None:
        return Row(figure, value, unit, label)
    text = f"{label} {fmt(reference)}".strip()
    return Row(figure, value, unit, text, value / reference if reference else None)


def fmt(value: float) -> str:
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def emit(rows: Iterable[Row]) -> None:
    """Print rows for people and, when ``bench/all.py`` runs the script
    (``BENCH_ROWS=1`` in the environment), for the runner too."""
    machine_rows = os.environ.get(ROWS_ENV) == "1"
    for r in rows:
        ratio = f"  ({r.ratio:.2f}x)" if r.ratio is not None else ""
        ref = f"  [{r.reference}]" if r.reference else ""
        print(f"  {r.figure}: {fmt(r.value)} {r.unit}{ref}{ratio}", flush=True)
        if machine_rows:
            print(ROW_PREFIX + json.dumps(asdict(r)), flush=True)


def parse_rows(text: str) -> list[Row]:
    return [
        Row(**json.loads(line[len(ROW_PREFIX) :]))
        for line in text.splitlines()
        if line.startswith(ROW_PREFIX)
    ]


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered)) - 1))]


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


# -- processes -------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a live process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds all CPUs of the machine have been busy since boot (Linux
    /proc/stat): the difference over a run, less the CPU of the processes
    measured, is what other work took from it."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def start_daemon(root: Path, bare: Path, key: Path, interval: str) -> subprocess.Popen[bytes]:
    """``reconciler run`` on ``bare`` as a subprocess, logging to root/daemon.log."""
    with open(root / "daemon.log", "wb") as log:  # the child keeps its own copy
        return subprocess.Popen(
            [
                sys.executable, "-m", "reconciler", "run",
                "--repo", str(bare), "--key", str(key), "--interval", interval,
            ],
            stdout=log,
            stderr=log,
        )  # fmt: skip


def peak_rss_mb(pid: int) -> float:
    """VmHWM (peak resident set) of a live process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def load_average() -> float:
    return os.getloadavg()[0]


def machine() -> str:
    model = "?"
    with open("/proc/cpuinfo") as handle:
        for line in handle:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return (
        f"{os.cpu_count()} CPUs ({model}), Python {sys.version.split()[0]}, "
        f"load average {load_average():.1f}"
    )


def git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_AUTHOR_NAME="Bench Operator",
        GIT_AUTHOR_EMAIL="bench@example.com",
        GIT_COMMITTER_NAME="Bench Operator",
        GIT_COMMITTER_EMAIL="bench@example.com",
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        # No background `git gc --auto` racing the temporary directory's removal.
        GIT_CONFIG_COUNT="1",
        GIT_CONFIG_KEY_0="gc.auto",
        GIT_CONFIG_VALUE_0="0",
    )
    return env


def git(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=git_env(), capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr}")
    return done.stdout.strip()


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class SimFleetProcess:
    """``reconciler sim-fleet`` as a subprocess, every node succeeding after
    ``delay`` seconds."""

    def __init__(
        self,
        root: Path,
        names: Sequence[str],
        trust_key: Path,
        delay: float,
        key_seed: str | None = None,
    ) -> None:
        root.mkdir(parents=True, exist_ok=True)
        script = root / "behaviour.yaml"
        # Names via --nodes would force the sim-NNNN pattern; a script lists ours.
        script.write_text(
            "names: [" + ", ".join(names) + f"]\ndefault: {{action: succeed, delay: {delay}}}\n"
        )
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "reconciler", "sim-fleet",
                "--state-dir", str(root / "state"),
                "--trust-key", str(trust_key),
                "--behaviour", str(script),
                "--listen", "127.0.0.1:0",
                *(["--key-seed", key_seed] if key_seed else []),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )  # fmt: skip
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("listening on "):
            self.process.kill()
            raise RuntimeError(f"sim-fleet did not start: {line!r}")
        self.url = "http://" + line.split()[-1].strip()

    def stats(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.url}/v1/sim/stats", timeout=30).json())

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()


# -- generated fleet repositories ------------------------------------------


def node_text(
    name: str, agent: str, labels: Mapping[str, str], agent_key: str | None = None
) -> bytes:
    label_text = ", ".join(f"{k}: {v}" for k, v in labels.items())
    return (
        "apiVersion: reconciler/v1\nkind: Node\n"
        f"metadata: {{name: {name}}}\n"
        f"spec:\n  agent: {agent}\n  labels: {{{label_text}}}\n"
        + (f'  agentKey: "{agent_key}"\n' if agent_key else "")
    ).encode()


def rollout_text(name: str, *, selector: Mapping[str, str], batch: int, **extra: str) -> bytes:
    sel = ", ".join(f"{k}: {v}" for k, v in selector.items())
    lines = [
        "apiVersion: reconciler/v1",
        "kind: Rollout",
        f"metadata: {{name: {name}}}",
        "spec:",
        f"  target: {TARGET_FLOW}",
        f"  selector: {{{sel}}}",
        f"  batchSize: {batch}",
        "  healthTimeout: 5m",
        *(f"  {k}: {v}" for k, v in extra.items()),
    ]
    return ("\n".join(lines) + "\n").encode()


def write_tree(
    repo: pygit2.Repository, base: pygit2.Tree | None, files: Mapping[str, bytes | None]
) -> pygit2.Oid:
    """``base`` with ``files`` (path -> content, None deletes) applied."""
    builder = repo.TreeBuilder(base) if base is not None else repo.TreeBuilder()
    nested: dict[str, dict[str, bytes | None]] = {}
    for path, data in files.items():
        head, sep, rest = path.partition("/")
        if sep:
            nested.setdefault(head, {})[rest] = data
        elif data is None:
            if base is not None and head in base:
                builder.remove(head)
        else:
            builder.insert(head, repo.create_blob(data), FileMode.BLOB)
    for head, sub in nested.items():
        old = base[head] if base is not None and head in base else None
        old_tree = repo[old.id] if old is not None and old.type_str == "tree" else None
        assert old_tree is None or isinstance(old_tree, pygit2.Tree)
        builder.insert(head, write_tree(repo, old_tree, sub), FileMode.TREE)
    return builder.write()


FAST_IMPORT_OVER = 200  # files: more than this go through one pack, not loose objects


def fast_import(
    path: Path, files: Mapping[str, bytes | None], message: str, branch: str = "main"
) -> str:
    """One commit on ``branch`` changing ``files`` via ``git fast-import``:
    one pack instead of a loose object per file (12,000 loose objects cost
    ten seconds of system time on this machine's file system)."""
    ref = f"refs/heads/{branch}"
    parent = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", ref],
        cwd=path,
        env=git_env(),
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    stream = io.BytesIO()
    who = f"{AUTHOR.name} <{AUTHOR.email}> {AUTHOR.time} +0000\n".encode()
    encoded = message.encode()
    stream.write(f"commit {ref}\n".encode() + b"author " + who + b"committer " + who)
    stream.write(f"data {len(encoded)}\n".encode() + encoded + b"\n")
    if parent:
        stream.write(f"from {parent}\n".encode())
    for name, data in files.items():
        if data is None:
            stream.write(f"D {name}\n".encode())
        else:
            stream.write(f"M 100644 inline {name}\ndata {len(data)}\n".encode() + data + b"\n")
    stream.write(b"done\n")
    subprocess.run(
        ["git", "fast-import", "--quiet", "--done"],
        cwd=path,
        env=git_env(),
        input=stream.getvalue(),
        capture_output=True,
        check=True,
    )
    return git("rev-parse", ref, cwd=path)


def commit_files(
    repo: pygit2.Repository, files: Mapping[str, bytes | None], message: str, branch: str = "main"
) -> str:
    """One commit on ``branch`` (created if absent) changing ``files``,
    written straight into the repository (no working tree)."""
    if len(files) > FAST_IMPORT_OVER:
        return fast_import(Path(repo.path), files, message, branch)
    ref = repo.references.get(f"refs/heads/{branch}")
    parent = repo[ref.target] if ref is not None else None
    assert parent is None or isinstance(parent, pygit2.Commit)
    tree = write_tree(repo, parent.tree if parent else None, files)
    parents: list[str | pygit2.Oid] = [parent.id] if parent is not None else []
    oid = repo.create_commit(None, AUTHOR, AUTHOR, message, tree, parents)
    if ref is None:
        repo.references.create(f"refs/heads/{branch}", oid)
    else:
        ref.set_target(oid)
    return str(oid)


def make_bare(path: Path, files: Mapping[str, bytes], message: str = "Seed the fleet") -> str:
    """A bare repository at ``path`` whose main holds ``files``; HEAD -> main."""
    if path.exists():
        shutil.rmtree(path)
    repo = pygit2.init_repository(str(path), bare=True, initial_head="main")
    return commit_files(repo, files, message)  # a pack, when there are many files


def status_data(bare: Path, name: str, branch: str = "main") -> bytes | None:
    """The committed status/NAME.yaml on ``branch``, read without a checkout."""
    repo = pygit2.Repository(str(bare))
    tip = repo.references[f"refs/heads/{branch}"].peel(pygit2.Commit)
    try:
        blob = tip.tree[f"status/{name}.yaml"]
    except KeyError:
        return None
    obj = repo[blob.id]
    assert isinstance(obj, pygit2.Blob)
    return obj.data


def first_parent_count(bare: Path, newer: str, older: str) -> int:
    """Commits on the first-parent line from ``newer`` down to (not including) ``older``."""
    return int(git("rev-list", "--first-parent", "--count", f"{older}..{newer}", cwd=bare))


class BranchMoves:
    """Wakes its waiter when a bare repository's branches may have moved, and
    costs nothing while they do not: inotify (Linux) on ``refs/heads`` and
    on the repository folder (``packed-refs``), where Git and libgit2 rename
    a written lock file into place. A timed run's observer must not take the
    cores from what it times: a stat of the ref files every millisecond took
    6.6 % of a core.

    Open it before the action whose end it waits for: a move made before
    ``wait`` is called is still queued and wakes it at once."""

    _MOVED_TO = 0x80  # IN_MOVED_TO
    _CLOSE_WRITE = 0x08  # IN_CLOSE_WRITE
    _FLAGS = os.O_NONBLOCK | os.O_CLOEXEC  # IN_NONBLOCK | IN_CLOEXEC

    def __init__(self, bare: Path) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._fd = libc.inotify_init1(self._FLAGS)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        for folder in (bare / "refs" / "heads", bare):
            mask = self._MOVED_TO | self._CLOSE_WRITE
            if libc.inotify_add_watch(self._fd, os.fsencode(folder), mask) < 0:
                error = ctypes.get_errno()
                os.close(self._fd)
                raise OSError(error, f"cannot watch {folder}")

    def wait(self, timeout: float) -> None:
        """Until something moved (the events are consumed) or ``timeout`` seconds."""
        if select.select([self._fd], [], [], max(timeout, 0))[0]:
            with contextlib.suppress(BlockingIOError):
                while os.read(self._fd, 65536):
                    pass

    def until(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        """Until ``check()``, asked again each time a branch moved."""
        deadline = time.monotonic() + timeout
        while not check():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(f"{what}: not reached in {timeout:.0f}s")
            self.wait(remaining)

    def close(self) -> None:
        os.close(self._fd)


def announce(title: str) -> None:
    print(f"== {title}  [{machine()}]", flush=True)


def wait_for(check: object, timeout: float, pause: float = 0.02) -> float:
    """Poll ``check()`` until true; the perf_counter time it became true."""
    assert callable(check)
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"not reached in {timeout:.0f}s")
        time.sleep(pause)
    return time.perf_counter()
