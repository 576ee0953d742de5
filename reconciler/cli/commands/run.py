"""``reconciler run``: the daemon."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.cli.remote_options import REPO_ENV, add_remote_arguments, repo_default
from reconciler.spec.errors import UsageError, redact_url

if TYPE_CHECKING:  # imported when run, so that other verbs never pay for them
    from collections.abc import Callable

    from reconciler.daemon.agent_client import AgentClient
    from reconciler.daemon.crashpoints import CrashPoints
    from reconciler.daemon.logs import EventLog
    from reconciler.daemon.loop import Daemon
    from reconciler.daemon.metrics import Metrics
    from reconciler.daemon.notifications import Notifier
    from reconciler.daemon.state import DaemonState
    from reconciler.daemon.web_server import WebServer
    from reconciler.git.approval import Approver
    from reconciler.git.sshsig import AllowedSigner
    from reconciler.git.store import GitStore
    from reconciler.protocol.signing import SigningKey

HELP = "run the reconcile daemon against a fleet repository"


def _seconds(text: str) -> float:
    from reconciler.spec.durations import parse_duration

    try:
        return float(parse_duration(text))
    except ValueError:
        try:
            value = float(text.rstrip("s"))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"not a duration: {text!r} (e.g. 5s, 500ms is 0.5s)"
            ) from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be more than zero: {text!r}") from None
        return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_repository_arguments(parser)
    _add_trust_arguments(parser)
    _add_running_arguments(parser)


def _add_repository_arguments(parser: argparse.ArgumentParser) -> None:
    """Which repository and branch, the daemon's key, and how often it passes."""
    default = repo_default()
    parser.add_argument(
        "--repo",
        required=default is None,
        default=default,
        metavar="PATH_OR_URL",
        help="a bare repository's path, or a remote URL (file://, ssh://, https://); "
        f"default: ${REPO_ENV}",
    )
    parser.add_argument("--branch", default="main", help="the branch to act on (default: main)")
    parser.add_argument(
        "--key",
        required=True,
        type=Path,
        metavar="FILE",
        help="the daemon's OpenSSH Ed25519 private key (reconciler keys generate)",
    )
    parser.add_argument("--once", action="store_true", help="run one pass and exit")
    parser.add_argument(
        "--interval",
        type=_seconds,
        default=5.0,
        metavar="DURATION",
        help="time between passes while a rollout is active (default: 5s)",
    )
    parser.add_argument(
        "--poll",
        type=_seconds,
        default=15.0,
        metavar="DURATION",
        help="how often a remote is fetched when nothing is active (default: 15s)",
    )


def _add_trust_arguments(parser: argparse.ArgumentParser) -> None:
    """Which spec commits it acts on, and whether it signs its own (docs/trust.md)."""
    parser.add_argument(
        "--allowed-signers",
        type=Path,
        metavar="FILE",
        help="act only on spec commits signed by these keys (git's allowed-signers format)",
    )
    parser.add_argument(
        "--require-approvals",
        type=int,
        default=0,
        metavar="N",
        help="with --allowed-signers: a spec commit also needs N reviewers' signed approvals "
        "(reconciler approve), none by its own signer",
    )
    parser.add_argument(
        "--allowed-pgp-keys",
        type=Path,
        metavar="FILE",
        help="armored OpenPGP public keys whose signatures count too (a forge's merge key)",
    )
    parser.add_argument(
        "--sign-commits", action="store_true", help="sign status commits with the daemon's key"
    )


def _add_running_arguments(parser: argparse.ArgumentParser) -> None:
    """Metrics, logs, the remote's mirror and how it talks to agents."""
    parser.add_argument(
        "--metrics",
        metavar="HOST:PORT",
        help="serve Prometheus metrics here (/metrics) and a health answer (/healthz)",
    )
    parser.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve the read API and the web page here (docs/web.md); port 0 picks a free "
        "one, logged at start; the same address as --metrics serves /metrics too",
    )
    parser.add_argument(
        "--http-token-file",
        type=Path,
        metavar="FILE",
        help="with --http: every request but /healthz needs Authorization: Bearer and the "
        "token in FILE; without it only 127.0.0.1 and ::1 are served",
    )
    parser.add_argument(
        "--http-allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="with --http: answer requests whose Host header names NAME too (a reverse "
        "proxy that passes its own name); repeatable. Without it only the served address "
        "(and localhost, when that is a loopback address) is answered",
    )
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="text: one line per event for people (default); json: one object per line",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="where the daemon keeps what must survive a restart and no push may change "
        "(default: $XDG_STATE_HOME/reconciler, else ~/.local/state/reconciler)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        metavar="DIR",
        help="where a remote's mirror is kept (default: ~/.cache)",
    )
    add_remote_arguments(parser)
    parser.add_argument(
        "--plain",
        action="store_true",
        help="read and step everything afresh on every pass, with no caches and no "
        "shortcuts (slower; decides exactly what the default mode does)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=64,
        metavar="N",
        help="agent requests in flight at once (default: 64)",
    )
    parser.add_argument(
        "--agent-timeout",
        type=_seconds,
        default=5.0,
        metavar="DURATION",
        help="how long one agent request may take before the agent counts as unreachable "
        "(default: 5s)",
    )


class _StartUp:
    """SIGTERM and SIGINT while the daemon starts (imports, opening or
    cloning the repository, loading keys) are noted, not acted on at once:
    raising from a signal handler inside libgit2's callbacks or an import
    ends in a traceback. Start-up checks ``stop`` between its steps and ends
    cleanly; once serving, ``stop_on_signals`` takes over."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._old = {s: signal.signal(s, self._note) for s in (signal.SIGTERM, signal.SIGINT)}

    def _note(self, signum: int, frame: object) -> None:
        self.signal = signum

    def check(self) -> None:
        if self.signal is not None:
            raise _StoppedEarly(signal.Signals(self.signal).name)

    def restore(self) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)


class _StoppedEarly(Exception):
    pass


def run(args: argparse.Namespace) -> int:
    start_up = _StartUp()
    try:
        from reconciler.daemon.logs import EventLog, routed_logging

        log = EventLog(args.log_format)
        with routed_logging(log):  # every line of the process in one format
            return _run(args, start_up, log)
    except _StoppedEarly as stopped:
        message = f"reconciler run: stopped by {stopped} during start-up"
        if args.log_format == "json":
            log.info("stopped", message)
        else:
            print(message, file=sys.stderr)
        return 0
    finally:
        start_up.restore()


def _run(args: argparse.Namespace, start_up: _StartUp, log: EventLog) -> int:
    from reconciler.daemon.agent_client import AgentClient
    from reconciler.daemon.crashpoints import CrashPoints
    from reconciler.daemon.loop import Daemon
    from reconciler.daemon.metrics import Metrics
    from reconciler.daemon.soft_state import SoftState
    from reconciler.daemon.state import DaemonState, default_state_root
    from reconciler.protocol.signing import load_private_key
    from reconciler.spec.safe_yaml import loader_warning

    start_up.check()
    _check_arguments(args)
    warning = loader_warning()
    if warning:
        log.warning("yaml_loader", warning)
    key = load_private_key(args.key)
    crash_points = CrashPoints.from_environ(os.environ)
    store = _open_store(args, crash_points)
    start_up.check()
    approver = _approver(store, args)
    metrics = Metrics()
    if args.metrics and args.metrics != args.http:
        _serve_metrics(args, log, metrics)
    web = _web_server(args, log, metrics)
    sign, status_signers = _commit_signing(args, key, approver, log)
    state = DaemonState.for_branch(args.state_dir or default_state_root(), args.repo, args.branch)
    notifier = _notifier(store, approver, log, metrics, state)
    soft = SoftState()
    client = AgentClient(  # signatures checked as answers arrive, by the passes' check
        key,
        concurrency=args.concurrency,
        timeout=args.agent_timeout,
        on_signed=soft.answers.prepare,
    )
    daemon = Daemon(
        store,
        client,
        log=log,
        metrics=metrics,
        approver=approver,
        sign=sign,
        status_signers=status_signers,
        notifier=notifier,
        environ=os.environ,
        plain=args.plain,
        state=state,
        publish=web.publish if web is not None else None,
        soft=soft,
        crash_points=crash_points,
    )
    log.info(
        "start",
        f"acting on {redact_url(args.repo)} branch {args.branch}",
        key=key.key_id,
        verification="on" if approver else "off",
        mode="plain" if args.plain else "fast",
        approvals=args.require_approvals,
    )
    try:
        start_up.check()
        return _serve(daemon, store, args, log, metrics, start_up)
    finally:
        _shut_down(client, log, web, notifier, once=args.once)


def _shut_down(
    client: AgentClient,
    log: EventLog,
    web: WebServer | None,
    notifier: Notifier | None,
    *,
    once: bool,
) -> None:
    """Close what ``_run`` opened, however the daemon ended."""
    client.close()
    log.flush()
    if web is not None:
        web.close()
    if notifier is not None:
        # One pass's events still go out; a hanging receiver delays the
        # exit this long at most (a restart delivers what is still true).
        notifier.drain(NOTIFY_DRAIN if once else 2.0)
        notifier.close()


def _commit_signing(
    args: argparse.Namespace, key: SigningKey, approver: Approver | None, log: EventLog
) -> tuple[Callable[[bytes], str] | None, tuple[AllowedSigner, ...]]:
    """How this daemon signs its status commits (``--sign-commits``), and,
    under verification, whose signed status commits count."""
    from reconciler.git.sshsig import sign_commit_payload

    sign = (
        (lambda payload: sign_commit_payload(key.private_key, payload))
        if args.sign_commits
        else None
    )
    status_signers = (
        _status_signers(approver, key, args.sign_commits, log) if approver is not None else ()
    )
    return sign, status_signers


def _open_store(args: argparse.Namespace, crash_points: CrashPoints) -> GitStore:
    """The fleet repository and branch the command line names, with the
    daemon's crash points (``RECONCILER_CRASH_AT``, tests only)."""
    from reconciler.git.store import GitStore

    return GitStore.open(
        args.repo,
        args.branch,
        cache_dir=args.cache_dir,
        ssh_key=args.ssh_key,
        known_hosts=args.known_hosts,
        crash_point=crash_points.reach,
    )


NOTIFY_DRAIN = 10.0  # seconds `run --once` waits for its notifications


def _serve_metrics(args: argparse.Namespace, log: EventLog, metrics: Metrics) -> None:
    try:
        served = metrics.serve(args.metrics, stale_after=_stale_after(args))
    except OSError as exc:
        raise UsageError(
            f"--metrics {args.metrics}: cannot listen: {exc.strerror or exc}"
        ) from None
    port = served.server_address[1]
    host = args.metrics.rpartition(":")[0] or "127.0.0.1"  # [::1] keeps its brackets
    # Port 0 picks a free one: the line says which.
    log.info("metrics", f"listening on {host}:{port} (/metrics, /healthz)")


def _stale_after(args: argparse.Namespace) -> float:
    """How old the last successful pass may be before ``/healthz`` says 503:
    a serving daemon passes at least once per interval, poll or reread,
    whichever is longest; three of those leave room for a slow pass."""
    from reconciler.daemon.loop import REREAD

    return 3 * max(args.interval, args.poll, REREAD)


def _web_server(args: argparse.Namespace, log: EventLog, metrics: Metrics) -> WebServer | None:
    """The read API and the page (docs/web.md), bound and serving, or None
    without --http."""
    if not args.http:
        return None
    from reconciler.daemon.web_routes import HostRule, Routes, read_token
    from reconciler.daemon.web_server import WebServer

    host, sep, port = args.http.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise UsageError(f"--http must be HOST:PORT, got {args.http!r}")
    token = None
    if args.http_token_file is not None:
        try:
            token = read_token(args.http_token_file)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--http-token-file: {exc}") from None
    routes = Routes(
        token=token,
        hosts=HostRule.served(host, args.http_allow_host),
        **_shared_metrics(args, metrics),
    )
    shared = routes.metrics is not None
    server = WebServer(
        routes,
        host,
        int(port),
        on_error=lambda exc: log.error("http_failed", f"{type(exc).__name__}: {exc}"),
    )
    try:
        server.start()
    except OSError as exc:
        raise UsageError(f"--http {args.http}: cannot listen: {exc.strerror or exc}") from None
    log.info(
        "http",
        f"serving the read API and the page on http://{server.address}/"
        + (" (and /metrics, /healthz)" if shared else ""),
        access="token" if token else "127.0.0.1 and ::1 only",
        hosts=",".join(sorted(routes.hosts.names))
        + (",any IP" if routes.hosts.any_address else ""),
    )
    return server


def _shared_metrics(args: argparse.Namespace, metrics: Metrics) -> dict[str, Any]:
    """When --metrics names the --http address: ``/metrics`` behind the
    read API's access rules, ``/healthz`` open to any client as a probe."""
    if args.metrics != args.http:
        return {}
    from prometheus_client import generate_latest

    metrics.health.stale_after = _stale_after(args)
    return {
        "metrics": lambda: generate_latest(metrics.registry),
        "health": metrics.health.answer,
    }


def _check_arguments(args: argparse.Namespace) -> None:
    """What argparse cannot check alone: bounds, and flags that need others."""
    if args.concurrency < 1:
        raise UsageError("--concurrency must be at least 1")
    if args.http_token_file is not None and not args.http:
        raise UsageError("--http-token-file needs --http")
    if args.http_allow_host and not args.http:
        raise UsageError("--http-allow-host needs --http")
    if args.require_approvals < 0:
        raise UsageError("--require-approvals must be 0 or more")
    if args.require_approvals and args.allowed_signers is None:
        raise UsageError(
            "--require-approvals needs --allowed-signers",
            "approvals count only from principals of an allowed-signers file",
        )


def _notifier(
    store: GitStore,
    approver: Approver | None,
    log: EventLog,
    metrics: Metrics,
    state: DaemonState,
) -> Notifier:
    """The receivers of the settings acted on, checked whole before the
    daemon starts: one that cannot be used stops the start (docs/operating.md)."""
    from reconciler.daemon.notifications import Notifier, receivers_at, resolve

    tip = store.refresh()
    commit = tip if approver is None or tip is None else approver.approve(tip).verified_commit
    receivers = receivers_at(store, commit)
    notifier = Notifier(resolve(receivers, os.environ), log=log, metrics=metrics, state=state)
    notifier.receivers = receivers
    if receivers:
        log.info("notify_config", "receivers: " + ", ".join(r.name for r in receivers))
    return notifier


def _approver(store: GitStore, args: argparse.Namespace) -> Approver | None:
    """Verification (docs/trust.md), or None when off."""
    from reconciler.git.approval import Approver, load_allowed_signers
    from reconciler.git.openpgp import PgpKeyring

    pgp = PgpKeyring.load(args.allowed_pgp_keys) if args.allowed_pgp_keys else None
    if args.allowed_signers is None and pgp is None:
        return None
    allowed = load_allowed_signers(args.allowed_signers) if args.allowed_signers else ()
    return Approver(store.repository(), allowed, required_approvals=args.require_approvals, pgp=pgp)


def _status_signers(
    approver: Approver, key: SigningKey, sign_commits: bool, log: EventLog
) -> tuple[AllowedSigner, ...]:
    """Under verification with signed status commits, a status file counts
    only as a daemon key last wrote it: this daemon's, or another's listed in
    the allowed-signers file (docs/trust.md)."""
    from reconciler.git.sshsig import parse_allowed_signers

    if sign_commits:
        own = parse_allowed_signers(f'reconciler namespaces="git" {key.public_openssh}\n')
        return (*own, *approver.allowed)
    log.warning(
        "status_trust",
        "statuses are checked against the verified spec only; without --sign-commits the "
        "fields agents report (backup ids, attempts) are taken from status as committed",
    )
    return ()


def _serve(
    daemon: Daemon,
    store: GitStore,
    args: argparse.Namespace,
    log: EventLog,
    metrics: Metrics,
    start_up: _StartUp,
) -> int:
    """One pass (``--once``), or passes until a signal stops the loop."""
    from reconciler.daemon.loop import stop_on_signals
    from reconciler.git.watch import BranchWatcher

    if args.once:
        outcome = daemon.run_pass()
        log.info(
            "pass",
            f"{outcome.transitions} transitions, {outcome.jobs_sent} jobs sent",
            commit=(outcome.commit or outcome.tip)[:12],
        )
        return 0
    from reconciler.git.approval_notes import NOTES_REF

    # A new approval wakes the daemon like a push (docs/trust.md): approval
    # rules in the repository may ask for one without --require-approvals.
    watched = [args.branch, NOTES_REF] if args.allowed_signers else [args.branch]
    with (
        BranchWatcher.for_store(
            store, watched, poll=args.poll, log=log, metrics=metrics
        ) as watcher,
        stop_on_signals(daemon),
    ):
        if start_up.signal is not None:  # came while the watcher started
            daemon.stop()
        daemon.serve(watcher, interval=args.interval)
    log.info("stopped", "clean stop")
    return 0
