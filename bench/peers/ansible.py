"""The same rollout as an Ansible playbook and as a reconciler rollout,
alternating in one run; prints each side's wall time and CPU and the ratio.

    .venv/bin/python bench/peers/ansible.py [--nodes 100] [--runs 5] [--quick]

The work, both sides: N nodes, batches of 10, each node's config file
written with a backup of the old one, a health probe after each apply that
reads the file back (and fails on node 15 in the fault row), stop at the
first failure.

Ansible: ``ansible-core`` (installed into a venv under the temporary
directory when ``ansible-playbook`` is not on PATH; ``$ANSIBLE_VENV`` names
one to reuse), an inventory of N hosts with local connection, a playbook
with ``gather_facts: false``, ``serial: 10``, ``max_fail_percentage: 0``:
``copy`` with ``backup: yes``, ``slurp`` the file back, ``assert`` its
content (and, for the fault row, the node's health). ``--forks 10`` so each
batch of 10 runs at once, as ours does (Ansible's default is 5).

Ours: N real ``reconciler agent`` processes (live applies, unsigned answers)
whose ``--after-apply`` probe reads the config back and checks the model,
and the daemon as a real process with default flags (``reconciler run
--repo BARE --key KEY``). A rollout is a ``git push`` of its file into the
bare repository, once the daemon has made its first fleet sweep (a
minute after its start, as in any daemon that has been running); timed
from the push to its status committed ``completed``
(or ``paused`` at the failure), the observer asleep until the branch moves
(inotify: it takes no CPU from the two cores while it waits). CPU: the
daemon's and the agents' own, with their probes' (children's) CPU, over the
row.

Rows: a rollout at N; a failure at node 15 (time until each side stops: the
playbook fails, the rollout is held). The fault rollout is aborted after
each run so the next run's rollout may take its nodes (not timed).

The machine is shared: read the spread (min to max over the runs), not only
the median.

``--first-run`` times only the rollout right after the agents start, the
case the rows above leave out (their first run is one of five): each run
starts new agents and a new daemon, waits for its first fleet sweep, and
times the first rollout (each agent's first job) and a second one, after an
Ansible run of the same rollout. ``--other-tree DIR`` (a source tree, e.g.
a ``git worktree add`` of an older version; repeatable) alternates its
agents and daemon with this tree's, each against Ansible. Each rollout
also prints the daemon's CPU apart from the agents', and its batches'
medians from the agents' own job records.

``--model-change`` (with ``--standby``: a warm standby too) runs the model
change on three real llama-server nodes instead: bench/peers/model_change.py.

``--artifacts`` runs the model-artifact scenario instead, once each side
(``--quick``: 6 nodes, 32 MiB): N nodes, each with a stand-in inference
runtime (tests/kit/runtime.py, a model load of 0.1 s), one artifact of
``--size-mib`` served by Debian's nginx at a rate that makes a download take
``--download-seconds``, batches of 5. Ansible: the naive rolling playbook,
``serial: 5``, each node taken out of the balancer, ``get_url`` (with the
checksum), the config, a restart on the new model, a warm-up request, back
into the balancer. Ours: real agents with ``--drain-command`` and
``--undrain-command``, the rollout staged ahead (``stage: {ahead: 1}``),
drained and warmed up. Out of service per node is what each runtime saw
(drained or loading), the same measure for both sides.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import venv
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import (
    BranchMoves,
    Row,
    SimFleetProcess,
    announce,
    emit,
    git,
    git_env,
    load_average,
    make_bare,
    median,
    node_text,
    row,
    status_data,
)

from reconciler.protocol.signing import generate_key
from reconciler.spec.safe_yaml import load_yaml
from reconciler.spec.times import parse_time

BATCH = 10
FAULT_NODE = 15
SIM_APPLY = 0.02  # seconds a simulated live apply takes (a real agent's here: 15-60 ms)
BASE = "provider: ollama\nmodel: base-model\nprofile: default\n"
PLAYBOOK = """\
- hosts: fleet
  gather_facts: false
  serial: 10
  max_fail_percentage: 0
  tasks:
    - name: write the config, keeping a backup
      copy:
        dest: "{{ config_path }}"
        content: "{{ config_text }}"
        backup: yes
    - name: read it back
      slurp:
        src: "{{ config_path }}"
      register: written
    - name: health probe
      assert:
        that:
          - (written.content | b64decode) == config_text
          - healthy | default(true) | bool
"""


def config_text(model: str) -> str:
    return f"provider: ollama\nmodel: {model}\nprofile: default\n"


def settle_disk() -> None:
    """Before either side is timed: write out what the other left unwritten.
    Ansible's files are not fsynced, and on ext4 (data=ordered) our first
    fsync would otherwise write them out too, inside our timing."""
    os.sync()


def wait_for_first_sweep(bare: Path) -> None:
    """Until the daemon's first fleet sweep is committed (``status/fleet.yaml``,
    one ``fleetCheck.interval`` after its start: a minute by default). The
    rows time a daemon in the state it runs in: its sweeps have read every
    agent's heartbeat over the keep-alive connections its jobs then use.
    Timed before that, the first run alone also paid for a new connection
    to each agent and for each agent's first request."""
    print("waiting for the daemon's first fleet sweep (a minute after its start)", flush=True)
    deadline = time.monotonic() + 180
    while status_data(bare, "fleet") is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no fleet sweep committed in {bare} within 3 minutes")
        time.sleep(0.1)


def _children_cpu() -> float:
    times = os.times()
    return times.children_user + times.children_system


def _process_cpu(pid: int) -> float:
    """User + system CPU of a live process and of its reaped children (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


# -- Ansible ------------------------------------------------------------------


def ansible_bin(root: Path) -> Path:
    found = shutil.which("ansible-playbook")
    if found:
        return Path(found)
    home = Path(os.environ.get("ANSIBLE_VENV", root / "ansible-venv"))
    playbook = home / "bin" / "ansible-playbook"
    if not playbook.exists():
        print(f"installing ansible-core into {home} ...", flush=True)
        venv.create(home, with_pip=True)
        subprocess.run(
            [str(home / "bin" / "pip"), "install", "--quiet", "ansible-core"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return playbook


def ansible_env(home: Path, playbook_bin: Path) -> dict[str, str]:
    """The environment ``playbook_bin`` runs in: Ansible's own files under
    ``home``, no colours or retry files, modules run by the Python beside it."""
    python = playbook_bin.parent / "python"
    return {
        **os.environ,
        "ANSIBLE_HOME": str(home / "home"),
        "ANSIBLE_LOCAL_TEMP": str(home / "tmp"),
        "ANSIBLE_REMOTE_TMP": str(home / "tmp"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
        "ANSIBLE_PYTHON_INTERPRETER": str(python if python.exists() else sys.executable),
    }


class AnsibleSide:
    def __init__(self, root: Path, names: list[str]) -> None:
        self.root = root / "ansible"
        self.names = names
        self.playbook_bin = ansible_bin(root)
        for name in names:
            (self.root / "nodes" / name).mkdir(parents=True, exist_ok=True)
            (self.root / "nodes" / name / "hermes.yaml").write_text(BASE)
        (self.root / "rollout.yml").write_text(PLAYBOOK)
        self.env = ansible_env(self.root, self.playbook_bin)

    def run(self, model: str, fault: bool, hosts: int | None = None) -> tuple[float, float, bool]:
        """(wall seconds, CPU seconds, succeeded), on the first ``hosts`` nodes (all: None)."""
        lines = ["[fleet]"]
        for k, name in enumerate(self.names[:hosts], start=1):
            path = self.root / "nodes" / name / "hermes.yaml"
            extra = " healthy=false" if fault and k == FAULT_NODE else ""
            lines.append(f"{name} ansible_connection=local config_path={path}{extra}")
        inventory = self.root / "inventory.ini"
        inventory.write_text("\n".join(lines) + "\n")
        command = [
            str(self.playbook_bin),
            "-i", str(inventory),
            "--forks", str(BATCH),
            "-e", json.dumps({"config_text": config_text(model)}),
            str(self.root / "rollout.yml"),
        ]  # fmt: skip
        settle_disk()
        cpu = _children_cpu()
        start = time.perf_counter()
        done = subprocess.run(command, env=self.env, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
        if not fault and done.returncode != 0:
            raise RuntimeError(f"the playbook failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        return wall, _children_cpu() - cpu, done.returncode == 0


# -- ours ---------------------------------------------------------------------

PHASE = re.compile(rb"^phase: (\w+)$", re.MULTILINE)


class OurSide:
    def __init__(self, root: Path, names: list[str], tree: str | None = None) -> None:
        """``tree``: a source tree whose agents and daemon run (default: this one)."""
        self.root = root / "ours"
        self.names = names
        env = {**os.environ, "PYTHONPATH": tree} if tree else None
        # `python -m` puts its working directory first on sys.path: run
        # another tree's processes from outside this one, or they run this one's.
        cwd = self.root if tree else None
        self.key, public = generate_key(self.root / "keys")
        self.agents: list[subprocess.Popen[bytes]] = []
        self.daemon: subprocess.Popen[bytes] | None = None
        self.moves: BranchMoves | None = None
        try:
            for name in names:
                home = self.root / "agents" / name
                (home / "state" / "runtimes").mkdir(parents=True)
                (home / "state" / "runtimes" / "hermes.yaml").write_text(BASE)
                # Read back: an apply's file holds the target (and the node is
                # not broken); a restore's no longer holds the target it undoes.
                # Shell builtins only: the probe is one process, not a shell and a grep.
                probe = (
                    "found=; while IFS= read -r line; do"
                    ' [ "$line" = "model: $RECONCILER_MODEL" ] && found=1;'
                    ' done < "$RECONCILER_CONFIG";'
                    ' if [ "$RECONCILER_KIND" = restore ]; then [ -z "$found" ];'
                    f' else [ -n "$found" ] && [ ! -e "{self.root}/agents/$RECONCILER_NODE/BROKEN" ]; fi'
                )
                self.agents.append(
                    subprocess.Popen(
                        [
                            sys.executable, "-m", "reconciler", "agent",
                            "--node", name,
                            "--state-dir", str(home / "state"),
                            "--trust-key", str(public),
                            "--runtime", "hermes",
                            "--allow-live-apply",
                            "--after-apply", probe,
                            "--listen", "127.0.0.1:0",
                        ],
                        stdout=subprocess.PIPE,
                        stderr=open(home / "agent.log", "wb"),  # noqa: SIM115 (the child's)
                        env=env,
                        cwd=cwd,
                    )
                )  # fmt: skip
            urls = listening_urls(names, self.agents)
            self.bare = self.root / "fleet.git"
            make_bare(
                self.bare,
                {f"nodes/{n}.yaml": node_text(n, urls[n], {"role": "gpu"}) for n in names},
            )
            self.moves = BranchMoves(self.bare)
            self.work = self.root / "work"
            git("clone", "-q", str(self.bare), str(self.work), cwd=self.root)
            with open(self.root / "daemon.log", "wb") as log:
                self.daemon = subprocess.Popen(
                    [
                        sys.executable, "-m", "reconciler", "run",
                        "--repo", str(self.bare), "--key", str(self.key),
                    ],
                    stdout=log,
                    stderr=log,
                    env=env,
                    cwd=cwd,
                )  # fmt: skip
            self._wait(lambda: git("ls-tree", "main", "status/", cwd=self.bare) != "", 120)
            wait_for_first_sweep(self.bare)
        except BaseException:
            self.close()
            raise

    def _wait(self, check: Callable[[], bool], timeout: float) -> None:
        """Until ``check()``, asked again only when the branch moved."""
        assert self.moves is not None
        self.moves.until(check, timeout, f"see {self.root}/daemon.log")

    def _phase(self, name: str) -> str:
        found = PHASE.search(status_data(self.bare, name) or b"")
        return found.group(1).decode() if found else ""

    def _push(self, files: dict[str, str], message: str) -> float:
        """Commit ``files`` and push them; the ``perf_counter`` at the start of
        the push that went through (writing the commit is not the rollout's)."""
        git("pull", "-q", "--rebase", "origin", "main", cwd=self.work)
        for path, text in files.items():
            target = self.work / path
            target.parent.mkdir(exist_ok=True)
            target.write_text(text)
        git("add", "-A", cwd=self.work)
        git("commit", "-q", "-m", message, cwd=self.work)
        for _ in range(20):  # the daemon commits statuses meanwhile: rebase and try again
            start = time.perf_counter()
            pushed = subprocess.run(
                ["git", "push", "-q", "origin", "main"],
                cwd=self.work,
                env=git_env(),
                capture_output=True,
                check=False,
            )
            if pushed.returncode == 0:
                return start
            git("pull", "-q", "--rebase", "origin", "main", cwd=self.work)
        raise RuntimeError("could not push the rollout")

    def _cpu(self) -> float:
        pids = [a.pid for a in self.agents] + ([self.daemon.pid] if self.daemon else [])
        return sum(_process_cpu(pid) for pid in pids)

    def daemon_cpu(self) -> float:
        return _process_cpu(self.daemon.pid) if self.daemon else 0.0

    def batches(self, rollout: str) -> BatchTimes:
        """Where ``rollout``'s batches went, from the agents' own job records
        (accepted and finished times, microseconds; each node's one job)."""
        jobs = []
        for record in self.root.glob("agents/*/state/jobs/*.json"):
            data = json.loads(record.read_text())
            if data["payload"]["rollout"] == rollout:
                jobs.append((parse_time(data["accepted_at"]), parse_time(data["finished_at"])))
        return batch_times(sorted(jobs))

    @staticmethod
    def rollout_text(name: str, model: str, *intents: str) -> str:
        return (
            "apiVersion: reconciler/v1\nkind: Rollout\n"
            f"metadata: {{name: {name}}}\n"
            "spec:\n"
            f"  target: {{runtime: hermes, provider: ollama, model: {model}, profile: default}}\n"
            "  selector: {role: gpu}\n"
            f"  batchSize: {BATCH}\n"
            "  live: true\n"
            "  onFailure: pause\n" + "".join(f"  {line}\n" for line in intents)
        )

    def _timed_push(
        self, name: str, text: str, message: str, done: Callable[[], bool]
    ) -> tuple[float, float]:
        """Push ``text`` as the rollout's file; (wall seconds, CPU seconds)
        from the push until ``done``."""
        settle_disk()
        time.sleep(0.2)  # the daemon is idle, waiting on its watcher
        cpu = self._cpu()
        start = self._push({f"rollouts/{name}.yaml": text}, message)
        self._wait(done, 300)
        return time.perf_counter() - start, self._cpu() - cpu

    def rollout(
        self, name: str, model: str, fault: bool, keep: bool = False
    ) -> tuple[float, float, str]:
        """(wall seconds, CPU seconds, the phase it stopped in). A fault
        rollout is aborted afterwards (not timed) unless ``keep``."""
        if fault:
            self.broken.write_text("the probe fails here\n")
        text = self.rollout_text(name, model)
        stops = ("paused", "failed", "completed") if fault else ("completed", "failed", "paused")
        wall, used = self._timed_push(
            name, text, f"Roll out {model}", lambda: self._phase(name) in stops
        )
        phase = self._phase(name)
        if fault and not keep:
            self.broken.unlink()
            self.abort(name, model)
        elif not fault and phase != "completed":
            raise RuntimeError(f"rollout {name} ended {phase}; see {self.root}/daemon.log")
        return wall, used, phase

    @property
    def broken(self) -> Path:
        return self.root / "agents" / self.names[FAULT_NODE - 1] / "BROKEN"

    def abort(self, name: str, model: str, *intents: str) -> None:
        text = self.rollout_text(name, model, *intents, "abort: true")
        self._push({f"rollouts/{name}.yaml": text}, f"Abort {name}")
        self._wait(lambda: self._phase(name) == "aborted", 120)

    def resume(self, name: str, model: str) -> tuple[float, float, str]:
        """The node fixed, a resume pushed: timed to ``completed``."""
        self.broken.unlink()
        text = self.rollout_text(name, model, "resumeRequest: fixed")
        wall, used = self._timed_push(
            name,
            text,
            f"Resume {name}",
            lambda: self._phase(name) in ("completed", "failed", "aborted"),
        )
        phase = self._phase(name)
        if phase != "completed":
            raise RuntimeError(f"resumed {name} ended {phase}; see {self.root}/daemon.log")
        return wall, used, phase

    def rollback(self, name: str, model: str) -> tuple[float, float, int]:
        """A held rollout's changed nodes restored (``rollbackRequest`` with
        ``nodes: all``): timed to the request ``done``; then aborted (not
        timed). Returns (wall, CPU, nodes restored)."""
        self.broken.unlink()
        request = "rollbackRequest: {id: back, nodes: all}"
        text = self.rollout_text(name, model, request)
        wall, used = self._timed_push(
            name, text, f"Roll back {name}", lambda: self._rollback_state(name) == "done"
        )
        # The request's record: each node restored, or skipped when it never
        # changed (node 15's agent put its config back when the probe failed).
        records = (self._status(name).get("rollbacks") or [{}])[-1].get("nodes") or []
        rolled = [r for r in records if r.get("outcome") == "rolled_back"]
        if len(rolled) != 2 * BATCH - 1:
            raise RuntimeError(f"rollback of {name}: {records}; see {self.root}/daemon.log")
        self.abort(name, model, request)
        return wall, used, len(rolled)

    def _status(self, name: str) -> dict[str, Any]:
        data = status_data(self.bare, name)
        loaded = load_yaml(f"status/{name}.yaml", data) if data else None
        return loaded if isinstance(loaded, dict) else {}

    def _rollback_state(self, name: str) -> str:
        data = status_data(self.bare, name) or b""
        if b"rollbacks:" not in data:
            return ""
        rollbacks = self._status(name).get("rollbacks") or [{}]
        return str(rollbacks[-1].get("state", ""))

    def close(self) -> None:
        if self.moves is not None:
            self.moves.close()
        stop_processes(([self.daemon] if self.daemon else []) + self.agents)


def listening_urls(names: list[str], agents: list[subprocess.Popen[bytes]]) -> dict[str, str]:
    """Each agent's URL, from the "listening on HOST:PORT" line it prints once up."""
    urls = {}
    for name, agent in zip(names, agents, strict=True):
        assert agent.stdout is not None
        line = agent.stdout.readline().decode()
        if not line.startswith("listening on "):
            raise RuntimeError(f"agent {name} did not start: {line!r}")
        urls[name] = "http://" + line.split()[-1]
    return urls


def stop_processes(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each still running, then wait for each, SIGKILL after 20 s."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


# -- the run ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BatchTimes:
    """Medians over a rollout's batches, in milliseconds."""

    period: float  # a batch's first accept to the next batch's
    accepts: float  # first to last accept of a batch
    job: float  # accepted to finished, the median job of a batch
    between: float  # a batch's last finish to the next batch's first accept

    def __str__(self) -> str:
        return (
            f"a batch {self.period:.0f} ms: accepts over {self.accepts:.1f}, a job "
            f"{self.job:.1f}, last finish to the next batch's first accept {self.between:.1f}"
        )


def batch_times(jobs: list[tuple[datetime, datetime]]) -> BatchTimes:
    """``jobs`` (accepted, finished), in the order accepted, cut into batches of BATCH."""
    batches = [jobs[k : k + BATCH] for k in range(0, len(jobs), BATCH)]

    def ms(later: datetime, earlier: datetime) -> float:
        return (later - earlier).total_seconds() * 1000

    def across(values: list[float]) -> float:
        """The median from one batch to the next; NaN for a rollout of one batch."""
        return median(values) if values else float("nan")

    pairs = list(itertools.pairwise(batches))
    return BatchTimes(
        period=across([ms(after[0][0], batch[0][0]) for batch, after in pairs]),
        accepts=median([ms(batch[-1][0], batch[0][0]) for batch in batches]),
        job=median([median([ms(done, accepted) for accepted, done in b]) for b in batches]),
        between=across([ms(after[0][0], max(d for _, d in batch)) for batch, after in pairs]),
    )


def spread(values: list[float]) -> str:
    return f"median {median(values):.2f} s, min {min(values):.2f}, max {max(values):.2f}"


# What each row times, in the order of a run: (key, label).
ROWS = (
    ("rollout", "rollout N={n}"),
    ("fault", "failure at node 15 to hold"),
    ("resume", "resume after the fix to completed"),
    ("rollback", "rollback of the 20 changed nodes"),
)
Sample = tuple[float, float, str]  # wall seconds, CPU seconds, how it ended


def one_run(
    run: int, ours: OurSide, theirs: AnsibleSide | None
) -> dict[str, tuple[Sample | None, Sample]]:
    """One run of every row, the two sides alternating step by step:
    row -> (Ansible's sample or None, ours)."""
    names = [f"r{run}-rollout", f"r{run}-fault", f"r{run}-back"]
    models = [f"model-{run}-rollout", f"model-{run}-fault", f"model-{run}-back"]
    found: dict[str, tuple[Sample | None, Sample]] = {}

    def ansible(model: str, fault: bool, hosts: int | None = None) -> Sample | None:
        if theirs is None:
            return None
        wall, cpu, ok = theirs.run(model, fault, hosts)
        return wall, cpu, "ok" if ok else "stopped"

    # A rollout at N.
    found["rollout"] = (ansible(models[0], False), ours.rollout(names[0], models[0], False))
    # A failure at node 15, then the fix: Ansible runs the playbook again;
    # we push a resume for the held rollout.
    found["fault"] = (
        ansible(models[1], True),
        ours.rollout(names[1], models[1], True, keep=True),
    )
    found["resume"] = (ansible(models[1], False), ours.resume(names[1], models[1]))
    # Another failure (not timed), then the 20 changed nodes put back:
    # Ansible writes the previous config to them; we push a rollbackRequest.
    ansible(models[2], True)
    ours.rollout(names[2], models[2], True, keep=True)
    wall, cpu, rolled = ours.rollback(names[2], models[2])
    found["rollback"] = (
        ansible(models[1], False, hosts=2 * BATCH),
        (wall, cpu, f"{rolled} restored"),
    )
    return found


def measure_ours(nodes: int, runs: int) -> None:
    """Our side alone, for profiling: no ratio, no rows."""
    names = [f"node-{k:03d}" for k in range(1, nodes + 1)]
    with tempfile.TemporaryDirectory(prefix="bench-ansible-") as tmp:
        ours = OurSide(Path(tmp), names)
        try:
            for run in range(1, runs + 1):
                before = int(git("rev-list", "--count", "main", cwd=ours.bare))
                for what, (_, (wall, cpu, how)) in one_run(run, ours, None).items():
                    print(f"run {run} {what}: ours {wall:.3f} s (CPU {cpu:.2f} s, {how})")
                commits = int(git("rev-list", "--count", "main", cwd=ours.bare)) - before
                print(f"run {run}: {commits} commits in all, pushes and aborts included")
        finally:
            ours.close()


def measure(nodes: int, runs: int) -> tuple[list[Row], float]:
    """The rows, and Ansible's median rollout wall time."""
    names = [f"node-{k:03d}" for k in range(1, nodes + 1)]
    with tempfile.TemporaryDirectory(prefix="bench-ansible-") as tmp:
        root = Path(tmp)
        theirs = AnsibleSide(root, names)
        ours = OurSide(root, names)
        results: dict[str, list[tuple[Sample, Sample]]] = {}
        try:
            for run in range(1, runs + 1):
                for what, (a, o) in one_run(run, ours, theirs).items():
                    assert a is not None
                    results.setdefault(what, []).append((a, o))
                    print(
                        f"run {run} {what}: Ansible {a[0]:.2f} s (CPU {a[1]:.1f} s, {a[2]}), "
                        f"ours {o[0]:.3f} s (CPU {o[1]:.2f} s, {o[2]}), "
                        f"ratio {o[0] / a[0]:.4f}  [load average {load_average():.1f}]",
                        flush=True,
                    )
        finally:
            ours.close()
    rows: list[Row] = []
    for what, label in ROWS:
        label = label.format(n=nodes)
        a = [x[0] for x, _ in results[what]]
        o = [y[0] for _, y in results[what]]
        ratios = [y / x for x, y in zip(a, o, strict=True)]
        print(f"{label}: Ansible {spread(a)}; ours {spread(o)}; worst ratio {max(ratios):.4f}")
        rows += [
            row(f"ansible: {label}, Ansible wall", median(a), "s"),
            row(f"ansible: {label}, ours wall", median(o), "s", median(a), "Ansible"),
            row(f"ansible: {label}, ours wall, worst run", max(o), "s"),
            row(f"ansible: {label}, worst ratio ours/Ansible", max(ratios), "x"),
            row(f"ansible: {label}, Ansible CPU", median([x[1] for x, _ in results[what]]), "s"),
            row(f"ansible: {label}, ours CPU", median([y[1] for _, y in results[what]]), "s"),
        ]
    return rows, median([x[0] for x, _ in results["rollout"]])


def _first_run_rollout(ours: OurSide, name: str) -> tuple[float, float]:
    """One timed rollout of ``--first-run``: (wall, CPU); prints the CPU of
    the daemon apart from the agents' and where the batches went."""
    daemon_before = ours.daemon_cpu()
    wall, cpu, _ = ours.rollout(name, f"model-{name}", False)
    daemon = ours.daemon_cpu() - daemon_before
    print(
        f"  {name}: CPU daemon {daemon:.2f} s, agents and probes {cpu - daemon:.2f} s; "
        f"{ours.batches(name)}",
        flush=True,
    )
    return wall, cpu


def measure_first_runs(nodes: int, runs: int, other_trees: list[str]) -> list[Row]:
    """The rollout at N right after the agents start: each run starts new
    agents and a new daemon (of this tree, then of each of ``other_trees``),
    waits for the daemon's first fleet sweep as the other rows do,
    and times the first rollout, whose jobs are each agent's first, then a
    second one; an Ansible run of the same rollout before each."""
    names = [f"node-{k:03d}" for k in range(1, nodes + 1)]
    trees: list[tuple[str, str | None]] = [("this tree", None)]
    trees += [(other, str(Path(other).resolve())) for other in other_trees]
    found: dict[str, list[tuple[float, float, float]]] = {label: [] for label, _ in trees}
    with tempfile.TemporaryDirectory(prefix="bench-ansible-") as tmp:
        theirs = AnsibleSide(Path(tmp), names)
        for run in range(1, runs + 1):
            for label, tree in trees:
                root = Path(tmp) / f"run-{run}-{len(found[label])}-{trees.index((label, tree))}"
                ansible_wall = theirs.run(f"model-{run}-{root.name}", False)[0]
                ours = OurSide(root, names, tree)
                try:
                    first = _first_run_rollout(ours, "first")
                    second = _first_run_rollout(ours, "second")
                finally:
                    ours.close()
                found[label].append((ansible_wall, first[0], second[0]))
                print(
                    f"run {run} {label}: Ansible {ansible_wall:.2f} s; ours first after "
                    f"start {first[0]:.3f} s (CPU {first[1]:.2f} s, ratio "
                    f"{first[0] / ansible_wall:.4f}), second {second[0]:.3f} s (CPU "
                    f"{second[1]:.2f} s)  [load average {load_average():.1f}]",
                    flush=True,
                )
    rows: list[Row] = []
    for label, _ in trees:
        done = found[label]
        worst = max(f / a for a, f, _ in done)
        print(
            f"{label}: first run after start {spread([f for _, f, _ in done])}; second "
            f"{spread([s for _, _, s in done])}; Ansible {spread([a for a, _, _ in done])}; "
            f"worst ratio, first run {worst:.4f}"
        )
        if label == "this tree":
            rows += [
                row(f"ansible: rollout N={nodes}, first after the agents start, ours wall, worst",
                    max(f for _, f, _ in done), "s"),
                row(f"ansible: rollout N={nodes}, first after the agents start, worst ratio "
                    "ours/Ansible", worst, "x"),
            ]  # fmt: skip
    return rows


def sim_phase(bare: Path, name: str) -> bytes:
    found = PHASE.search(status_data(bare, name) or b"")
    return found.group(1) if found else b""


def sim_stopped(bare: Path, name: str) -> bool:
    return sim_phase(bare, name) in (b"completed", b"failed", b"paused")


def measure_simulated(nodes: int, runs: int, ansible_per_node: float | None) -> list[Row]:
    """Ours at ``nodes`` simulated agents (``reconciler sim-fleet``, one
    process, each live apply taking SIM_APPLY seconds), the daemon with
    default flags; Ansible's side is estimated from its N=100 run when one
    ran (its time grows with the number of batches), not measured."""
    names = [f"node-{k:04d}" for k in range(1, nodes + 1)]
    walls: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-ansible-sim-") as tmp:
        root = Path(tmp)
        key, public = generate_key(root / "keys")
        fleet = SimFleetProcess(root / "sim", names, public, SIM_APPLY)
        daemon = None
        try:
            bare = root / "fleet.git"
            make_bare(
                bare,
                {f"nodes/{n}.yaml": node_text(n, f"{fleet.url}", {"role": "gpu"}) for n in names},
            )
            work = root / "work"
            git("clone", "-q", str(bare), str(work), cwd=root)
            with open(root / "daemon.log", "wb") as log:
                daemon = subprocess.Popen(
                    [sys.executable, "-m", "reconciler", "run", "--repo", str(bare),
                     "--key", str(key)],
                    stdout=log,
                    stderr=log,
                )  # fmt: skip
            deadline = time.monotonic() + 120
            while git("ls-tree", "main", "status/", cwd=bare) == "":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the daemon did not start; see {root}/daemon.log")
                time.sleep(0.05)
            wait_for_first_sweep(bare)
            for run in range(1, runs + 1):
                name = f"sim-{run}"
                text = OurSide.rollout_text(name, f"sim-model-{run}")
                git("pull", "-q", "--rebase", "origin", "main", cwd=work)
                (work / "rollouts").mkdir(exist_ok=True)
                (work / "rollouts" / f"{name}.yaml").write_text(text)
                git("add", "-A", cwd=work)
                git("commit", "-q", "-m", f"Roll out {name}", cwd=work)
                time.sleep(0.2)

                moves = BranchMoves(bare)
                try:
                    start = time.perf_counter()
                    git("push", "-q", "origin", "main", cwd=work)
                    moves.until(
                        functools.partial(sim_stopped, bare, name),
                        600,
                        f"see {root}/daemon.log",
                    )
                    wall = time.perf_counter() - start
                finally:
                    moves.close()
                phase = sim_phase(bare, name)
                if phase != b"completed":
                    raise RuntimeError(f"{name} ended {phase!r}; see {root}/daemon.log")
                walls.append(wall)
                print(
                    f"simulated N={nodes} run {run}: ours {wall:.2f} s "
                    f"[load average {load_average():.1f}]",
                    flush=True,
                )
        finally:
            if daemon is not None:
                daemon.send_signal(signal.SIGTERM)
                try:
                    daemon.wait(30)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait()
            fleet.stop()
    label = f"rollout N={nodes} simulated agents"
    rows = [row(f"ansible: {label}, ours wall", median(walls), "s")]
    if ansible_per_node is not None:
        estimate = ansible_per_node * nodes
        print(f"{label}: ours {spread(walls)}; Ansible estimated {estimate:.0f} s (not run)")
        rows += [
            row(f"ansible: {label}, Ansible wall ESTIMATED", estimate, "s"),
            row(f"ansible: {label}, ours/Ansible estimated", median(walls) / estimate, "x"),
        ]
    return rows


# -- the artifact scenario ------------------------------------------------------

ART_BATCH = 5
ART_PLAYBOOK = """\
- hosts: fleet
  gather_facts: false
  serial: 5
  max_fail_percentage: 0
  pre_tasks:
    - name: take the node out of the balancer
      uri: {url: "{{ runtime }}/admin/drain", method: POST}
  tasks:
    - name: download the weights
      get_url:
        url: "{{ artifact_url }}"
        dest: "{{ node_dir }}/model.gguf"
        checksum: "sha256:{{ artifact_sha256 }}"
    - name: point the config at them
      copy: {dest: "{{ config_path }}", content: "{{ config_text }}", backup: yes}
    - name: restart the runtime on the new model
      uri: {url: "{{ runtime }}/admin/load?model={{ model }}", method: POST, timeout: 60}
    - name: warm up
      uri: {url: "{{ runtime }}/v1/completions", method: POST, body: "{}", status_code: 200}
  post_tasks:
    - name: back into the balancer
      uri: {url: "{{ runtime }}/admin/undrain", method: POST}
"""


def _out_of_service(runtimes: Any, since: float) -> list[float]:
    """Each node's seconds out of service after ``since`` (``time.monotonic``)."""
    return [
        sum(end - start for start, end in r.out_of_service if start >= since)
        for r in runtimes.runtimes.values()
    ]


def artifact_ansible(
    root: Path, names: list[str], mirror: Any, sha: str, runtimes: Any
) -> tuple[float, list[float]]:
    """The naive playbook over the fleet: (wall seconds, out of service per node)."""
    home = root / "ansible-art"
    playbook_bin = ansible_bin(root)
    lines = ["[fleet]"]
    for name in names:
        node_dir = home / "nodes" / name
        node_dir.mkdir(parents=True, exist_ok=True)
        (node_dir / "hermes.yaml").write_text(BASE)
        lines.append(
            f"{name} ansible_connection=local node_dir={node_dir} "
            f"config_path={node_dir / 'hermes.yaml'} runtime={runtimes.runtimes[name].url}"
        )
    (home / "inventory.ini").write_text("\n".join(lines) + "\n")
    (home / "rollout.yml").write_text(ART_PLAYBOOK)
    env = ansible_env(home, playbook_bin)
    extra = {
        "artifact_url": mirror.url("model.gguf"),
        "artifact_sha256": sha,
        "model": "big-model",
        "config_text": config_text("big-model"),
    }
    command = [str(playbook_bin), "-i", str(home / "inventory.ini"), "--forks", str(ART_BATCH),
               "-e", json.dumps(extra), str(home / "rollout.yml")]  # fmt: skip
    settle_disk()
    since = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - since
    if done.returncode != 0:
        raise RuntimeError(f"the playbook failed:\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
    return wall, _out_of_service(runtimes, since)


class ArtifactOurs:
    """Real agents with drain and undrain commands for their stand-in
    runtimes, and the daemon as a process."""

    def __init__(self, root: Path, names: list[str], runtimes: Any) -> None:
        self.root = root / "ours-art"
        self.key, public = generate_key(self.root / "keys")
        self.agents: list[subprocess.Popen[bytes]] = []
        self.daemon: subprocess.Popen[bytes] | None = None
        for name in names:
            home = self.root / "agents" / name
            (home / "state" / "runtimes").mkdir(parents=True)
            (home / "state" / "runtimes" / "hermes.yaml").write_text(BASE)
            commands = runtimes.runtimes[name].commands(home / "scripts")
            self.agents.append(
                subprocess.Popen(
                    [sys.executable, "-m", "reconciler", "agent", "--node", name,
                     "--state-dir", str(home / "state"), "--trust-key", str(public),
                     "--runtime", "hermes", "--allow-live-apply", "--listen", "127.0.0.1:0",
                     "--after-apply", commands["after_apply"],
                     "--drain-command", commands["drain"],
                     "--undrain-command", commands["undrain"]],
                    stdout=subprocess.PIPE,
                    stderr=open(home / "agent.log", "wb"),  # noqa: SIM115 (the child's)
                )
            )  # fmt: skip
        urls = listening_urls(names, self.agents)
        self.bare = self.root / "fleet.git"
        make_bare(
            self.bare, {f"nodes/{n}.yaml": node_text(n, urls[n], {"role": "gpu"}) for n in names}
        )
        self.work = self.root / "work"
        git("clone", "-q", str(self.bare), str(self.work), cwd=self.root)
        with open(self.root / "daemon.log", "wb") as log:
            self.daemon = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "reconciler",
                    "run",
                    "--repo",
                    str(self.bare),
                    "--key",
                    str(self.key),
                ],
                stdout=log,
                stderr=log,
            )
        wait_for_first_sweep(self.bare)

    def rollout(
        self, mirror: Any, sha: str, size: int, runtimes: Any
    ) -> tuple[float, list[float], dict[str, Any]]:
        """(wall seconds from the push to completed, out of service per node, status)."""
        artifact = (
            f"{{name: weights, url: '{mirror.url('model.gguf')}', sha256: {sha}, size: {size}}}"
        )
        text = (
            "apiVersion: reconciler/v1\nkind: Rollout\nmetadata: {name: big}\nspec:\n"
            "  target: {runtime: hermes, provider: ollama, model: big-model, profile: default, "
            f"artifacts: [{artifact}]}}\n"
            f"  selector: {{role: gpu}}\n  batchSize: {ART_BATCH}\n  live: true\n"
            f"  stage: {{ahead: 1, maxConcurrent: {2 * ART_BATCH}}}\n"
            f'  drain: {{timeout: 1m, idle: {{url: "{runtimes.url}/{{node}}/metrics", '
            'metric: "vllm:num_requests_running", max: 0}}\n'
            f'  warmup: [{{http: {{url: "{runtimes.url}/{{node}}/v1/completions", method: POST, '
            'body: "{}", expectStatus: 200}}]\n'
        )
        git("pull", "-q", "--rebase", "origin", "main", cwd=self.work)
        (self.work / "rollouts").mkdir(exist_ok=True)
        (self.work / "rollouts" / "big.yaml").write_text(text)
        git("add", "-A", cwd=self.work)
        git("commit", "-q", "-m", "Roll out big-model", cwd=self.work)
        settle_disk()
        moves = BranchMoves(self.bare)
        try:
            since = time.monotonic()
            git("push", "-q", "origin", "main", cwd=self.work)
            moves.until(
                lambda: sim_phase(self.bare, "big") in (b"completed", b"paused", b"failed"),
                900,
                f"see {self.root}/daemon.log",
            )
            wall = time.monotonic() - since
        finally:
            moves.close()
        status = load_yaml("status/big.yaml", status_data(self.bare, "big") or b"")
        if sim_phase(self.bare, "big") != b"completed":
            raise RuntimeError(
                f"the rollout ended {sim_phase(self.bare, 'big')!r}; see {self.root}/daemon.log"
            )
        return wall, _out_of_service(runtimes, since), status

    def close(self) -> None:
        stop_processes(([self.daemon] if self.daemon else []) + self.agents)


def measure_artifacts(nodes: int, size_mib: int, seconds: float) -> list[Row]:
    """Both sides once, over the same mirror and stand-in runtimes."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the tests package
    from tests.kit.nginx import NginxServer
    from tests.kit.runtime import RuntimeFleet

    size = size_mib * 1024 * 1024
    names = [f"node-{k:02d}" for k in range(1, nodes + 1)]
    with tempfile.TemporaryDirectory(prefix="bench-ansible-art-") as tmp:
        root = Path(tmp)
        (root / "mirror").mkdir()
        block = os.urandom(1024 * 1024)
        with open(root / "mirror" / "model.gguf", "wb") as out:
            for _ in range(size_mib):
                out.write(block)
        sha = hashlib.sha256(block * size_mib).hexdigest()
        with NginxServer(root / "nginx", root / "mirror", rate=int(size / seconds)) as mirror, \
                RuntimeFleet(names, "old", load_seconds=0.1) as theirs_rt, \
                RuntimeFleet(names, "old", load_seconds=0.1) as ours_rt:  # fmt: skip
            a_wall, a_out = artifact_ansible(root, names, mirror, sha, theirs_rt)
            print(
                f"Ansible: {a_wall:.1f} s, out of service per node median {median(a_out):.2f} s",
                flush=True,
            )
            ours = ArtifactOurs(root, names, ours_rt)
            try:
                o_wall, o_out, status = ours.rollout(mirror, sha, size, ours_rt)
            finally:
                ours.close()
    recorded = [n.get("outOfService", 0.0) for n in status.get("nodes", [])]
    print(f"ours: {o_wall:.1f} s, out of service per node median {median(o_out):.3f} s", flush=True)
    label = f"artifact {size_mib} MiB to {nodes} nodes at ~{seconds:g} s a download"
    return [
        row(f"ansible: {label}, Ansible wall", a_wall, "s"),
        row(f"ansible: {label}, ours wall", o_wall, "s", a_wall, "Ansible"),
        row(f"ansible: {label}, Ansible out of service per node, median", median(a_out), "s"),
        row(
            f"ansible: {label}, ours out of service per node, median",
            median(o_out),
            "s",
            median(a_out),
            "Ansible",
        ),
        row(f"ansible: {label}, ours out of service per node, max", max(o_out), "s"),
        row(f"ansible: {label}, ours outOfService in status, max", max(recorded), "s"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--sim-nodes", type=int, default=1000, help="the simulated row's N (0: no such row)"
    )
    parser.add_argument("--quick", action="store_true", help="20 nodes, 1 run, 200 simulated")
    parser.add_argument("--ours-only", action="store_true", help="our side alone (profiling)")
    parser.add_argument(
        "--first-run",
        action="store_true",
        help="only the rollout right after the agents start, new agents each run",
    )
    parser.add_argument(
        "--other-tree",
        action="append",
        default=[],
        help="with --first-run: a source tree to alternate with (repeatable)",
    )
    parser.add_argument(
        "--artifacts",
        action="store_true",
        help="the model-artifact scenario instead: get_url and restart per serial batch "
        "against staged ahead, drained and warmed up",
    )
    parser.add_argument("--size-mib", type=int, default=256, help="with --artifacts")
    parser.add_argument(
        "--download-seconds", type=float, default=5.0, help="with --artifacts: the rate cap"
    )
    parser.add_argument(
        "--model-change",
        action="store_true",
        help="a model change on 3 real llama-server nodes under client load: the naive "
        "playbook (get_url, restart per serial batch) against ours with drain and warm-up",
    )
    parser.add_argument(
        "--standby",
        action="store_true",
        help="with --model-change: ours with a warm standby too (slots behind nginx)",
    )
    parser.add_argument(
        "--standby-without-warmup",
        action="store_true",
        help="with --standby: no warm-up on the new slot (for a daemon that does not "
        "take {slotPort} in a warm-up URL)",
    )
    args = parser.parse_args()
    if args.model_change:
        from model_change import measure_model_change

        announce("ansible model change: 3 llama-server nodes, batches of 1, client load")
        emit(
            measure_model_change(
                ansible_bin(Path(tempfile.gettempdir())),
                args.standby,
                not args.standby_without_warmup,
            )
        )
        return
    if args.artifacts:
        nodes = 6 if args.quick else (args.nodes if args.nodes != 100 else 20)
        size = 32 if args.quick else args.size_mib
        announce(f"ansible artifacts: {nodes} nodes, {size} MiB, batches of {ART_BATCH}")
        emit(measure_artifacts(nodes, size, args.download_seconds))
        return
    if args.quick:
        args.nodes, args.runs, args.sim_nodes = 20, 1, min(args.sim_nodes, 200)
    if args.ours_only:
        announce(f"ours alone: {args.nodes} nodes, batches of {BATCH}, {args.runs} runs")
        measure_ours(args.nodes, args.runs)
        return
    if args.first_run:
        announce(f"ansible, first run after the agents start: {args.nodes} nodes, {args.runs} runs")
        emit(measure_first_runs(args.nodes, args.runs, args.other_tree))
        return
    announce(f"ansible: {args.nodes} nodes, batches of {BATCH}, {args.runs} runs alternating")
    rows, ansible_rollout = measure(args.nodes, args.runs)
    if args.sim_nodes:
        rows += measure_simulated(args.sim_nodes, 3, ansible_rollout / args.nodes)
    emit(rows)


if __name__ == "__main__":
    main()
