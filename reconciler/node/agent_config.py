"""The agent's settings, as its command line gives them.

Must not: read files or the environment (the command does, then builds this).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from reconciler.protocol.signing import SigningKey, TrustedKey

DEFAULT_RETENTION = 20
DEFAULT_AFTER_APPLY_TIMEOUT = 60.0
DEFAULT_KEEP_FIRST_BACKUPS = 30 * 24 * 3600  # seconds
DEFAULT_KEEP_ARTIFACTS = 2  # per runtime, beyond those pinned


SLOT_NAMES = ("a", "b")


@dataclass(frozen=True)
class SlotCommands:
    """Two copies of each runtime, side by side (``--slot-ports`` and the
    three ``--slot-*-command`` options): slot ``a`` on ``ports[0]``, slot
    ``b`` on ``ports[1]``; node-local commands, like ``--after-apply``."""

    ports: tuple[int, int]
    start: str
    route: str
    stop: str

    def port(self, slot: str) -> int:
        return self.ports[SLOT_NAMES.index(slot)]


@dataclass(frozen=True)
class AgentConfig:
    node: str
    trusted: Mapping[str, TrustedKey]
    runtimes: frozenset[str]
    allow_live: bool = False
    after_apply: str | None = None
    after_apply_timeout: float = DEFAULT_AFTER_APPLY_TIMEOUT
    backup_retention: int = DEFAULT_RETENTION
    key: SigningKey | None = None  # signs every answer (docs/trust.md); None: unsigned
    keep_first_backups: int = DEFAULT_KEEP_FIRST_BACKUPS  # seconds
    drain_command: str | None = None  # run before a live apply with drain
    undrain_command: str | None = None  # run once the node may take requests again
    stage_rate: int | None = None  # bytes per second of artifact downloads; None: uncapped
    ca_file: str | None = None  # CAs trusted for https downloads besides the system store
    keep_artifacts: int = DEFAULT_KEEP_ARTIFACTS
    slots: SlotCommands | None = None  # None: no warm standby (applies with one are refused)
