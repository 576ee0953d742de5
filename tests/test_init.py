"""``reconciler init``: a new fleet repository seeded from the examples."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from reconciler.cli import main as cli
from reconciler.cli.examples import example_dir
from reconciler.spec.documents import parse_file
from tests.kit.git import git

REPO = Path(__file__).resolve().parent.parent
LIVE = re.compile(r"^\s*live:\s*true\b", re.MULTILINE)


def seeded_files(directory: Path) -> set[str]:
    skipped = {".keep", "status"}
    return {
        p.relative_to(directory).as_posix()
        for p in directory.rglob("*")
        if p.is_file()
        and not skipped & set(p.relative_to(directory).parts)
        and ".git" not in p.relative_to(directory).parts
    }


def test_init_makes_a_bare_origin_and_a_clone_with_the_first_commit_pushed(
    tmp_path: Path, identity: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["init", str(tmp_path / "lab")])

    assert code == 0
    origin, clone = tmp_path / "lab/fleet.git", tmp_path / "lab/fleet"
    assert git("rev-parse", "--is-bare-repository", cwd=origin).strip() == "true"
    tip = git("rev-parse", "refs/heads/main", cwd=origin).strip()
    assert git("rev-parse", "HEAD", cwd=clone).strip() == tip
    assert git("rev-parse", "--abbrev-ref", "HEAD", cwd=clone).strip() == "main"
    assert git("rev-parse", "--abbrev-ref", "main@{upstream}", cwd=clone).strip() == "origin/main"
    assert git("status", "--porcelain", cwd=clone) == ""
    # settings and one node to copy: nothing that starts a rollout
    assert set(git("ls-files", cwd=clone).split()) == {"reconciler.yaml", "nodes/node-1.yaml"}
    assert (clone / "reconciler.yaml").read_bytes() == (
        example_dir() / "reconciler.yaml"
    ).read_bytes()
    assert git("log", "-1", "--format=%an", cwd=clone).strip() == "Alice Operator"
    out = capsys.readouterr().out
    assert f"created {origin}" in out
    assert f"reconciler run --repo {origin}" in out


def test_init_bare_makes_one_bare_repository(tmp_path: Path, identity: dict[str, str]) -> None:
    target = tmp_path / "fleet.git"

    assert cli.main(["init", str(target), "--bare"]) == 0

    assert git("rev-parse", "--is-bare-repository", cwd=target).strip() == "true"
    files = set(git("ls-tree", "-r", "--name-only", "main", cwd=target).split())
    assert files == {"reconciler.yaml", "nodes/node-1.yaml"}
    assert not (tmp_path / "fleet").exists()


def test_init_examples_seeds_every_example_with_each_rollout_a_dry_run(
    tmp_path: Path, identity: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["init", str(tmp_path / "lab"), "--examples"]) == 0

    clone = tmp_path / "lab/fleet"
    committed = set(git("ls-files", cwd=clone).split())
    assert committed == seeded_files(example_dir())
    assert "deploy/reconciler.service" in committed
    assert not any(f.startswith("status/") for f in committed)
    rollouts = sorted((clone / "rollouts").glob("*.yaml"))
    live_examples = [
        p.name for p in (example_dir() / "rollouts").glob("*.yaml") if LIVE.search(p.read_text())
    ]
    assert live_examples, "the shipped examples include live rollouts"
    assert rollouts and not [p.name for p in rollouts if LIVE.search(p.read_text())]
    capsys.readouterr()
    assert cli.main(["validate", str(clone)]) == 0


def test_the_daemon_on_a_fresh_init_starts_nothing(
    tmp_path: Path, identity: dict[str, str]
) -> None:
    """Following init's own next steps (``run ... --once``) sends no job."""
    import os
    import subprocess
    import sys

    assert cli.main(["init", str(tmp_path / "lab")]) == 0
    assert cli.main(["keys", "generate", "--out", str(tmp_path / "keys")]) == 0
    origin = tmp_path / "lab/fleet.git"
    daemon = subprocess.run(
        [sys.executable, "-m", "reconciler", "run", "--repo", str(origin),
         "--key", str(tmp_path / "keys/reconciler"), "--once"],
        env=os.environ.copy(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert daemon.returncode == 0, daemon.stdout + daemon.stderr
    files = set(git("ls-tree", "-r", "--name-only", "main", cwd=origin).split())
    rollout_statuses = {
        f
        for f in files
        if f.startswith("status/") and f not in {"status/README.md", "status/fleet.yaml"}
    }
    assert rollout_statuses == set()
    assert "0 transitions, 0 jobs sent" in daemon.stderr


def test_init_never_overwrites(
    tmp_path: Path, identity: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "lab/fleet").mkdir(parents=True)
    (tmp_path / "lab/fleet/notes.txt").write_text("mine")

    assert cli.main(["init", str(tmp_path / "lab")]) == 1

    assert "already exists and is not empty" in capsys.readouterr().err
    assert not (tmp_path / "lab/fleet.git").exists()
    assert (tmp_path / "lab/fleet/notes.txt").read_text() == "mine"


def test_a_failed_init_leaves_nothing_so_the_retry_works(
    tmp_path: Path, identity: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # No identity: git refuses the first commit (useConfigOnly: no guessing).
    for key in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL"):
        monkeypatch.delenv(key)
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "user.useConfigOnly")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", "true")
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "notes.txt").write_text("mine\n")

    assert cli.main(["init", str(tmp_path / "lab")]) == 1
    assert cli.main(["init", str(tmp_path / "bare.git"), "--bare"]) == 1

    assert sorted(p.name for p in (tmp_path / "lab").iterdir()) == ["notes.txt"]
    assert not (tmp_path / "bare.git").exists()
    for key, value in identity.items():
        if key.startswith("GIT_AUTHOR") or key.startswith("GIT_COMMITTER"):
            monkeypatch.setenv(key, value)
    assert cli.main(["init", str(tmp_path / "lab")]) == 0
    assert cli.main(["init", str(tmp_path / "bare.git"), "--bare"]) == 0


def test_init_piped_into_head_ends_without_a_traceback(tmp_path: Path) -> None:
    """`reconciler init DIR | head -1`: the reader has gone before the
    output is flushed. A pipe whose reading end is already closed makes
    that certain."""
    import os
    import subprocess
    import sys

    from tests.kit.git import OPERATOR, git_env

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "reconciler", "init", str(tmp_path / "lab")],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env=git_env(*OPERATOR),
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.returncode == 0
    assert (tmp_path / "lab" / "fleet.git").is_dir()


def test_the_seeded_settings_file_shows_every_settings_field() -> None:
    """A new user reads the file init writes to learn what settings exist:
    each field of the settings schema is in it, set or as a commented
    example, and uncommenting every example still validates."""
    text = (example_dir() / "reconciler.yaml").read_text()
    schema = json.loads((REPO / "schemas" / "settings.schema.json").read_text())
    fields = schema["properties"]["spec"]["properties"]

    missing = [f for f in fields if not re.search(rf"(?m)^  #? ?{f}:", text)]

    assert missing == []
    uncommented = re.sub(r"(?m)^  # ([a-zA-Z]+:|  -|    [a-zA-Z]+:)", r"  \1", text)
    assert uncommented != text
    parsed = parse_file("reconciler.yaml", uncommented.encode())
    assert parsed.problems == ()
    assert parsed.settings is not None and len(parsed.settings.approval_rules) == 2
