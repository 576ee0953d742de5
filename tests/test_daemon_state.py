"""The daemon's state directory: one folder per repository and branch,
files written whole, and errors that say what to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.daemon.state import DaemonState, StateDirError, default_state_root


def test_each_repository_and_branch_gets_its_own_folder(tmp_path: Path) -> None:
    a = DaemonState.for_branch(tmp_path, str(tmp_path / "fleet.git"), "main")
    b = DaemonState.for_branch(tmp_path, str(tmp_path / "other" / "fleet.git"), "main")
    c = DaemonState.for_branch(tmp_path, str(tmp_path / "fleet.git"), "prod")
    d = DaemonState.for_branch(tmp_path, "ssh://git@forge.example/fleet.git", "main")

    assert len({a.folder, b.folder, c.folder, d.folder}) == 4
    assert a.folder.parent == tmp_path and a.folder.name.startswith("fleet.git-main-")
    # the same repository named through another path is the same folder
    again = DaemonState.for_branch(tmp_path, str(tmp_path / "x" / ".." / "fleet.git"), "main")
    assert again.folder == a.folder


def test_written_text_reads_back_private_and_replaces_the_old(tmp_path: Path) -> None:
    state = DaemonState(tmp_path / "state" / "one")
    assert state.read("acted") is None

    state.write("acted", "abc\n")
    state.write("acted", "def\n")

    assert state.read("acted") == "def\n"
    assert (state.folder / "acted").stat().st_mode & 0o777 == 0o600
    assert state.folder.stat().st_mode & 0o777 == 0o700
    assert sorted(p.name for p in state.folder.iterdir()) == ["acted"]


def test_an_unwritable_state_directory_is_an_error_naming_the_flag(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")

    with pytest.raises(StateDirError) as refused:
        DaemonState(blocker / "one").write("acted", "abc")

    assert str(blocker / "one" / "acted") in refused.value.message
    assert "run --state-dir" in (refused.value.hint or "")


def test_the_default_root_follows_xdg_state_home(tmp_path: Path) -> None:
    assert default_state_root({"XDG_STATE_HOME": str(tmp_path)}) == tmp_path / "reconciler"
    assert default_state_root({}) == Path.home() / ".local" / "state" / "reconciler"
