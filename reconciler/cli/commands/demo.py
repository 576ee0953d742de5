"""``reconciler demo``: the whole product on this machine, as a story."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "run the demo: a fleet repository, simulated agents and the daemon, on this machine"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir", type=Path, help="where to build the demo (default: a new temporary directory)"
    )


def run(args: argparse.Namespace) -> int:
    from reconciler.cli.demo_story import run_demo

    run_demo(args.dir)
    return 0
