"""``reconciler sim-fleet``: many simulated node agents on one port
(``reconciler.simulation.fleet``), for tests, benchmarks and the demo.

Prints ``listening on HOST:PORT`` as its first line on stdout once it
accepts connections, so callers can start it on port 0.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from reconciler.node.http_server import parse_listen
from reconciler.protocol.signing import load_trusted_keys
from reconciler.simulation.fleet import (
    Script,
    ScriptError,
    SimFleet,
    load_script,
    node_names,
    serve,
)
from reconciler.spec.errors import UsageError

HELP = "serve many simulated node agents on one port, with scripted behaviour"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=0, metavar="N", help="number of nodes")
    parser.add_argument(
        "--state-dir", required=True, metavar="DIR", help="where the job journal is kept"
    )
    parser.add_argument(
        "--trust-key",
        action="append",
        required=True,
        metavar="FILE",
        help="OpenSSH public key whose signed jobs are accepted (repeat for rotation)",
    )
    parser.add_argument(
        "--listen", default="127.0.0.1:0", metavar="HOST:PORT", help="default 127.0.0.1:0"
    )
    parser.add_argument(
        "--behaviour",
        metavar="FILE",
        help="YAML script of per-node behaviour, re-read when it changes "
        "(the format: pydoc reconciler.simulation.fleet)",
    )
    parser.add_argument(
        "--node-prefix",
        default="sim-",
        metavar="PREFIX",
        help="node names are PREFIX0001, PREFIX0002, ... (default: sim-)",
    )
    parser.add_argument(
        "--key-seed",
        metavar="TEXT",
        help="sign every node's answers with its own key derived from TEXT and the node "
        "name (protocol.evidence.derived_agent_key), so node files can carry spec.agentKey",
    )
    parser.add_argument(
        "--ignore-wait",
        action="store_true",
        help="answer GET .../jobs/ID?wait= at once, as an agent without held answers does",
    )
    parser.add_argument(
        "--runtime",
        action="append",
        metavar="TYPE",
        help="runtime types each node manages (repeatable; default hermes)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        host, port = parse_listen(args.listen)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    trusted = load_trusted_keys([Path(p) for p in args.trust_key])
    behaviour = Path(args.behaviour) if args.behaviour else None
    try:
        script = load_script(behaviour) if behaviour else Script()
    except ScriptError as exc:
        raise UsageError(str(exc)) from None
    names = list(script.names) if script.names else node_names(args.nodes, args.node_prefix)
    if not names:
        raise UsageError("no nodes: pass --nodes N or list names in the behaviour file")
    fleet = SimFleet(
        names=names,
        trusted=trusted,
        state_dir=Path(args.state_dir),
        runtimes=args.runtime or ["hermes"],
        script=script,
        key_seed=args.key_seed,
    )
    fleet.ignore_wait = args.ignore_wait

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await serve(
            fleet,
            host,
            port,
            behaviour_path=behaviour,
            ready=lambda address: _ready(address, len(fleet.nodes)),
            stop=stop,
        )

    asyncio.run(main())
    return 0


def _ready(address: str, count: int) -> None:
    print(f"listening on {address}", flush=True)
    print(f"sim-fleet: {count} simulated nodes", file=sys.stderr, flush=True)
