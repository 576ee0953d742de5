"""The daemon against real SSH remotes: Debian's sshd on 127.0.0.1
(``tests/kit/ssh.py``), and gitolite3 behind it with the rules a team would
write: people push ``main``, the daemon's key may push only
``reconciler-status``. Agents are the simulated fleet on 127.0.0.1."""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from reconciler.daemon.agent_client import AgentClient
from reconciler.daemon.logs import EventLog
from reconciler.daemon.loop import Daemon
from reconciler.daemon.metrics import Metrics
from reconciler.git.store import GitStore
from reconciler.protocol.signing import load_private_key
from reconciler.spec.safe_yaml import load_yaml
from tests.kit.agents import SimFleet, start_sim_fleet
from tests.kit.documents import node_yaml, rollout_yaml
from tests.kit.git import clone, commit_and_push, git, git_env, make_bare_repo
from tests.kit.keys import make_key
from tests.kit.ssh import SshServer, gitolite_login, gitolite_setup, require_gitolite

pytestmark = pytest.mark.sshd

NODES = ("web-1", "web-2")


@dataclass
class Site:
    root: Path
    job_key: Path  # signs jobs
    ssh_key: Path  # the daemon's SSH login
    person_key: Path
    known_hosts: Path
    fleet: SimFleet

    def person_env(self) -> dict[str, str]:
        ssh = (
            f"ssh -i {self.person_key} -o IdentitiesOnly=yes -o BatchMode=yes "
            f"-o UserKnownHostsFile={self.known_hosts}"
        )
        return git_env(extra={"GIT_SSH_COMMAND": ssh})

    def daemon_args(self, url: str, *extra: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "reconciler",
            "run",
            "--repo",
            url,
            "--key",
            str(self.job_key),
            "--ssh-key",
            str(self.ssh_key),
            "--known-hosts",
            str(self.known_hosts),
            "--cache-dir",
            str(self.root / "cache"),
            "--agent-timeout",
            "2s",
            *extra,
        ]

    def seed(self, *, settings: str | None = None) -> dict[str, str]:
        files = {f"nodes/{n}.yaml": node_yaml(n, self.fleet.url, {"role": "web"}) for n in NODES}
        files["rollouts/web.yaml"] = rollout_yaml("web", nodeIds=list(NODES), batchSize=1)
        if settings is not None:
            files["reconciler.yaml"] = settings
        return files


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    made = make_key(tmp_path / "keys" / "reconciler")
    job_key, job_pub = made.private, made.public
    ssh_key = make_key(tmp_path / "ssh" / "daemon", comment="daemon").private
    person_key = make_key(tmp_path / "ssh" / "person", comment="person").private
    fleet = start_sim_fleet(tmp_path / "sim", list(NODES), job_pub)
    made = Site(tmp_path, job_key, ssh_key, person_key, tmp_path / "known_hosts", fleet)
    try:
        yield made
    finally:
        fleet.stop()


def _pub(key: Path) -> str:
    return Path(f"{key}.pub").read_text().strip()


def _status(repo: Path, branch: str, name: str = "web") -> dict[str, object]:
    text = git("show", f"{branch}:status/{name}.yaml", cwd=repo)
    data = load_yaml("status.yaml", text.encode())
    assert isinstance(data, dict)
    return data


def _phase(repo: Path, branch: str) -> str | None:
    try:
        return str(_status(repo, branch).get("phase"))
    except (subprocess.CalledProcessError, AssertionError):
        return None


# -- plain sshd ----------------------------------------------------------------


def test_the_daemon_over_ssh_clones_pushes_and_survives_a_persons_racing_push(
    site: Site,
) -> None:
    bare = make_bare_repo(site.root, site.seed())
    server = SshServer.start(
        site.root / "sshd",
        client_pub=_pub(site.ssh_key),
        authorized_keys=f"{_pub(site.ssh_key)}\n{_pub(site.person_key)}\n",
    )
    try:
        site.known_hosts.write_text(server.known_hosts_line() + "\n")
        url = server.url(bare)
        # `reconciler run --once` over ssh:// with --ssh-key: clone, pass, push.
        once = subprocess.run(
            site.daemon_args(url, "--once"), capture_output=True, text=True, timeout=60
        )
        assert once.returncode == 0, once.stderr
        assert _phase(bare, "main") == "running"

        # A person clones over the same sshd and pushes while the daemon's
        # status commit is made but not yet pushed.
        work = site.root / "person"
        git("clone", "--quiet", url, str(work), cwd=site.root, env=site.person_env())
        pushed: list[str] = []

        def person_pushes(point: str) -> None:
            if point == "after_commit" and not pushed:
                change = {"nodes/extra.yaml": node_yaml("extra", site.fleet.url, {"role": "db"})}
                pushed.append(commit_and_push(work, change, "Add a node", env=site.person_env()))

        store = GitStore.open(
            url,
            "main",
            cache_dir=site.root / "cache",
            ssh_key=site.ssh_key,
            known_hosts=site.known_hosts,
        )
        store.crash_point = person_pushes
        metrics = Metrics()
        daemon = Daemon(
            store,
            AgentClient(load_private_key(site.job_key), timeout=2.0),
            log=EventLog(stream=io.StringIO()),
            metrics=metrics,
        )
        try:
            deadline = time.monotonic() + 60
            while _phase(bare, "main") != "completed":
                assert time.monotonic() < deadline, _status(bare, "main")
                daemon.run_pass()
                time.sleep(0.1)
        finally:
            daemon.client.close()
    finally:
        server.close()

    assert pushed, "the person's push never ran"
    assert metrics.registry.get_sample_value("reconciler_conflicts_total") == 1
    # The person's commit is in main's history; the daemon fast-forwarded onto it.
    git("merge-base", "--is-ancestor", pushed[0], "main", cwd=bare)
    assert git("show", "main:nodes/extra.yaml", cwd=bare)
    first_parents = git("rev-list", "--first-parent", "main", cwd=bare).split()
    assert pushed[0] in first_parents


# -- gitolite: the daemon's key may push only reconciler-status -----------------


@dataclass
class Gitolite:
    home: Path
    server: SshServer
    url: str

    @property
    def served(self) -> Path:
        return self.home / "repositories" / "fleet.git"


@pytest.fixture
def gitolite(site: Site) -> Iterator[Gitolite]:
    require_gitolite()
    home = site.root / "gitolite-home"
    made = make_key(site.root / "ssh" / "admin", comment="admin")
    admin, admin_pub = made.private, made.line
    gitolite_setup(
        home,
        Path(f"{admin}.pub"),
        "repo gitolite-admin\n    RW+ = admin\n"
        "repo fleet\n"
        "    RW+ = admin\n"
        "    RW main$ = person\n"
        "    RW reconciler-status$ = daemon\n"
        "    R = daemon person\n",
    )
    server = SshServer.start(
        site.root / "sshd-gitolite",
        client_pub=_pub(site.ssh_key),
        authorized_keys=gitolite_login(home, "admin", admin_pub)
        + gitolite_login(home, "daemon", _pub(site.ssh_key))
        + gitolite_login(home, "person", _pub(site.person_key)),
    )
    try:
        site.known_hosts.write_text(server.known_hosts_line() + "\n")
        yield Gitolite(home, server, f"ssh://{server.user}@127.0.0.1:{server.port}/fleet")
    finally:
        server.close()


def _push_seed(site: Site, gitolite: Gitolite, files: dict[str, str]) -> Path:
    seed = make_bare_repo(site.root, files, name="seed.git")
    work = clone(seed, site.root / "person")
    git("remote", "set-url", "origin", gitolite.url, cwd=work)
    git("push", "--quiet", "origin", "HEAD:main", cwd=work, env=site.person_env())
    return work


def test_with_a_status_branch_the_daemon_works_where_its_key_may_push(
    site: Site, gitolite: Gitolite
) -> None:
    settings = (
        "apiVersion: reconciler/v1\nkind: Settings\nspec: {statusBranch: reconciler-status}\n"
    )
    work = _push_seed(site, gitolite, site.seed(settings=settings))
    log = site.root / "daemon.log"
    with open(log, "w") as stderr:
        daemon = subprocess.Popen(
            site.daemon_args(gitolite.url, "--interval", "1s", "--poll", "1s"),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        # A person keeps working on main meanwhile, over the same sshd.
        person = commit_and_push(
            work,
            {"nodes/extra.yaml": node_yaml("extra", site.fleet.url, {"role": "db"})},
            "Add a node",
            env=site.person_env(),
        )
        deadline = time.monotonic() + 60
        while _phase(gitolite.served, "reconciler-status") != "completed":
            assert daemon.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(20)

    assert daemon.returncode == 0, log.read_text()
    assert git("rev-parse", "main", cwd=gitolite.served) == person  # main is the people's
    tree = git("ls-tree", "-r", "--name-only", "reconciler-status", cwd=gitolite.served).split()
    assert tree and all(path.startswith("status/") for path in tree)
    assert "DENIED" not in log.read_text()


def test_against_a_main_it_may_not_push_the_daemon_says_why_and_backs_off(
    site: Site, gitolite: Gitolite
) -> None:
    _push_seed(site, gitolite, site.seed())  # no statusBranch: status would go to main
    log = site.root / "daemon.log"
    with open(log, "w") as stderr:
        daemon = subprocess.Popen(
            site.daemon_args(gitolite.url, "--interval", "1s", "--poll", "1s"),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        time.sleep(9)
        assert daemon.poll() is None, "the daemon keeps running:\n" + log.read_text()
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(20)

    text = log.read_text()
    failures = [line for line in text.splitlines() if "pass_failed" in line]
    assert failures, text
    assert "W refs/heads/main fleet daemon DENIED" in failures[0]
    assert "statusBranch" in failures[0]
    # Backoff 1 s, 2 s, 4 s, ...: a handful of attempts in 9 s, not a hot loop.
    assert 2 <= len(failures) <= 5, text
    assert "retrying in 1s" in failures[0] and "retrying in 2s" in failures[1]
    assert daemon.returncode == 0, text
    # Nothing reached the server and no job was sent.
    assert "status/" not in git("ls-tree", "-r", "--name-only", "main", cwd=gitolite.served)
    assert site.fleet.stats()["totals"]["received"] == 0
