"""``reconciler agent``: the node agent (``reconciler.node.agent``) on one port.

Prints ``listening on HOST:PORT`` as its first line on stdout once it
accepts connections (useful with ``--listen 127.0.0.1:0``); with
``--log-format json``, that message as a JSON line with an ``address`` field. Started by
systemd socket activation, it serves on the socket it was handed and
``--listen`` is not bound.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import ssl
from pathlib import Path
from typing import Any

from reconciler.node.activation import inherited_socket
from reconciler.node.agent import (
    DEFAULT_AFTER_APPLY_TIMEOUT,
    DEFAULT_KEEP_ARTIFACTS,
    DEFAULT_KEEP_FIRST_BACKUPS,
    DEFAULT_RETENTION,
    Agent,
    AgentConfig,
    managed_runtimes,
    serve,
)
from reconciler.node.agent_config import SlotCommands
from reconciler.node.agent_log import AgentLog
from reconciler.node.artifact_download import tls_context
from reconciler.node.http_server import parse_listen
from reconciler.node.state_dir import StateDir
from reconciler.protocol.log_lines import log_line, now_text
from reconciler.protocol.signing import load_private_key, load_trusted_keys
from reconciler.protocol.tls import server_context
from reconciler.spec.durations import parse_duration
from reconciler.spec.errors import UsageError

# A runtime names a file, so no '/' (the job schema allows more; such a
# runtime is simply never managed here and is refused as unsupported_runtime).
RUNTIME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

HELP = "run the node agent: verify signed jobs, apply configs, keep backups"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node", required=True, metavar="NAME", help="this node's name")
    parser.add_argument(
        "--state-dir",
        required=True,
        metavar="DIR",
        help="runtime configs (DIR/runtimes/TYPE.yaml), job journal and backups",
    )
    parser.add_argument(
        "--trust-key",
        action="append",
        required=True,
        metavar="FILE",
        help="the daemon's OpenSSH public key (repeat to trust several, for rotation)",
    )
    parser.add_argument(
        "--key",
        metavar="FILE",
        help="this agent's OpenSSH Ed25519 private key: every answer is signed with it, and "
        "its .pub line goes into the node file as spec.agentKey "
        "(reconciler keys generate --out DIR --name agent)",
    )
    parser.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="serve HTTPS with this certificate (reconciler keys tls); the node file then "
        "says https:// and pins it with spec.agentCertSha256",
    )
    parser.add_argument("--tls-key", metavar="FILE", help="the private key of --tls-cert")
    parser.add_argument(
        "--runtime",
        action="append",
        metavar="TYPE",
        help="a runtime this agent manages (repeatable; default: those with a config file)",
    )
    parser.add_argument(
        "--listen",
        default="127.0.0.1:8710",
        metavar="HOST:PORT",
        help="default 127.0.0.1:8710 (not bound when systemd hands over a socket)",
    )
    parser.add_argument(
        "--allow-live-apply",
        action="store_true",
        help="accept live jobs (without it, only dry runs)",
    )
    parser.add_argument(
        "--after-apply",
        metavar="CMD",
        help="shell command run after each live change (job fields in RECONCILER_* "
        "variables); if it fails, the previous config is put back",
    )
    parser.add_argument(
        "--after-apply-timeout",
        default=f"{int(DEFAULT_AFTER_APPLY_TIMEOUT)}s",
        metavar="DURATION",
        help="how long --after-apply may run (default 60s)",
    )
    parser.add_argument(
        "--backup-retention",
        type=int,
        default=DEFAULT_RETENTION,
        metavar="N",
        help="backups kept per runtime (default 20; the first backup of each rollout "
        "is kept beyond that, see --keep-first-backups)",
    )
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="one line per job accepted, finished or refused on stderr: text for people "
        "(default), json for machines (then every line is JSON, the listening line on "
        "stdout and a fatal error included)",
    )
    _add_retention_arguments(parser)
    _add_artifact_arguments(parser)
    _add_slot_arguments(parser)


def _add_retention_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--keep-first-backups",
        default=f"{DEFAULT_KEEP_FIRST_BACKUPS // 3600}h",
        metavar="DURATION",
        help="keep a rollout's first backup beyond --backup-retention until the rollout "
        "has had no job here for this long (default 720h, 30 days)",
    )


def _add_artifact_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--drain-command",
        metavar="CMD",
        help="shell command run before a live apply that declares drain, to stop the "
        "runtime taking new requests (job fields in RECONCILER_* variables)",
    )
    parser.add_argument(
        "--undrain-command",
        metavar="CMD",
        help="shell command run once a drained node may take requests again "
        "(after warm-up, or after the previous config was put back)",
    )
    parser.add_argument(
        "--stage-rate",
        type=int,
        metavar="BYTES_PER_S",
        help="cap the download rate of stage jobs (default: uncapped)",
    )
    parser.add_argument(
        "--ca-file",
        metavar="FILE",
        help="PEM CA certificates trusted for https artifact downloads, besides the system store",
    )
    parser.add_argument(
        "--keep-artifacts",
        type=int,
        default=DEFAULT_KEEP_ARTIFACTS,
        metavar="N",
        help="artifacts kept per runtime beyond those the current and previous config "
        "and jobs not yet applied need (default 2)",
    )


SLOT_OPTIONS = (
    ("--slot-ports", "slot_ports"),
    ("--slot-start-command", "slot_start_command"),
    ("--slot-route-command", "slot_route_command"),
    ("--slot-stop-command", "slot_stop_command"),
)


def _add_slot_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--slot-ports",
        metavar="P1,P2",
        help="run two copies of each runtime, slot a on P1 and slot b on P2, for applies "
        "with a warm standby (docs/standby.md); needs the three --slot-*-command options",
    )
    parser.add_argument(
        "--slot-start-command",
        metavar="CMD",
        help="shell command that starts a slot on RECONCILER_SLOT_PORT with the config "
        "in RECONCILER_CONFIG",
    )
    parser.add_argument(
        "--slot-route-command",
        metavar="CMD",
        help="shell command that sends the runtime's traffic to slot RECONCILER_SLOT, in one step",
    )
    parser.add_argument(
        "--slot-stop-command",
        metavar="CMD",
        help="shell command that stops slot RECONCILER_SLOT (and nothing else)",
    )


def _slot_settings(args: argparse.Namespace) -> SlotCommands | None:
    """The slots the four --slot-* options declare: all four, or none."""
    given = [flag for flag, name in SLOT_OPTIONS if getattr(args, name)]
    if not given:
        return None
    missing = [flag for flag, name in SLOT_OPTIONS if not getattr(args, name)]
    if missing:
        raise UsageError(
            f"{', '.join(given)} without {', '.join(missing)}: a warm standby needs all four "
            "--slot-* options (or none)"
        )
    try:
        ports = tuple(int(p) for p in args.slot_ports.split(","))
    except ValueError:
        ports = ()
    if len(ports) != 2 or ports[0] == ports[1] or not all(0 < p < 65536 for p in ports):
        raise UsageError(
            f"--slot-ports {args.slot_ports!r}: give two different ports, as P1,P2 "
            "(slot a listens on P1, slot b on P2)"
        )
    return SlotCommands(
        ports=(ports[0], ports[1]),
        start=args.slot_start_command,
        route=args.slot_route_command,
        stop=args.slot_stop_command,
    )


def _artifact_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The AgentConfig fields of the artifact options, checked."""
    if args.stage_rate is not None and args.stage_rate < 1:
        raise UsageError("--stage-rate must be a positive number of bytes per second")
    if args.keep_artifacts < 0:
        raise UsageError("--keep-artifacts must be 0 or more")
    if args.ca_file is not None:
        try:
            tls_context(args.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(
                f"--ca-file {args.ca_file}: cannot load it as PEM CAs ({exc})"
            ) from None
    return {
        "drain_command": args.drain_command,
        "undrain_command": args.undrain_command,
        "stage_rate": args.stage_rate,
        "ca_file": args.ca_file,
        "keep_artifacts": args.keep_artifacts,
    }


def run(args: argparse.Namespace) -> int:
    try:
        host, port = parse_listen(args.listen)
        timeout = parse_duration(args.after_apply_timeout)
        keep_first = parse_duration(args.keep_first_backups)
        sock = inherited_socket()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.backup_retention < 1:
        raise UsageError("--backup-retention must be at least 1")
    artifact_settings = _artifact_settings(args)
    slots = _slot_settings(args)
    for runtime in args.runtime or ():
        if not RUNTIME_NAME.fullmatch(runtime):
            raise UsageError(
                f"--runtime {runtime!r}: use letters, digits, '.', '_' and '-' "
                "(it names the file STATE/runtimes/TYPE.yaml)"
            )
    trusted = load_trusted_keys([Path(p) for p in args.trust_key])
    key = load_private_key(Path(args.key)) if args.key else None
    if bool(args.tls_cert) != bool(args.tls_key):
        raise UsageError("--tls-cert and --tls-key go together: pass both, or neither")
    tls = server_context(Path(args.tls_cert), Path(args.tls_key)) if args.tls_cert else None
    state = StateDir.open(Path(args.state_dir))
    try:
        runtimes = managed_runtimes(args.runtime, state, slotted=slots is not None)
        if not runtimes:
            raise UsageError(
                f"no runtime to manage: {state.runtimes} has no TYPE.yaml; pass --runtime TYPE"
            )
        agent = Agent(
            AgentConfig(
                node=args.node,
                trusted=trusted,
                runtimes=runtimes,
                allow_live=args.allow_live_apply,
                after_apply=args.after_apply,
                after_apply_timeout=float(timeout),
                backup_retention=args.backup_retention,
                key=key,
                keep_first_backups=keep_first,
                slots=slots,
                **artifact_settings,
            ),
            state,
            log=AgentLog(args.log_format),
        )

        def ready(address: str) -> None:
            print(listening_line(args.log_format, address), flush=True)
            agent.log.ready(address)

        async def main() -> None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, stop.set)
            await serve(agent, host, port, ready=ready, stop=stop, tls=tls, sock=sock)

        try:
            asyncio.run(main())
        finally:
            agent.close()  # waits for the job in progress
    finally:
        state.close()
    return 0


def listening_line(fmt: str, address: str) -> str:
    """The first line on stdout once the agent serves: ``listening on
    HOST:PORT``, or that message as a JSON log line with ``address``."""
    message = f"listening on {address}"
    if fmt == "json":
        return log_line("json", now_text(), "info", "listening", message, {"address": address})
    return message
