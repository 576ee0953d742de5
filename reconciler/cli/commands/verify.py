"""``reconciler verify``: would the daemon act on this commit, and why.

Prints the newest commit at or before REV that changed ``rollouts/``,
``nodes/`` or ``reconciler.yaml``, who signed it or why it is refused, and
when refused, the older commit the daemon falls back to. Exit 0 when the
daemon would act on REV's spec, 1 when it would not, 2 for a usage error
(bad arguments, unreadable allowed-signers file, unknown REV, no repository),
so that 1 always means "refused".

With ``--evidence NAME`` it checks instead, offline, the signed agent
answers recorded in rollout NAME's status against each node's ``agentKey``
at the rollout's ``specCommit`` (docs/trust.md), printing ``ok`` or
why not per node; exit 1 when any fails.

With ``--attestation FILE --key PUB`` it checks a deployment attestation
(``reconciler attest``, docs/attestations.md): the envelope's signature by
the daemon's key, the statement, and with ``--repo`` the commits, the
committed status and every node's evidence against its ``agentKey`` at
``specCommit``. Without ``--repo`` only what the file itself can show is
checked, and the report says so. Exit 1, with one reason per failing
part or node, when any check fails.

Reads a local repository (``git.revisions``); decides nothing itself (``approval``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from reconciler.attestations.attestation_check import check_attestation
from reconciler.attestations.evidence_check import check_evidence
from reconciler.cli.completers import complete_with, rollout_names
from reconciler.cli.daemon_policy import (
    allowed_signers,
    looser_than_the_daemon,
    pgp_keys,
    policy_of,
)
from reconciler.cli.output_format import add_format_argument, structured
from reconciler.cli.remote_options import add_repo_argument
from reconciler.daemon.acted import read_acted, read_unsigned_status
from reconciler.daemon.reader import unverified_only, unverified_rollouts
from reconciler.daemon.started import StartedRollouts, gone_reason
from reconciler.daemon.state import DaemonState, default_state_root
from reconciler.daemon.status_provenance import DaemonPolicy, unacted_reasons
from reconciler.daemon.status_trust import StatusTrust
from reconciler.git.approval import (
    ACTED_REF,
    Approval,
    Approver,
    descends_by_first_parent,
    last_acted,
    refuse_backwards,
)
from reconciler.git.approval_notes import read_note
from reconciler.git.branch import Branch, open_branch
from reconciler.git.history import History
from reconciler.git.revisions import (
    describe_commit,
    open_local_repository,
    resolve_or_branch_tip,
    upstream_locations,
)
from reconciler.git.sshsig import AllowedSigner, parse_allowed_signers
from reconciler.git.status_writes import DaemonWrites
from reconciler.git.store import GitStore
from reconciler.protocol.signing import TrustedKey, load_public_key
from reconciler.readers.status_reader import StatusReader, read_snapshot
from reconciler.spec.errors import ReconcilerError, StoreError, UsageError
from reconciler.spec.paths import STATUS_DIR, status_path

HELP = (
    "tell whether a commit would be acted on under --allowed-signers, and why;"
    " or check a rollout's recorded evidence (--evidence) or an attestation (--attestation)"
)

_SHORT = 12


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "rev", nargs="?", metavar="REV", help="commit to check (default: the branch tip)"
    )
    add_repo_argument(
        parser,
        "the fleet repository, a clone or a bare one (with --attestation, none leaves "
        "the repository checks out; without, the current directory)",
        optional=True,
    )
    parser.add_argument(
        "--branch", default="main", help="branch whose tip is checked when REV is omitted"
    )
    what = parser.add_mutually_exclusive_group()
    complete_with(
        what.add_argument(
            "--evidence",
            metavar="NAME",
            help="check the signed agent answers recorded in rollout NAME's status "
            "against the nodes' agentKey at its specCommit",
        ),
        rollout_names,
    )
    what.add_argument(
        "--attestation",
        type=Path,
        metavar="FILE",
        help="check a deployment attestation (reconciler attest) signed by --key",
    )
    parser.add_argument(
        "--allowed-signers",
        metavar="FILE",
        help="git allowed-signers file (as for gpg.ssh.allowedSignersFile); with --evidence or "
        "--attestation: take the agent keys from the verified spec and check the status's "
        "commits against verified history",
    )
    parser.add_argument(
        "--require-approvals",
        type=int,
        default=0,
        metavar="N",
        help="as the daemon run with it: a spec commit also needs N reviewers' approvals",
    )
    parser.add_argument(
        "--allowed-pgp-keys",
        type=Path,
        metavar="FILE",
        help="armored OpenPGP public keys whose commit signatures count too (a forge's key)",
    )
    parser.add_argument(
        "--key",
        type=Path,
        metavar="PUB",
        help="with --attestation: the daemon's public key (reconciler.pub)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="the daemon's state directory, as given to run --state-dir, where it keeps the "
        "verified commit it last acted on (default: $XDG_STATE_HOME/reconciler)",
    )
    add_format_argument(
        parser,
        ("text", "json", "yaml"),
        "text: the report in words (default); json or yaml: the same as one record",
    )
    parser.add_argument(
        "--daemon-key",
        type=Path,
        metavar="PUB",
        help="the daemon's public key (reconciler.pub), as for a daemon run with "
        "--sign-commits: a status file then counts only as a daemon-signed commit wrote it "
        "(with --evidence and --attestation too)",
    )


def run(args: argparse.Namespace) -> int:
    if args.attestation is not None:
        return verify_attestation(args)
    if args.key is not None:
        raise UsageError("--key goes with --attestation", "for status commits use --daemon-key")
    if args.evidence is not None:
        return verify_evidence(args)
    if args.allowed_signers is None:
        raise UsageError(
            "verify needs --allowed-signers FILE, --evidence NAME or --attestation FILE",
            "see reconciler verify --help",
        )
    allowed = allowed_signers(Path(args.allowed_signers))
    repo = open_local_repository(args.repo or ".")
    label, tip = resolve_or_branch_tip(repo, args.rev, args.branch)
    if args.require_approvals < 0:
        raise UsageError("--require-approvals must be 0 or more")
    pgp = pgp_keys(args.allowed_pgp_keys)
    approver = Approver(repo, allowed, required_approvals=args.require_approvals, pgp=pgp)
    state = _daemon_state(args, repo)
    acted, where = _acted_position(repo, state, args.branch)
    approver.judge_after(_kept_position(state))
    approval = _forward_only(repo, approver.approve(tip), acted)
    report = describe(repo, approver, approval, label, tip) + f"\n  {where}"
    held = _tampered_statuses(
        repo,
        approver,
        approval,
        tip,
        args.branch,
        _status_signers(args.daemon_key, allowed),
        state,
    )
    held.update(_gone_statuses(repo, approver, approval, args.branch, state, held))
    unverified = _unverified_rollouts(repo, approver, approval, tip, args.branch)
    if unverified:
        report += "\n  rollouts with no status, nothing sent for them:"
        report += "".join(f"\n    {unverified_only(name)}" for name in unverified)
    if held:
        report = report.replace(": would be acted on", ": would NOT be acted on", 1)
        report += "\n  statuses held, nothing sent for them:"
        report += "".join(f"\n    {reason}" for _, reason in sorted(held.items()))
    acted_on = approval.acted_on and not held
    _print(
        args.format,
        report,
        {
            "rev": label,
            "commit": tip,
            "actedOn": acted_on,
            "newestSpecCommit": approval.newest_spec_commit,
            "verifiedCommit": approval.verified_commit,
            "refusals": [{"commit": r.commit, "reason": r.reason} for r in approval.refusals],
            "lastActed": {"commit": acted, "from": where},
            "heldStatuses": dict(sorted(held.items())),
            "unverifiedRollouts": list(unverified),
        },
    )
    return 0 if acted_on else 1


def _print(fmt: str, text: str, record: dict[str, Any]) -> None:
    """``text`` for a terminal, or ``record`` as json or yaml (``-o``)."""
    if fmt == "text":
        print(text)
        return
    sys.stdout.write(structured(json.dumps(record, indent=2) + "\n", fmt))


def _policy(args: argparse.Namespace, source: Branch) -> DaemonPolicy:
    """The daemon's flags as given: --allowed-signers (with approvals and
    PGP keys), --daemon-key for signed status commits, --state-dir."""
    return policy_of(args, source, args.repo or ".", _daemon_key_line(args.daemon_key))


def verify_evidence(args: argparse.Namespace) -> int:
    """Print each node's evidence check for rollout ``--evidence``; 1 if any
    fails. Under the daemon's flags, the status must first be one the daemon
    would act on (``daemon.status_provenance``): the agent keys come from
    the verified spec, never from an unsigned one."""
    repo, branch, name = args.repo or ".", args.branch, args.evidence
    source = open_branch(repo, branch)
    snapshot = read_snapshot(source)
    status = snapshot.statuses.get(name)
    if status is None or snapshot.commit is None:
        raise UsageError(
            f"no readable status for rollout {name!r} on branch {branch} of {repo}",
            "check the name with: reconciler status",
        )
    policy = _policy(args, source)
    record: dict[str, Any] = {"rollout": name, "specCommit": status.spec_commit}
    looser = looser_than_the_daemon(policy)
    wrong = [looser] if looser else unacted_reasons(source, status, snapshot.commit, policy)
    if wrong:
        text = f"rollout {name}: evidence NOT checked: " + "; ".join(wrong)
        _print(args.format, text, record | {"checked": False, "ok": False, "reasons": wrong})
        return 1
    verdicts = check_evidence(source, status)
    where = "the verified spec at" if policy.approver is not None else "agentKey at"
    lines = [f"rollout {name}: evidence checked against {where} specCommit {status.spec_commit}"]
    width = max((len(v.node) for v in verdicts), default=0)
    lines += [f"  {v.node:<{width}}  {'ok' if v.ok else 'FAILED'}: {v.message}" for v in verdicts]
    failed = [v.node for v in verdicts if not v.ok]
    if failed:
        lines.append(f"evidence does not verify for: {', '.join(failed)}")
    nodes = [{"name": v.node, "ok": v.ok, "message": v.message} for v in verdicts]
    _print(
        args.format,
        "\n".join(lines),
        record | {"checked": True, "ok": not failed, "nodes": nodes},
    )
    return 1 if failed else 0


def verify_attestation(args: argparse.Namespace) -> int:
    """Print each check of the attestation file; 1 if any fails. With
    ``--repo`` and the daemon's flags, the status at its ``statusCommit``
    must also be one the daemon would act on."""
    path, key_path, repo = args.attestation, args.key, args.repo
    if key_path is None:
        raise UsageError(
            "--attestation needs --key",
            "pass the daemon's public key file (reconciler.pub) the attestation is signed by",
        )
    key = _public_key(key_path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    source = None if repo is None else open_branch(repo, args.branch)
    unacted = None
    if source is not None:
        policy = _policy(args, source)
        looser = looser_than_the_daemon(policy)
        if looser:
            unacted = lambda status, commit: [looser]  # noqa: E731
        elif policy.checks_anything:
            unacted = lambda status, commit: unacted_reasons(source, status, commit, policy)  # noqa: E731
    report = check_attestation(data, key, source, unacted)
    lines = [f"attestation {path}" + (f" of rollout {report.rollout}" if report.rollout else "")]
    width = max((len(f.about) for f in report.findings), default=0)
    lines += [f"  {f.about:<{width}}  {f.verdict}: {f.message}" for f in report.findings]
    if report.failed:
        lines.append(f"attestation does not verify: {', '.join(f.about for f in report.failed)}")
    findings = [
        {"about": f.about, "verdict": f.verdict, "message": f.message} for f in report.findings
    ]
    record = {
        "attestation": str(path),
        "rollout": report.rollout or None,
        "ok": not report.failed,
        "findings": findings,
    }
    _print(args.format, "\n".join(lines), record)
    return 1 if report.failed else 0


def _public_key(path: Path) -> TrustedKey:
    try:
        return load_public_key(path)
    except ReconcilerError as exc:
        raise UsageError(exc.message, exc.hint) from None


def _status_signers(
    daemon_key: Path | None, allowed: tuple[AllowedSigner, ...]
) -> tuple[AllowedSigner, ...]:
    """The keys whose status commits count, as ``reconciler run`` with
    ``--sign-commits`` takes them: the daemon's and the allowed signers'."""
    line = _daemon_key_line(daemon_key)
    if line is None:
        return ()
    own = parse_allowed_signers(f'reconciler namespaces="git" {line}\n')
    return (*own, *allowed)


def _daemon_key_line(daemon_key: Path | None) -> str | None:
    """The daemon's public key line from ``--daemon-key``, checked; None without."""
    if daemon_key is None:
        return None
    try:
        line = daemon_key.read_text(encoding="utf-8").strip()
        parse_allowed_signers(f'reconciler namespaces="git" {line}\n')
    except (OSError, UnicodeDecodeError, ReconcilerError) as exc:
        raise UsageError(
            f"cannot read the daemon's public key {daemon_key}: {exc}",
            "pass the daemon's OpenSSH public key file (reconciler.pub)",
        ) from None
    return line


def _tampered_statuses(
    repo: Any,
    approver: Approver,
    approval: Approval,
    tip: str,
    branch: str,
    status_signers: tuple[AllowedSigner, ...] = (),
    state: DaemonState | None = None,
) -> dict[str, str]:
    """The statuses the daemon would hold as ``status_tampered``, read the
    way it reads them (``daemon.status_trust``, against the history up to
    the verified commit, and knowing from the daemon's ``state``, when it
    is on this machine, which rollouts it started); unreadable ones are
    left to it."""
    if approval.verified_commit is None:
        return {}
    try:
        store = GitStore.open(str(repo.path), branch, read_only=True)
    except StoreError:
        return {}
    writes = DaemonWrites(repo, status_signers, _unsigned_status(state)) if status_signers else None
    trust = StatusTrust(store, approver, writes)
    settings = trust.documents_at(approval.verified_commit, {}).settings
    status_tip = tip if not settings.status_branch else store.tip(settings.status_branch)
    if status_tip is None:
        return {}
    # Read as the daemon reads them (schema check included); unreadable ones are left to it.
    statuses, _ = StatusReader().read(store, status_tip)
    history = History(repo)
    history.advance(approval.verified_commit)
    started = StartedRollouts(state)
    try:
        started.known()
    except ReconcilerError:
        started = StartedRollouts(None)
    held = trust.hold_unwritten(statuses, status_tip)
    held.update(trust.hold_tampered(statuses, history, wrote=started.wrote))
    return held


def _unsigned_status(state: DaemonState | None) -> str | None:
    """The status commit the daemon acted on last before it signed, when
    its state is on this machine (``daemon.acted``)."""
    if state is None:
        return None
    try:
        return read_unsigned_status(state)
    except ReconcilerError:
        return None


def _gone_statuses(
    repo: Any,
    approver: Approver,
    approval: Approval,
    branch: str,
    state: DaemonState,
    held: dict[str, str],
) -> dict[str, str]:
    """The rollouts the daemon started (as its state directory records)
    whose status is gone: it holds them, never starting them again."""
    try:
        started = StartedRollouts(state)
        known = started.known()
    except ReconcilerError:
        return {}
    if not known or approval.verified_commit is None:
        return {}
    store = GitStore.open(str(repo.path), branch, read_only=True)
    trust = StatusTrust(store, approver)
    settings = trust.documents_at(approval.verified_commit, {}).settings
    # Gone now, at the branch's status tip: an older REV predates them.
    status_tip = store.tip(settings.status_branch or branch)
    statuses = StatusReader().read(store, status_tip)[0] if status_tip is not None else {}
    return {name: gone_reason(name, entry) for name, entry in started.gone(statuses, held).items()}


def _unverified_rollouts(
    repo: Any, approver: Approver, approval: Approval, tip: str, branch: str
) -> list[str]:
    """The rollouts with no status that only commits nobody signed have:
    the daemon writes none for them (``daemon.reader``)."""
    if not approval.refusals:
        return []
    store = GitStore.open(str(repo.path), branch, read_only=True)
    verified = approval.verified_commit
    status_tip: str | None = tip
    if verified is not None:
        settings = StatusTrust(store, approver).documents_at(verified, {}).settings
        status_tip = store.tip(settings.status_branch or branch)
    statuses = set(store.files(status_tip, STATUS_DIR)) if status_tip is not None else set()
    history = History(repo)
    history.advance(tip)
    return [
        name
        for name, signed in unverified_rollouts(store, approver, history, verified)
        if not signed and status_path(name) not in statuses
    ]


def _daemon_state(args: argparse.Namespace, repo: Any) -> DaemonState:
    """The state folder of the daemon serving ``--repo``: the bare
    repository's when ``--repo`` is a clone of it."""
    root = args.state_dir or default_state_root()
    return DaemonState.of_daemon(root, args.repo or ".", args.branch, upstream_locations(repo))


def _acted_position(repo: Any, state: DaemonState, branch: str) -> tuple[str | None, str]:
    """The verified commit the daemon last acted on, as far as this machine
    can know it, and a line saying where that came from. The daemon keeps
    it in its state directory; the repository's old ref is what a daemon
    before that kept, and anyone who may push can move it."""
    try:
        kept = read_acted(state)
    except ReconcilerError:
        kept = None
    if kept is not None:
        return kept, f"last acted on {kept[:_SHORT]} (the daemon's state, {state.folder})"
    old = last_acted(repo, branch)
    unknown = (
        f"the daemon's state ({state.folder}) is not on this machine or not readable, "
        "so whether it already acted on a newer verified commit cannot be known here"
    )
    if state.exists():
        # The daemon has run here, never under verification: it takes the
        # old ref, if any, as its position at its first verified pass.
        unknown = (
            f"the daemon's state ({state.folder}) holds no verified commit yet: the daemon "
            "has not acted under verification, and takes the branch as it is when it first does"
        )
    if old is None:
        return None, f"last acted on: not known; {unknown}"
    return old, (
        f"last acted on {old[:_SHORT]} by the ref {ACTED_REF}{branch}, which anyone "
        f"who may push can change; {unknown}"
    )


def _kept_position(state: DaemonState) -> str | None:
    """The daemon's own record of the commit it last acted on, whose rules
    judge what follows it; never the repository's ref, which pushers move."""
    try:
        return read_acted(state)
    except ReconcilerError:
        return None


def _forward_only(repo: Any, approval: Approval, acted: str | None) -> Approval:
    """As the daemon judges it: a verified commit that does not descend by
    first parent from the one the daemon last acted on is refused."""
    verified = approval.verified_commit
    forward = (
        verified is not None
        and acted is not None
        and descends_by_first_parent(repo, verified, acted)
    )
    return refuse_backwards(approval, acted, moves_forward=forward)


def describe(repo: Any, approver: Approver, approval: Approval, label: str, tip: str) -> str:
    """The report, in words: what is acted on and why (``repo``: pygit2's)."""
    head = f"{label} ({tip[:_SHORT]})"
    if approval.newest_spec_commit is None:
        return (
            f"{head}: would be acted on\n"
            "  no commit at or before it changes rollouts/, nodes/ or reconciler.yaml;"
            " nothing needs a signature"
        )
    lines: list[str] = []
    if approval.acted_on:
        verified = approval.newest_spec_commit
        lines.append(f"{head}: would be acted on")
        lines.append(f"  newest spec change: {_show_commit(repo, verified)}")
        lines.append(f"  {approver.check_commit(verified).reason}")
        lines += _approval_lines(repo, approver, verified, "  ")
        return "\n".join(lines)
    newest, *older = approval.refusals
    lines.append(f"{head}: would NOT be acted on")
    lines.append(f"  newest spec change: {_show_commit(repo, newest.commit)}")
    lines.append(f"  refused: {newest.reason}")
    lines += _approval_lines(repo, approver, newest.commit, "  ")
    if older:
        lines.append("  older spec changes, also refused:")
        for refusal in older:
            lines.append(f"    {_show_commit(repo, refusal.commit)}")
            lines.append(f"      refused: {refusal.reason}")
    if approval.verified_commit is None:
        lines.append(
            "  the daemon falls back to: nothing; no spec change at or before it verifies,"
            " so it acts on no rollouts"
        )
        if repo.is_shallow:
            lines.append(
                "  note: this is a shallow clone, so older signed commits may be missing;"
                " `git fetch --unshallow` and check again"
            )
    else:
        lines.append(f"  the daemon falls back to: {_show_commit(repo, approval.verified_commit)}")
        lines.append(f"    {approver.check_commit(approval.verified_commit).reason}")
        lines += _approval_lines(repo, approver, approval.verified_commit, "    ")
    lines.append(
        "  to approve: an allowed signer pushes a signed commit (`git commit -S`, `git merge -S`)"
        " that changes rollouts/, nodes/ or reconciler.yaml; its whole tree is what is approved"
        + (
            "; and another allowed signer runs `reconciler approve COMMIT --key FILE --push`"
            if approver.required_approvals
            else ""
        )
    )
    return "\n".join(lines)


def _approval_lines(repo: Any, approver: Approver, commit: str, indent: str) -> list[str]:
    """Each approval in the commit's note, counted or ignored with why, and
    each approval rule that applies with its verdict, as the daemon judges
    it (docs/approval-rules.md); nothing when none is asked for and none is
    there."""
    judgement = approver.judgement(commit)
    if not approver.required_approvals and not judgement.rules and read_note(repo, commit) is None:
        return []
    approvals = approver.approvals(commit)
    lines = [
        f"{indent}approvals of {commit[:_SHORT]}: {len(approvals.counted)} counted, "
        f"{approver.required_approvals} required"
    ]
    lines += [f"{indent}  counted: {a.principal} ({a.key_id})" for a in approvals.counted]
    lines += [f"{indent}  ignored: {why}" for why in approvals.ignored]
    for rule in judgement.rules:
        verdict = rule.summary().removeprefix(f"{rule.rule}: ")
        lines.append(f"{indent}rule {rule.rule}: {verdict}")
    if judgement.stops_only:
        lines.append(f"{indent}it only sets paused or abort: verified with its signature alone")
    return lines


def _show_commit(repo: Any, commit_id: str) -> str:
    return describe_commit(repo, commit_id, _SHORT)
