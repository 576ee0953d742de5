"""The built wheel carries what an installed reconciler needs at run time:
the schemas, the example repository for `init` and `demo`, and the command."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from reconciler import __version__

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_carries_schemas_examples_and_the_console_script(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    # The distribution is fleet-rollout-reconciler (`reconciler` on PyPI is
    # someone else's); the import package and the command keep their name.
    (wheel,) = tmp_path.glob("fleet_rollout_reconciler-*.whl")
    assert wheel.name.startswith(f"fleet_rollout_reconciler-{__version__}-")
    names = set(zipfile.ZipFile(wheel).namelist())

    for schema in (
        "node",
        "rollout",
        "settings",
        "rollout-status",
        "job",
        "deployment-attestation",
    ):
        assert f"reconciler/schemas/{schema}.schema.json" in names
    assert "reconciler/example-repo/rollouts/llama-canary.yaml" in names
    assert "reconciler/example-repo/nodes/gpu-a1.yaml" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert (
        "reconciler = reconciler.cli.main:main"
        in zipfile.ZipFile(wheel).read(entry_points).decode()
    )
