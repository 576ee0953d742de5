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
bare repository; timed from the push to its status committed ``completed``
(or ``paused`` at the failure). CPU: the daemon's and the agents' own, with
their probes' (children's) CPU, over the row.

Rows: a rollout at N; a failure at node 15 (time until each side stops: the
playbook fails, the rollout is held). The fault rollout is aborted after
each run so the next run's rollout may take its nodes (not timed).

The machine is shared: read the spread (min to max over the runs), not only
the median.
"""

from __future__ import annotations

import argparse
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import (
    Row,
    announce,
    emit,
    git,
    git_env,
    make_bare,
    median,
    node_text,
    row,
    status_data,
)

from reconciler.protocol.signing import generate_key

BATCH = 10
FAULT_NODE = 15
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


class AnsibleSide:
    def __init__(self, root: Path, names: list[str]) -> None:
        self.root = root / "ansible"
        self.names = names
        self.playbook_bin = ansible_bin(root)
        for name in names:
            (self.root / "nodes" / name).mkdir(parents=True, exist_ok=True)
            (self.root / "nodes" / name / "hermes.yaml").write_text(BASE)
        (self.root / "rollout.yml").write_text(PLAYBOOK)
        python = self.playbook_bin.parent / "python"
        self.python = str(python if python.exists() else sys.executable)
        self.env = {
            **os.environ,
            "ANSIBLE_HOME": str(self.root / "home"),
            "ANSIBLE_LOCAL_TEMP": str(self.root / "tmp"),
            "ANSIBLE_REMOTE_TMP": str(self.root / "tmp"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_RETRY_FILES_ENABLED": "0",
            "ANSIBLE_PYTHON_INTERPRETER": self.python,
        }

    def run(self, model: str, fault: bool) -> tuple[float, float, bool]:
        """(wall seconds, CPU seconds, succeeded)."""
        lines = ["[fleet]"]
        for k, name in enumerate(self.names, start=1):
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
    def __init__(self, root: Path, names: list[str]) -> None:
        self.root = root / "ours"
        self.names = names
        self.key, public = generate_key(self.root / "keys")
        self.agents: list[subprocess.Popen[bytes]] = []
        self.daemon: subprocess.Popen[bytes] | None = None
        urls: dict[str, str] = {}
        try:
            for name in names:
                home = self.root / "agents" / name
                (home / "state" / "runtimes").mkdir(parents=True)
                (home / "state" / "runtimes" / "hermes.yaml").write_text(BASE)
                probe = (
                    'grep -qx "model: $RECONCILER_MODEL" "$RECONCILER_CONFIG"'
                    f' && test ! -e "{self.root}/agents/$RECONCILER_NODE/BROKEN"'
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
                    )
                )  # fmt: skip
            for name, agent in zip(names, self.agents, strict=True):
                assert agent.stdout is not None
                line = agent.stdout.readline().decode()
                if not line.startswith("listening on "):
                    raise RuntimeError(f"agent {name} did not start: {line!r}")
                urls[name] = "http://" + line.split()[-1]
            self.bare = self.root / "fleet.git"
            make_bare(
                self.bare,
                {f"nodes/{n}.yaml": node_text(n, urls[n], {"role": "gpu"}) for n in names},
            )
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
                )  # fmt: skip
            self._wait(lambda: git("ls-tree", "main", "status/", cwd=self.bare) != "", 120)
        except BaseException:
            self.close()
            raise

    def _wait(self, check: object, timeout: float, pause: float = 0.005) -> None:
        deadline = time.monotonic() + timeout
        while not check():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise RuntimeError(f"not reached in {timeout:.0f}s; see {self.root}/daemon.log")
            time.sleep(pause)

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

    def rollout(self, name: str, model: str, fault: bool) -> tuple[float, float, str]:
        """(wall seconds, CPU seconds, the phase it stopped in)."""
        broken = self.root / "agents" / self.names[FAULT_NODE - 1] / "BROKEN"
        if fault:
            broken.write_text("the probe fails here\n")
        text = (
            "apiVersion: reconciler/v1\nkind: Rollout\n"
            f"metadata: {{name: {name}}}\n"
            "spec:\n"
            f"  target: {{runtime: hermes, provider: ollama, model: {model}, profile: default}}\n"
            "  selector: {role: gpu}\n"
            f"  batchSize: {BATCH}\n"
            "  live: true\n"
            "  onFailure: pause\n"
        )
        time.sleep(0.2)  # the daemon is idle, waiting on its watcher
        cpu = self._cpu()
        start = self._push({f"rollouts/{name}.yaml": text}, f"Roll out {model}")
        stops = ("paused", "failed", "completed") if fault else ("completed", "failed", "paused")
        self._wait(lambda: self._phase(name) in stops, 300)
        wall = time.perf_counter() - start
        used = self._cpu() - cpu
        phase = self._phase(name)
        if fault:
            broken.unlink()
            self._push({f"rollouts/{name}.yaml": text + "  abort: true\n"}, f"Abort {name}")
            self._wait(lambda: self._phase(name) == "aborted", 120, 0.02)
        elif phase != "completed":
            raise RuntimeError(f"rollout {name} ended {phase}; see {self.root}/daemon.log")
        return wall, used, phase

    def close(self) -> None:
        processes = ([self.daemon] if self.daemon else []) + self.agents
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


def spread(values: list[float]) -> str:
    return f"median {median(values):.2f} s, min {min(values):.2f}, max {max(values):.2f}"


def measure_ours(nodes: int, runs: int) -> None:
    """Our side alone, for profiling: no ratio, no rows."""
    names = [f"node-{k:03d}" for k in range(1, nodes + 1)]
    with tempfile.TemporaryDirectory(prefix="bench-ansible-") as tmp:
        ours = OurSide(Path(tmp), names)
        try:
            for run in range(1, runs + 1):
                for what, fault in (("rollout", False), ("fault", True)):
                    before = int(git("rev-list", "--count", "main", cwd=ours.bare))
                    wall, cpu, phase = ours.rollout(f"r{run}-{what}", f"m-{run}-{what}", fault)
                    commits = int(git("rev-list", "--count", "main", cwd=ours.bare)) - before
                    print(
                        f"run {run} {what}: ours {wall:.3f} s (CPU {cpu:.2f} s, {phase}; "
                        f"{commits} commits with the push and the abort)"
                    )
        finally:
            ours.close()


def measure(nodes: int, runs: int) -> list[Row]:
    names = [f"node-{k:03d}" for k in range(1, nodes + 1)]
    with tempfile.TemporaryDirectory(prefix="bench-ansible-") as tmp:
        root = Path(tmp)
        theirs = AnsibleSide(root, names)
        ours = OurSide(root, names)
        results: dict[tuple[str, str], list[tuple[float, float]]] = {}
        try:
            for run in range(1, runs + 1):
                for what, fault in (("rollout", False), ("fault", True)):
                    model = f"model-{run}-{what}"
                    a_wall, a_cpu, a_ok = theirs.run(model, fault)
                    o_wall, o_cpu, phase = ours.rollout(f"r{run}-{what}", model, fault)
                    results.setdefault(("ansible", what), []).append((a_wall, a_cpu))
                    results.setdefault(("ours", what), []).append((o_wall, o_cpu))
                    print(
                        f"run {run} {what}: Ansible {a_wall:.2f} s (CPU {a_cpu:.1f} s, "
                        f"{'ok' if a_ok else 'stopped'}), ours {o_wall:.3f} s "
                        f"(CPU {o_cpu:.2f} s, {phase}), ratio {o_wall / a_wall:.4f}",
                        flush=True,
                    )
        finally:
            ours.close()
    rows: list[Row] = []
    for what, label in (("rollout", f"rollout N={nodes}"), ("fault", "failure at node 15 to hold")):
        a = [w for w, _ in results[("ansible", what)]]
        o = [w for w, _ in results[("ours", what)]]
        ratios = [x / y for x, y in zip(o, a, strict=True)]
        print(f"{label}: Ansible {spread(a)}; ours {spread(o)}; worst ratio {max(ratios):.4f}")
        rows += [
            row(f"ansible: {label}, Ansible wall", median(a), "s"),
            row(f"ansible: {label}, ours wall", median(o), "s", median(a), "Ansible"),
            row(f"ansible: {label}, ours wall, worst run", max(o), "s"),
            row(f"ansible: {label}, worst ratio ours/Ansible", max(ratios), "x"),
            row(
                f"ansible: {label}, Ansible CPU",
                median([c for _, c in results[("ansible", what)]]),
                "s",
            ),
            row(
                f"ansible: {label}, ours CPU", median([c for _, c in results[("ours", what)]]), "s"
            ),
        ]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="20 nodes, 1 run")
    parser.add_argument("--ours-only", action="store_true", help="our side alone (profiling)")
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.runs = 20, 1
    if args.ours_only:
        announce(f"ours alone: {args.nodes} nodes, batches of {BATCH}, {args.runs} runs")
        measure_ours(args.nodes, args.runs)
        return
    announce(f"ansible: {args.nodes} nodes, batches of {BATCH}, {args.runs} runs alternating")
    emit(measure(args.nodes, args.runs))


if __name__ == "__main__":
    main()
