"""``reconciler demo``: the whole product on this machine, as a story."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "run the demo: a fleet repository, simulated agents and the daemon, on this machine"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir", type=Path, help="where to build the demo (default: a new temporary directory)"
    )
    parser.add_argument(
        "--models",
        action="store_true",
        help="the model story on three real llama-server nodes: staged by digest, drained "
        "under client load, rolled back (needs $RECONCILER_LLAMA_SERVER, or make llama-server, "
        "and the demo extra's gguf)",
    )


def run(args: argparse.Namespace) -> int:
    if args.models:
        from reconciler.cli.demo_models import run_models_demo

        run_models_demo(args.dir)
        return 0
    from reconciler.cli.demo_story import run_demo

    run_demo(args.dir)
    return 0
