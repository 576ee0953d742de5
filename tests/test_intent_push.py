"""``pause|resume|abort|rollback --push``: the edit reaches the remote even
when the daemon (or another person) pushed between the person's fetch and
push. Real clones, a real bare repository, the daemon's own commit path
(``GitStore.commit``), the ``reconciler`` command as a process."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from reconciler.git.store import GitStore
from reconciler.spec.errors import RefMoved
from tests.kit.documents import node_yaml
from tests.kit.git import OPERATOR, git, git_env, make_repo

ROLLOUTS = {
    name: (
        "apiVersion: reconciler/v1\nkind: Rollout\n"
        f"metadata: {{name: {name}}}\n"
        "spec:\n"
        "  target: {runtime: hermes, provider: ollama, model: llama3.1-8b}\n"
        "  selector: {role: canary}\n"
        "  batchSize: 1\n"
    )
    for name in ("alpha", "beta")
}
COMMAND = [sys.executable, "-m", "reconciler"]


def origin_and_clones(tmp_path: Path, *people: str) -> tuple[Path, list[Path]]:
    seed = make_repo(
        tmp_path / "seed",
        {
            "nodes/gpu-a1.yaml": node_yaml("gpu-a1", maintenance=None),
            **{f"rollouts/{n}.yaml": text for n, text in ROLLOUTS.items()},
        },
    )
    origin = tmp_path / "origin.git"
    git("clone", "--quiet", "--bare", str(seed), str(origin), cwd=tmp_path)
    clones = []
    for person in people:
        clone = tmp_path / person
        git("clone", "--quiet", str(origin), str(clone), cwd=tmp_path)
        clones.append(clone)
    return origin, clones


def daemon_commit(origin: Path, n: int) -> None:
    """One status commit, the way the daemon writes it."""
    store = GitStore.open(str(origin), "main")
    while True:
        tip = store.refresh()
        try:
            store.commit("main", tip, {"status/README.md": f"# pass {n}\n".encode()}, f"status {n}")
            return
        except RefMoved:
            continue


def reconcile(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = git_env(*OPERATOR)
    return subprocess.run(
        [*COMMAND, *argv], capture_output=True, text=True, env=env, check=False, timeout=120
    )


def remote_file(origin: Path, path: str) -> str:
    return git("show", f"main:{path}", cwd=origin, strip=False)


def test_a_push_refused_because_the_daemon_pushed_first_is_replayed(tmp_path: Path) -> None:
    origin, [alice] = origin_and_clones(tmp_path, "alice")
    # The daemon commits status right after alice fetched: her first push is
    # refused as non-fast-forward. (A pre-push hook in her clone makes the
    # race happen every time.)
    marker = tmp_path / "raced"
    hook = alice / ".git" / "hooks" / "pre-push"
    hook.write_text(
        f"#!{sys.executable}\n"
        "import pathlib, sys\n"
        f"marker = pathlib.Path({str(marker)!r})\n"
        "if not marker.exists():\n"
        "    marker.touch()\n"
        f"    sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "    from test_intent_push import daemon_commit\n"
        f"    daemon_commit(pathlib.Path({str(origin)!r}), 1)\n"
    )
    hook.chmod(0o755)

    result = reconcile(tmp_path, "pause", "alpha", "--repo", str(alice), "--push", "-m", "why")

    assert result.returncode == 0, result.stderr
    assert "pushed" in result.stdout and "(after 1 replay)" in result.stdout
    assert "paused: true" in remote_file(origin, "rollouts/alpha.yaml")
    assert remote_file(origin, "status/README.md") == "# pass 1\n"  # the daemon's commit kept
    subjects = git("log", "--format=%s", "main", cwd=origin).splitlines()
    assert subjects[:2] == ["pause alpha: why", "status 1"]
    assert git("status", "--porcelain", cwd=alice) == ""  # nothing left for a hand-run git pull


def test_two_people_and_the_daemon_pushing_at_once_lose_no_edit(tmp_path: Path) -> None:
    origin, [alice, bob] = origin_and_clones(tmp_path, "alice", "bob")
    stop = threading.Event()
    passes: list[int] = []

    def daemon() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            daemon_commit(origin, n)
            passes.append(n)
            stop.wait(1.0)  # a status commit every second: five per default --interval

    thread = threading.Thread(target=daemon)
    thread.start()
    try:
        env = git_env(*OPERATOR)
        people = [
            subprocess.Popen(
                [*COMMAND, verb, name, "--repo", str(clone), "--push"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for verb, name, clone in (("pause", "alpha", alice), ("abort", "beta", bob))
        ]
        outputs = [p.communicate(timeout=120) for p in people]
    finally:
        stop.set()
        thread.join()

    for person, (out, err) in zip(people, outputs, strict=True):
        assert person.returncode == 0, err
        assert "pushed" in out
    assert "paused: true" in remote_file(origin, "rollouts/alpha.yaml")
    assert "abort: true" in remote_file(origin, "rollouts/beta.yaml")
    subjects = git("log", "--format=%s", "main", cwd=origin).splitlines()
    assert "pause alpha" in subjects and "abort beta" in subjects
    # every status commit the daemon made is still on the branch
    assert sorted(s for s in subjects if s.startswith("status ")) == sorted(
        f"status {n}" for n in passes
    )


def test_push_without_an_upstream_says_how_to_set_one(tmp_path: Path) -> None:
    seed = make_repo(tmp_path / "alone", {f"rollouts/{n}.yaml": t for n, t in ROLLOUTS.items()})

    result = reconcile(tmp_path, "pause", "alpha", "--repo", str(seed), "--push")

    assert result.returncode == 1
    assert "branch 'main' tracks no remote branch" in result.stderr
    assert "git branch --set-upstream-to=origin/main" in result.stderr
    assert "paused" not in (seed / "rollouts" / "alpha.yaml").read_text()


def test_push_refuses_to_carry_unpushed_commits_along(tmp_path: Path) -> None:
    _, [alice] = origin_and_clones(tmp_path, "alice")
    (alice / "notes.txt").write_text("mine\n")
    git("add", "notes.txt", cwd=alice)
    git("commit", "--quiet", "-m", "local work", cwd=alice)

    result = reconcile(tmp_path, "pause", "alpha", "--repo", str(alice), "--push")

    assert result.returncode == 1
    assert "your branch has 1 commit(s) not on origin/main" in result.stderr


@pytest.mark.parametrize("verb", ["pause", "resume", "abort", "rollback", "skip"])
def test_every_intent_verb_offers_push(verb: str) -> None:
    result = subprocess.run(
        [*COMMAND, verb, "--help"], capture_output=True, text=True, check=True, env=dict(os.environ)
    )
    assert "--push" in result.stdout
    assert "cannot conflict" in " ".join(result.stdout.split())
