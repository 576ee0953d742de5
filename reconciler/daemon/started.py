"""Which rollouts the daemon has started, kept in its own state directory,
so that a status that disappears is never taken for one not started.

Every started rollout is recorded, verification on or not, so that
turning verification or approvals on for a fleet in use can tell the
statuses the daemon wrote from a person's (docs/trust.md). Under
verification a rollout name is used once: a status file deleted by
a push without a key (on the branch, or with the whole status branch)
would otherwise let the verified spec start again, with new job ids, and
put an old target back on the nodes. Each started rollout is recorded
with its ``startCommit`` and whether it ended; a recorded rollout whose
status is gone is held. Without a state directory (a ``Daemon`` built by
a test) the record lasts as long as the process.

Must not: decide anything about a rollout beyond "its status is gone", or
keep anything but names, start commits and whether they ended.
"""

from __future__ import annotations

import json
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass

from reconciler.daemon.state import DaemonState
from reconciler.spec.rollout_status import RolloutStatus, main_path

STARTED_FILE = "started-rollouts.json"


@dataclass(frozen=True)
class Started:
    """What the daemon knows of a rollout it started."""

    start_commit: str
    ended: bool  # it reached a terminal phase: it claims no node any more


class StartedRollouts:
    """The rollouts started on one repository and branch."""

    def __init__(self, state: DaemonState | None) -> None:
        self.state = state
        self._known: dict[str, Started] | None = None

    def known(self) -> dict[str, Started]:
        if self._known is None:
            self._known = self._load()
        return self._known

    def note(
        self, statuses: Mapping[str, RolloutStatus], names: Iterable[str] | None = None
    ) -> None:
        """Record every started rollout among ``statuses`` (trusted ones:
        the reader holds the others first), or only among ``names`` of them;
        written only when it grew or one of them ended."""
        known = self.known()
        changed = False
        for name in statuses if names is None else names:
            status = statuses.get(name)
            if status is None or not status.started or status.start_commit is None:
                continue
            entry = Started(status.start_commit, status.terminal)
            if known.get(name) != entry:
                known[name] = entry
                changed = True
        if changed and self.state is not None:
            data = {n: {"startCommit": s.start_commit, "ended": s.ended} for n, s in known.items()}
            self.state.write(STARTED_FILE, json.dumps(data, sort_keys=True) + "\n")

    def wrote(self, name: str, start_commit: str) -> bool:
        """Did the daemon start ``name`` at ``start_commit`` (with or
        without verification, under whatever policy was in force)?"""
        entry = self.known().get(name)
        return entry is not None and entry.start_commit == start_commit

    def gone(self, present: Container[str], held: Container[str]) -> dict[str, Started]:
        """The started rollouts with no status among ``present`` and not
        already ``held``: someone removed what the daemon wrote."""
        return {
            name: entry
            for name, entry in self.known().items()
            if name not in present and name not in held
        }

    def rewound(self, statuses: Mapping[str, RolloutStatus]) -> dict[str, Started]:
        """The rollouts the daemon saw end whose status says they did not:
        the status (or its branch) was put back to an older version."""
        known = self.known()
        return {
            name: entry
            for name, status in statuses.items()
            if (entry := known.get(name)) is not None and entry.ended and not status.terminal
        }

    def _load(self) -> dict[str, Started]:
        text = self.state.read(STARTED_FILE) if self.state is not None else None
        if not text:
            return {}
        try:
            data = json.loads(text)
            return {
                str(name): Started(str(entry["startCommit"]), bool(entry["ended"]))
                for name, entry in data.items()
            }
        except (ValueError, TypeError, KeyError, AttributeError):
            return {}  # rebuilt from the statuses read next


def rewound_reason(name: str, entry: Started) -> str:
    """The message of a rollout whose status went back from its end."""
    path = main_path(name)
    return (
        f"status_tampered: {path} went backwards: the daemon saw rollout {name} (started at "
        f"{entry.start_commit[:12]}) end, and this version has not: nothing is sent for it. "
        "Put the daemon's newest version back (push the branch back to the daemon's last "
        "status commit)"
    )


def gone_reason(name: str, entry: Started) -> str:
    """The held rollout's message: what happened and what a person can do."""
    path = main_path(name)
    return (
        f"status_tampered: {path} is gone, but the daemon started rollout {name} at "
        f"{entry.start_commit[:12]}, and a rollout name is used once: nothing is sent "
        f"for it. Put the daemon's last version back (`git log -p -- {path}`, then "
        "`git revert` the commit that removed it, or push the status branch back), "
        "or roll out under a new name"
    )
