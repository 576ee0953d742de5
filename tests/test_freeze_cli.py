"""``reconciler freeze`` and ``unfreeze`` (docs/cli.md, docs/rollouts.md):
the edit of ``reconciler.yaml`` keeps everything but the freezes byte for
byte, bad input gets an error that says what to do, and ``--push`` survives
the daemon's status commits. Real clones, a real bare repository, the
``reconciler`` command as a process."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from reconciler.cli import freeze_edits
from reconciler.spec.documents import parse_file
from reconciler.spec.errors import ReconcilerError
from reconciler.spec.times import parse_time
from tests.kit.git import OPERATOR, git, git_env
from tests.test_intent_push import origin_and_clones

COMMAND = [sys.executable, "-m", "reconciler"]
NOW = datetime(2026, 12, 2, 13, 0, 0, tzinfo=UTC)

SETTINGS = """\
# Fleet settings: comments like this one stay.
apiVersion: reconciler/v1
kind: Settings
spec:
  offlineAfter: 2m   # agents are slow to answer here
  freezes:
    # the release week
    - from: '2026-12-01T00:00:00Z'
      to: "2026-12-05T00:00:00Z"   # ends Saturday
      reason: release week
    - {from: "2027-01-01T00:00:00Z", to: "2027-01-02T00:00:00Z", reason: new year}
  # notifications: none yet
"""


def tree(tmp_path: Path, settings: str | None) -> Path:
    root = tmp_path / "fleet"
    (root / "rollouts").mkdir(parents=True)
    if settings is not None:
        (root / "reconciler.yaml").write_text(settings)
    return root


def freezes_of(text: str) -> list[tuple[datetime, datetime, str]]:
    parsed = parse_file("reconciler.yaml", text.encode())
    assert parsed.problems == () and parsed.settings is not None
    return [(f.start, f.end, f.reason) for f in parsed.settings.freezes]


def test_freeze_appends_one_line_and_keeps_every_comment(tmp_path: Path) -> None:
    root = tree(tmp_path, SETTINGS)

    edit = freeze_edits.freeze(root, now=NOW, until=NOW + timedelta(hours=2), reason="incident 7")

    new_line = (
        '    - {from: "2026-12-02T13:00:00Z", to: "2026-12-02T15:00:00Z", reason: "incident 7"}'
    )
    lines = SETTINGS.splitlines()
    assert edit.after.splitlines() == [*lines[:-1], new_line, lines[-1]]
    assert freezes_of(edit.after)[-1] == (NOW, NOW + timedelta(hours=2), "incident 7")
    assert edit.notes == ("already frozen until 2026-12-05T00:00:00Z (release week)",)


@pytest.mark.parametrize(
    "settings",
    [
        None,
        "apiVersion: reconciler/v1\nkind: Settings\n",
        "apiVersion: reconciler/v1\nkind: Settings\nspec:\n  offlineAfter: 2m\n",
        "apiVersion: reconciler/v1\nkind: Settings\nspec: {offlineAfter: 2m}\n",
        "apiVersion: reconciler/v1\nkind: Settings\nspec:\n  freezes: []  # none\n",
        "apiVersion: reconciler/v1\nkind: Settings\nspec:\n"
        "  freezes: [{from: '2026-11-01T00:00:00Z', to: '2026-11-02T00:00:00Z'}]  # old\n",
    ],
    ids=["no-file", "no-spec", "no-freezes", "flow-spec", "empty-list", "flow-list"],
)
def test_freeze_writes_a_file_the_daemon_reads_whatever_shape_it_had(
    tmp_path: Path, settings: str | None
) -> None:
    root = tree(tmp_path, settings)

    edit = freeze_edits.freeze(root, now=NOW, until=NOW + timedelta(minutes=30), reason="why")

    assert freezes_of(edit.after)[-1] == (NOW, NOW + timedelta(minutes=30), "why")
    for line in (settings or "").splitlines():
        if "#" in line:
            assert line.split("#", 1)[1] in edit.after


def test_unfreeze_ends_only_the_freezes_in_force(tmp_path: Path) -> None:
    root = tree(tmp_path, SETTINGS)
    frozen = freeze_edits.freeze(root, now=NOW, until=NOW + timedelta(hours=2), reason="incident")
    (root / "reconciler.yaml").write_text(frozen.after)
    later = NOW + timedelta(minutes=5)

    edit = freeze_edits.unfreeze(root, now=later)

    assert freezes_of(edit.after) == [
        (parse_time("2026-12-01T00:00:00Z"), later, "release week"),
        (parse_time("2027-01-01T00:00:00Z"), parse_time("2027-01-02T00:00:00Z"), "new year"),
        (NOW, later, "incident"),
    ]
    assert '      to: "2026-12-02T13:05:00Z"   # ends Saturday' in edit.after.splitlines()
    assert "# the release week" in edit.after and "# notifications: none yet" in edit.after
    assert edit.changes == (
        "spec.freezes[0].to: 2026-12-05T00:00:00Z -> 2026-12-02T13:05:00Z",
        "spec.freezes[2].to: 2026-12-02T15:00:00Z -> 2026-12-02T13:05:00Z",
    )


def test_unfreeze_in_the_second_the_freeze_began_still_leaves_a_valid_file(
    tmp_path: Path,
) -> None:
    root = tree(tmp_path, None)
    frozen = freeze_edits.freeze(root, now=NOW, until=NOW + timedelta(hours=1), reason="oops")
    (root / "reconciler.yaml").write_text(frozen.after)

    edit = freeze_edits.unfreeze(root, now=NOW)

    ((start, end, _),) = freezes_of(edit.after)
    assert start == NOW < end <= NOW + timedelta(seconds=1)


def test_unfreeze_with_nothing_in_force_changes_nothing(tmp_path: Path) -> None:
    root = tree(tmp_path, SETTINGS)

    edit = freeze_edits.unfreeze(root, now=parse_time("2026-12-20T00:00:00Z"))

    assert not edit.changed
    assert edit.notes == (
        "no freeze is in force now; 1 start later and stay (the next at 2027-01-01T00:00:00Z)",
    )


def test_a_settings_file_the_daemon_refuses_is_not_edited(tmp_path: Path) -> None:
    broken = "apiVersion: reconciler/v1\nkind: Settings\nspec:\n  offlineAfter: soon\n"
    root = tree(tmp_path, broken)

    with pytest.raises(ReconcilerError) as caught:
        freeze_edits.freeze(root, now=NOW, until=NOW + timedelta(hours=1), reason="x")

    assert caught.value.message.startswith("reconciler.yaml:4:17: spec.offlineAfter:")
    assert "fix it first" in caught.value.hint and "reconciler validate" in caught.value.hint
    assert (root / "reconciler.yaml").read_text() == broken


def reconcile(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, *argv],
        capture_output=True,
        text=True,
        env=git_env(*OPERATOR),
        check=False,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--for", "1h"], "the following arguments are required: --reason"),
        (["--reason", " ", "--for", "1h"], "--reason is empty"),
        (["--reason", "x"], "one of the arguments --for --until is required"),
        (
            ["--reason", "x", "--for", "1h", "--until", "2030-01-01T00:00:00Z"],
            "argument --until: not allowed with argument --for",
        ),
        (["--reason", "x", "--for", "soon"], "--for: not a duration: 'soon'"),
        (["--reason", "x", "--until", "tomorrow"], "--until: 'tomorrow' is not an RFC 3339 time"),
        (
            ["--reason", "x", "--until", "2020-01-01T00:00:00Z"],
            "--until 2020-01-01T00:00:00Z is not in the future",
        ),
    ],
)
def test_bad_input_is_a_usage_error_that_says_what_to_do(
    tmp_path: Path, argv: list[str], expected: str
) -> None:
    root = tree(tmp_path, SETTINGS)

    result = reconcile("freeze", "--repo", str(root), *argv)

    assert result.returncode == 2
    assert expected in result.stderr
    assert (root / "reconciler.yaml").read_text() == SETTINGS


def test_freeze_push_is_replayed_over_the_daemons_commit(tmp_path: Path) -> None:
    origin, [alice] = origin_and_clones(tmp_path, "alice")
    # The daemon commits status between alice's fetch and her push.
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

    frozen = reconcile("freeze", "--repo", str(alice), "--reason", "incident 7", "--for", "1h",
                       "--push")  # fmt: skip
    assert frozen.returncode == 0, frozen.stderr
    assert "(after 1 replay)" in frozen.stdout
    ended = reconcile("unfreeze", "--repo", str(alice), "--push")
    assert ended.returncode == 0, ended.stderr

    subjects = git("log", "--format=%s", "main", cwd=origin).splitlines()
    assert subjects[:3] == [
        "unfreeze reconciler.yaml",
        "freeze reconciler.yaml: incident 7",
        "status 1",
    ]
    ((start, end, reason),) = freezes_of(git("show", "main:reconciler.yaml", cwd=origin))
    assert reason == "incident 7" and start <= end <= datetime.now(UTC)
    assert git("status", "--porcelain", cwd=alice) == ""


def test_freeze_and_unfreeze_offer_push_and_the_remote_flags() -> None:
    for verb in ("freeze", "unfreeze"):
        result = reconcile(verb, "--help")
        assert result.returncode == 0
        for flag in ("--repo", "--commit", "--push", "--ssh-key", "--known-hosts"):
            assert flag in result.stdout
