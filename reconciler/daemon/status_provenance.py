"""Whether a rollout's committed status is one the daemon would act on
(docs/trust.md), for the commands that vouch for one or check it:
``attest``, which signs it with the daemon's key, and ``verify --evidence``
and ``verify --attestation``.

Anyone who may push can commit a node file with an ``agentKey`` of their
own and a status naming that commit as ``specCommit``, with answers signed
by that key. The daemon holds such a status (``status_tampered``); what
vouches for it must refuse it the same way. Given the daemon's policy
(``DaemonPolicy``), a status counts only when:

- with signed status commits, ``status/NAME.yaml`` holds what the newest
  commit signed by a daemon key wrote there, or what it held at the status
  commit the daemon acted on before it signed (its state directory keeps
  it; ``git.status_writes``);
- under verification, its ``specCommit`` and ``startCommit`` are verified
  commits of the branch's first-parent history, and the status agrees with
  the verified spec at ``startCommit`` (``daemon.status_trust``), so the
  agent keys its evidence is checked against are those of a verified tree.

Reads Git; must not decide anything about the rollout or write anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from reconciler.daemon.acted import read_unsigned_status
from reconciler.daemon.started import StartedRollouts
from reconciler.daemon.state import DaemonState
from reconciler.daemon.status_trust import StatusTrust
from reconciler.git.approval import Approver
from reconciler.git.branch import Branch
from reconciler.git.history import History
from reconciler.git.sshsig import AllowedSigner
from reconciler.git.status_writes import DaemonWrites
from reconciler.git.store import GitStore
from reconciler.spec.errors import ReconcilerError
from reconciler.spec.paths import status_path
from reconciler.spec.rollout_status import RolloutStatus

_SHORT = 12


@dataclass(frozen=True)
class DaemonPolicy:
    """The daemon's settings that decide which statuses it acts on, as the
    person running the command passes them (the daemon's own flags)."""

    approver: Approver | None = None  # under verification (--allowed-signers ...)
    # With signed status commits: the daemon keys whose status commits count.
    status_signers: tuple[AllowedSigner, ...] = ()
    state: DaemonState | None = None  # the daemon's state directory, when on this machine

    @property
    def checks_anything(self) -> bool:
        return self.approver is not None or bool(self.status_signers)


def unacted_reasons(
    source: Branch, status: RolloutStatus, status_commit: str, policy: DaemonPolicy
) -> list[str]:
    """Why the daemon would not act on ``status`` as committed at
    ``status_commit`` of ``source`` under ``policy``; [] when it would."""
    wrong = _unwritten(source, status.name, status_commit, policy)
    if policy.approver is not None:
        wrong += _unverified(source, status, policy.approver, policy.state)
    return wrong


def _unwritten(source: Branch, name: str, status_commit: str, policy: DaemonPolicy) -> list[str]:
    """With signed status commits: the status file is not as a daemon write left it."""
    if not policy.status_signers:
        return []
    repo = source.reader.repository()
    path = status_path(name)
    blob = source.reader.file_blob(status_commit, path)
    if blob is None:
        return [f"no {path} at {status_commit[:_SHORT]}"]
    writes = DaemonWrites(repo, policy.status_signers, _adopted(policy.state))
    why = writes.unwritten(status_commit, {path: blob}).get(path)
    if why is None:
        return []
    return [f"{path} at {status_commit[:_SHORT]} is not the daemon's: {why}"]


def _unverified(
    source: Branch, status: RolloutStatus, approver: Approver, state: DaemonState | None
) -> list[str]:
    """Under verification: the status's commits are not verified commits of
    the branch's first-parent history, or it disagrees with the verified
    spec at ``startCommit``."""
    branch = source.branch
    tip = source.tip(branch)
    verified = approver.approve(tip).verified_commit if tip is not None else None
    if verified is None:
        return [f"no commit of branch {branch} verifies"]
    repo = source.reader.repository()
    history = History(repo)
    history.advance(verified)
    wrong = []
    for field, commit in (("specCommit", status.spec_commit), ("startCommit", status.start_commit)):
        if not commit:
            continue
        if commit not in history or approver.approve(commit).verified_commit != commit:
            wrong.append(f"{field} {commit[:_SHORT]} is not a verified commit of {branch}")
    if wrong:
        return wrong
    store = (
        source.reader
        if isinstance(source.reader, GitStore)
        else GitStore.open(str(repo.path), branch, read_only=True)
    )
    started = _started(state)
    held = StatusTrust(store, approver).hold_tampered(
        {status.name: status}, history, wrote=started.wrote
    )
    return list(held.values())


def _adopted(state: DaemonState | None) -> str | None:
    if state is None:
        return None
    try:
        return read_unsigned_status(state)
    except ReconcilerError:
        return None


def _started(state: DaemonState | None) -> StartedRollouts:
    started = StartedRollouts(state)
    try:
        started.known()
    except ReconcilerError:
        return StartedRollouts(None)
    return started
