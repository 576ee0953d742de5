"""The version says where the project is: ``reconciler --version`` prints
the newest version CHANGELOG.md lists as released, the changelog lists
every released version from the first, and the package's metadata takes
its version from the same one place."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from reconciler import __version__

ROOT = Path(__file__).resolve().parent.parent
RELEASED = re.compile(r"(?m)^## (\d+)\.(\d+)\.(\d+)\s*$")


def released_versions() -> list[tuple[int, int, int]]:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    return [(int(a), int(b), int(c)) for a, b, c in RELEASED.findall(text)]


def test_the_command_prints_the_newest_released_version_of_the_changelog() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "reconciler", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )

    newest = ".".join(map(str, released_versions()[0]))
    assert done.stdout == f"reconciler {newest}\n"
    assert __version__ == newest


def test_the_changelog_lists_every_released_version_newest_first_under_unreleased() -> None:
    versions = released_versions()
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")

    assert versions == sorted(versions, reverse=True)
    majors = sorted({major for major, _, _ in versions})
    assert majors == list(range(1, majors[-1] + 1))  # no released version left out
    assert text.index("## Unreleased") < text.index(f"## {'.'.join(map(str, versions[0]))}")


def test_the_package_metadata_takes_the_version_from_the_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))

    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["hatch"]["version"]["path"] == "reconciler/__init__.py"
