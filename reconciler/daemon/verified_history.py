"""Under verification, the first-parent history up to the verified commit
acted on: where every commit id a status gets comes from (docs/trust.md).

``covering`` maps a spec commit to a verified one: itself when it verifies,
else the oldest verified spec commit after it, whose tree holds its change.
So an unsigned commit (a settings-only change pushed mid-rollout, later
covered by a signed one) never becomes a ``specCommit``, a ``startCommit``
or a job's ``sourceCommit``.

Must not: decide anything about rollouts, or read anything but commits.
"""

from __future__ import annotations

from typing import Any

from reconciler.git.approval import Approver
from reconciler.git.history import History


class VerifiedHistory:
    """The history up to the verified commit, and the covering verified commits."""

    def __init__(self, repo: Any, approver: Approver) -> None:
        self.approver = approver
        self.history = History(repo)
        self._covered: dict[str, str] = {}  # spec commit -> the verified commit covering it

    def at(self, commit: str) -> History:
        """First-parent history up to the verified commit ``commit``."""
        self.history.advance(commit)
        return self.history

    def covering(self, commit: str) -> str:
        """``commit`` when it is verified; else the oldest verified spec
        commit after it on the verified history."""
        found = self._covered.get(commit)
        if found is not None:
            return found
        approver, history = self.approver, self.history
        found = history.tip or commit
        if approver.approve(commit).verified_commit == commit or commit not in history:
            found = commit
        else:
            oldest = history.position(commit)
            for change in history.change_commits():  # newest first
                if history.position(change) <= oldest:
                    break
                if approver.approve(change).verified_commit == change:
                    found = change
        if len(self._covered) > 10_000:
            self._covered.clear()
        self._covered[commit] = found
        return found
