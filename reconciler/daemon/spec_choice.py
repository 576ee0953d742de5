"""Which spec commit a pass acts on under verification: the approver's
verdict at the tip, judged after the commit last acted on (by that tree's
approval rules), and never a commit behind it (docs/trust.md).

It records each newly verified commit it accepts as the one last acted on
(``daemon.acted``). Must not: read documents or statuses; forgetting its
cache of first-parent ancestry changes nothing but the cost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from reconciler.daemon.acted import ActedPosition
from reconciler.git.approval import Approval, Approver, descends_by_first_parent, refuse_backwards

Report = Callable[..., None]  # (event, message, **fields): a standing problem, logged once


class SpecChoice:
    def __init__(
        self, repository: Any, approver: Approver, acted: ActedPosition, report: Report
    ) -> None:
        self.repository = repository
        self.approver = approver
        self.acted = acted
        self.report = report
        # (verified commit, last acted commit) -> descends from it by first parent
        self._descends: dict[tuple[str, str], bool] = {}

    def choose(self, tip: str) -> Approval:
        """The walk's verdict at ``tip``, refused where it would move back."""
        return self._forward_only(self._approve(tip))

    def _approve(self, tip: str) -> Approval:
        """The walk's verdict at ``tip``, judging what follows the commit
        last acted on by that tree's rules (``Approver.judge_after``)."""
        self.approver.judge_after(self.acted.get())
        return self.approver.approve(tip)

    def _forward_only(self, approval: Approval) -> Approval:
        """Refuse a verified commit that does not descend by first parent from
        the one last acted on (kept in the daemon's state, ``daemon.acted``);
        record a new one that does."""
        repo = self.repository
        acted = self.acted.get()
        verified = approval.verified_commit
        if acted is None or verified == acted:
            if verified is not None and acted is None:
                self.acted.record(verified)
            return approval
        forward = False
        if verified is not None:
            descends = self._descends
            key = (verified, acted)
            known = descends.get(key)
            if known is None:
                known = descends_by_first_parent(repo, verified, acted)
                if len(descends) > 1000:
                    descends.clear()
                descends[key] = known
            forward = known
        if forward and verified is not None:
            self.acted.record(verified)
            return approval
        held = refuse_backwards(approval, acted, moves_forward=False)
        if self.approver.approve(acted).verified_commit != acted:
            # The policy changed (approvals turned on): not a move backwards.
            why = (
                f"{acted[:12]}, the verified commit last acted on, is not verifiable under the "
                "current policy, and no commit that is descends from it: push a signed (and, "
                "as the policy asks, approved) commit on top of it"
            )
            held = replace(held, refusals=(replace(held.refusals[0], reason=why),))
            self.report("not_verifiable", why, commit=acted)
            return held
        self.report("verified_moved_back", held.refusals[0].reason, commit=verified or "")
        return held
