"""The log lines for pushed spec commits the daemon does not act on: one
line a commit, once, naming who made it and why, besides the status that
says so (docs/trust.md).

Must not: decide whether a commit is acted on (that is ``git.approval``'s).
"""

from __future__ import annotations

from collections.abc import Sequence

from reconciler.daemon.logs import EventLog
from reconciler.daemon.soft_state import LoggedOnce
from reconciler.git.approval import Refusal


def log_refusals(log: EventLog, logged: LoggedOnce, refusals: Sequence[Refusal]) -> None:
    """A commit without a valid signature is a ``push_refused`` warning,
    worth an alert; a signed one waiting for its approvals is the ordinary
    course of review, ``awaiting_approval`` at info. A move backwards is
    ``verified_moved_back``. A refusal without an author is not logged."""
    for refusal in refusals:
        if not refusal.author or not logged.new_refusal(refusal.commit):
            continue
        write, event = (
            (log.info, "awaiting_approval")
            if refusal.awaits_approval
            else (log.warning, "push_refused")
        )
        write(
            event,
            f"commit {refusal.commit[:12]} by {refusal.author} is not acted on: {refusal.reason}",
            commit=refusal.commit,
            author=refusal.author,
        )
