"""Domain values read from the fleet repository: nodes, rollouts, settings,
and the problems found while reading them. Frozen dataclasses; built by
``documents``, consumed by the engine and everything else. Pure: no IO.

Field names follow the documents (docs/configuration.md) in snake_case.
Defaults here are the defaults the schemas declare; a test checks both agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from functools import cached_property

from reconciler.spec.artifacts import Artifact, Drain, ModelSigner, Stage, Warmup
from reconciler.spec.evals import Eval
from reconciler.spec.health import Health

API_VERSION = "reconciler/v1"

ON_FAILURE_MODES = ("observe", "pause", "retry_once", "stop", "rollback")

DEFAULT_BATCH_SIZE = 1
DEFAULT_HEALTH_TIMEOUT = 300  # seconds: 5m
DEFAULT_ON_FAILURE = "pause"
DEFAULT_OFFLINE_AFTER = 120  # seconds: 2m
DEFAULT_FLEET_CHECK_INTERVAL = 60  # seconds: 1m; 0 turns the fleet watch off


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one document, in words a person can act on.

    Renders as ``rollouts/llama.yaml:7:14: spec.batchSize: must be at least 1, got 0``.
    ``line`` and ``column`` are 1-based; 0 means the whole file.
    """

    path: str
    line: int
    column: int
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}:{self.column}" if self.line else self.path
        return (
            f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"
        )


@dataclass(frozen=True)
class Target:
    runtime: str
    provider: str
    model: str
    profile: str = "default"


# Labels a node must carry, as (key, value) pairs sorted by key.
Selector = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Node:
    name: str
    agent: str
    labels: tuple[tuple[str, str], ...] = ()  # sorted by key
    maintenance: bool = False
    agent_key: str | None = None  # OpenSSH Ed25519 public key line (docs/trust.md)
    agent_cert_sha256: str | None = None  # pin of an https:// agent's certificate

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)

    def matches(self, selector: Selector) -> bool:
        """Does this node carry every label of ``selector``? The one rule
        for a rollout's selector, a comparison's baseline and an approval
        rule's selector (an empty selector matches every node)."""
        labels = dict(self.labels)
        return all(labels.get(key) == value for key, value in selector)


@dataclass(frozen=True)
class RollbackRequest:
    id: str
    nodes: tuple[str, ...] | None  # None means ``all``


@dataclass(frozen=True)
class SpreadBy:
    """``spreadBy`` (docs/capacity.md): no batch holds more than
    ``max_per_batch`` nodes sharing one value of the label ``label``."""

    label: str
    max_per_batch: int | str  # as written: 1, or "50%" of the nodes sharing a value


@dataclass(frozen=True)
class RolloutSpec:
    """A rollout as its file declares it, with settings defaults applied."""

    name: str
    target: Target
    selector: tuple[tuple[str, str], ...] | None = None  # sorted by key
    node_ids: tuple[str, ...] | None = None  # order kept, duplicates dropped
    batch_size: int = DEFAULT_BATCH_SIZE
    health_timeout: int = DEFAULT_HEALTH_TIMEOUT  # seconds
    live: bool = False
    on_failure: str = DEFAULT_ON_FAILURE
    pause_after: tuple[int, ...] = ()  # 1-based batch numbers, plain and timed
    pause_for: tuple[tuple[int, int], ...] = ()  # (batch, seconds) of timed pauseAfter entries
    start_at: str | None = None  # RFC 3339 text, as written
    include_maintenance: bool = False
    allow_overlap: bool = False
    # operator intents
    paused: bool = False
    abort: bool = False
    resume_request: str = ""
    skip_nodes: tuple[str, ...] = ()
    rollback_request: RollbackRequest | None = None
    health: Health | None = None  # spec.health (docs/health.md); None: version 1's rule only
    # rollout shapes (docs/rollouts.md)
    batches: tuple[int | str, ...] = ()  # as written: 3 or "10%"; () means batchSize
    after: tuple[str, ...] = ()  # rollouts that must complete first
    ignore_windows: bool = False
    # version 3: capacity (docs/capacity.md)
    spread_by: SpreadBy | None = None
    failure_budget: int | str | None = None  # as written: 3, or "5%" of the frozen nodes
    # version 3: model artifacts (docs/rollouts.md)
    artifacts: tuple[Artifact, ...] = ()  # target.artifacts
    stage: Stage | None = None  # set whenever there are artifacts
    drain: Drain | None = None  # live only
    warmup: tuple[Warmup, ...] = ()  # live only
    # version 4: model signatures (docs/rollouts.md)
    signature: Artifact | None = None  # target.signature, staged like an artifact
    signers: tuple[ModelSigner, ...] = ()  # of reconciler.yaml, those covering target.model
    # version 4: golden prompts (docs/evals.md), each with its suite once assembled
    evals: tuple[Eval, ...] = ()  # live only
    # version 4: warm standby (docs/rollouts.md): keepPrevious, live only
    standby: str | None = None  # untilSoaked | untilCompleted


@dataclass(frozen=True)
class Window:
    """A deploy window of settings: on ``days`` (0 Monday .. 6 Sunday), from
    ``start`` to ``end`` minutes after local midnight in ``zone``. ``zone``
    is the resolved IANA zone, read by ``documents`` so that the engine,
    which must not read files, only computes with it."""

    days: frozenset[int]
    start: int  # minutes after midnight, local
    end: int  # minutes after midnight, local; after start, at most 24:00
    timezone: str  # the IANA name as written
    zone: tzinfo = field(compare=False, repr=False)


@dataclass(frozen=True)
class Freeze:
    """No batch starts from ``start`` until ``end`` (UTC)."""

    start: datetime
    end: datetime
    reason: str = ""


@dataclass(frozen=True)
class Defaults:
    batch_size: int = DEFAULT_BATCH_SIZE
    health_timeout: int = DEFAULT_HEALTH_TIMEOUT
    on_failure: str = DEFAULT_ON_FAILURE


# Notification events (docs/operating.md): rollout events, then the
# fleet watch's events.
NOTIFICATION_EVENTS = (
    "hold",
    "completed",
    "failed",
    "aborted",
    "rolled_back",
    "node_offline",
    "node_drift",
)
NOTIFICATION_FORMATS = ("json", "slack")


@dataclass(frozen=True)
class Receiver:
    """One entry of ``spec.notifications``: where events go. The URL and
    the secret are secrets, so the document names environment variables."""

    name: str
    url_env: str
    format: str = "json"
    secret_env: str | None = None
    events: tuple[str, ...] = NOTIFICATION_EVENTS
    rollouts: tuple[str, ...] = ()  # globs on rollout names; empty: every rollout


@dataclass(frozen=True)
class ApprovalRule:
    """One entry of ``spec.approvalRules`` (docs/approval-rules.md): the
    changes it covers (nodes by ``selector`` or ``node_ids``, or
    ``reconciler.yaml`` with ``settings``) need ``require`` approvals from
    distinct people among ``principals`` (allowed-signers principals)."""

    name: str
    principals: tuple[str, ...]
    require: int
    selector: tuple[tuple[str, str], ...] | None = None  # sorted by key
    node_ids: tuple[str, ...] | None = None
    settings: bool = False

    def covers_node(self, node: Node) -> bool:
        """Is ``node`` one of the rule's nodes (in the tree it was read from)?"""
        if self.node_ids is not None:
            return node.name in self.node_ids
        return self.selector is not None and node.matches(self.selector)


@dataclass(frozen=True)
class Settings:
    status_branch: str | None = None
    offline_after: int = DEFAULT_OFFLINE_AFTER  # seconds
    defaults: Defaults = field(default_factory=Defaults)
    fleet_check_interval: int = DEFAULT_FLEET_CHECK_INTERVAL  # seconds; 0: off
    prometheus_url: str | None = None  # spec.prometheus.url (docs/health.md)
    alertmanager_url: str | None = None  # spec.alertmanager.url (docs/health.md)
    windows: tuple[Window, ...] = ()  # empty: any time is inside a window
    freezes: tuple[Freeze, ...] = ()
    notifications: tuple[Receiver, ...] = ()
    approval_rules: tuple[ApprovalRule, ...] = ()  # empty: version 2's rule only
    model_signers: tuple[ModelSigner, ...] = ()  # empty: no model needs a signature


@dataclass(frozen=True)
class Fleet:
    """Every valid node document of one tree, by name."""

    nodes: tuple[Node, ...] = ()

    def by_name(self) -> dict[str, Node]:
        return {node.name: node for node in self.nodes}

    @cached_property
    def index(self) -> FleetIndex:
        """The nodes by name and by label, built once per fleet value and
        forgotten with it: a pass (and the next, while the node files stay
        the same) hands the same value to every call."""
        return FleetIndex(self)


class FleetIndex:
    """A fleet's nodes by name and by label (read only)."""

    def __init__(self, fleet: Fleet) -> None:
        self.by_name = fleet.by_name()
        self.by_label: dict[tuple[str, str], list[Node]] = {}
        for node in fleet.nodes:
            for pair in dict.fromkeys(node.labels):
                self.by_label.setdefault(pair, []).append(node)
