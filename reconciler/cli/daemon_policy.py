"""The daemon's trust settings as a person passes them to ``attest`` and
``verify`` (``--allowed-signers``, ``--require-approvals``,
``--allowed-pgp-keys``, ``--state-dir``, and signed status commits), made
into the ``DaemonPolicy`` that ``daemon.status_provenance`` judges a
status by. Bad files are usage errors (exit 2), since 1 means "refused"."""

from __future__ import annotations

import argparse
from pathlib import Path

from reconciler.daemon.acted import read_acted
from reconciler.daemon.state import DaemonState, default_state_root
from reconciler.daemon.status_provenance import DaemonPolicy
from reconciler.git.approval import Approver, load_allowed_signers
from reconciler.git.branch import Branch
from reconciler.git.openpgp import PgpKeyring
from reconciler.git.revisions import upstream_locations
from reconciler.git.sshsig import AllowedSigner, parse_allowed_signers
from reconciler.spec.errors import ReconcilerError, UsageError


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags ``attest`` shares with ``verify``, as ``run`` takes them."""
    parser.add_argument(
        "--allowed-signers",
        type=Path,
        metavar="FILE",
        help="as the daemon runs with it: the status's specCommit and startCommit must be "
        "verified commits of the branch, and the agent keys come from the verified tree",
    )
    parser.add_argument(
        "--require-approvals",
        type=int,
        default=0,
        metavar="N",
        help="as the daemon runs with it: a spec commit also needs N reviewers' approvals",
    )
    parser.add_argument(
        "--allowed-pgp-keys",
        type=Path,
        metavar="FILE",
        help="armored OpenPGP public keys whose commit signatures count too (a forge's key)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="the daemon's state directory, as given to run --state-dir "
        "(default: $XDG_STATE_HOME/reconciler)",
    )


def approver_of(
    source: Branch, signers_file: Path | None, required: int, pgp_file: Path | None
) -> Approver | None:
    """The judge of spec commits the daemon runs with; None without verification."""
    if required < 0:
        raise UsageError("--require-approvals must be 0 or more")
    if signers_file is None and pgp_file is None:
        if required:
            raise UsageError("--require-approvals needs --allowed-signers")
        return None
    allowed = allowed_signers(signers_file) if signers_file is not None else ()
    pgp = pgp_keys(pgp_file)
    return Approver(source.reader.repository(), allowed, required_approvals=required, pgp=pgp)


def policy_of(
    args: argparse.Namespace, source: Branch, location: str, daemon_key: str | None
) -> DaemonPolicy:
    """The policy ``args`` describe; ``daemon_key``: the daemon's public key
    line when its status commits are signed (None: they are not)."""
    approver = approver_of(
        source, args.allowed_signers, args.require_approvals, args.allowed_pgp_keys
    )
    signers: tuple[AllowedSigner, ...] = ()
    if daemon_key is not None:
        own = parse_allowed_signers(f'reconciler namespaces="git" {daemon_key}\n')
        signers = (*own, *(approver.allowed if approver is not None else ()))
    return DaemonPolicy(approver, signers, daemon_state(args.state_dir, source, location))


def looser_than_the_daemon(policy: DaemonPolicy) -> str:
    """Why ``policy`` is looser than the daemon's own, when its state on this
    machine shows it acts under verification and ``policy`` has none; ""
    otherwise. Checking without it could pass what the daemon refused."""
    if policy.approver is not None or policy.state is None:
        return ""
    try:
        acted = read_acted(policy.state)
    except ReconcilerError:
        return ""
    if acted is None:
        return ""
    return (
        "the daemon serving this repository acts under verification (its state in "
        f"{policy.state.folder} holds the verified commit {acted[:12]}): pass its own flags, "
        "--allowed-signers FILE (with --require-approvals N), or what the daemon refused could "
        "pass"
    )


def daemon_state(root: Path | None, source: Branch, location: str) -> DaemonState:
    """The state folder of the daemon serving ``location`` (or the
    repository it was cloned from) on this machine."""
    repo = source.reader.repository()
    upstreams = (str(Path(repo.path)), *upstream_locations(repo))
    return DaemonState.of_daemon(root or default_state_root(), location, source.branch, upstreams)


def allowed_signers(path: Path) -> tuple[AllowedSigner, ...]:
    """The allowed-signers file; a bad one is a usage error."""
    try:
        return load_allowed_signers(path)
    except UsageError:
        raise
    except ReconcilerError as exc:
        raise UsageError(exc.message, exc.hint) from None


def pgp_keys(path: Path | None) -> PgpKeyring | None:
    """The armored OpenPGP keys, if given; a bad file is a usage error."""
    if path is None:
        return None
    try:
        return PgpKeyring.load(path)
    except ReconcilerError as exc:
        raise UsageError(exc.message, exc.hint) from None
