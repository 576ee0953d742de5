"""Model artifacts and how a node takes them on: the files a rollout's target
needs (``target.artifacts``), how they are staged ahead (``stage``), and how a
live node is drained before and warmed up after it switches (``drain``,
``warmup``). Frozen values built by ``documents``, read by the engine, the
job payloads and the views.

Pure: no IO, no clock. Must not validate documents (``documents`` does).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_STAGE_AHEAD = 1
DEFAULT_STAGE_MAX_CONCURRENT = 10
DEFAULT_STAGE_TIMEOUT = 3600  # seconds: 1h
DEFAULT_WARMUP_METHOD = "GET"
DEFAULT_WARMUP_EXPECT_STATUS = 200
DEFAULT_WARMUP_TIMEOUT = 60  # seconds
DEFAULT_WARMUP_TIMES = 1
WARMUP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
MAX_ARTIFACTS = 32
MAX_WARMUPS = 32
# The name ``target.signature`` goes by where staged files are listed.
SIGNATURE_NAME = "signature"


@dataclass(frozen=True)
class Artifact:
    """One file a node must hold before it switches: fetched from ``url``,
    kept under its SHA-256, ``size`` bytes."""

    name: str
    url: str
    sha256: str  # 64 lowercase hex digits
    size: int  # bytes, at least 1
    path: str = ""  # where it lies in the model directory; empty: the name

    @property
    def layout_path(self) -> str:
        """Its relative path in the node's model directory."""
        return self.path or self.name


@dataclass(frozen=True)
class ModelSigner:
    """One entry of ``spec.modelSigners``: a producer whose EC public key
    (PEM text) vouches for the models its ``models`` globs match."""

    name: str
    public_key: str
    models: tuple[str, ...] = ("*",)


@dataclass(frozen=True)
class Stage:
    """How far ahead and how widely a rollout downloads its artifacts."""

    ahead: int = DEFAULT_STAGE_AHEAD  # batches staged ahead of the one applied
    max_concurrent: int = DEFAULT_STAGE_MAX_CONCURRENT  # nodes staging at once
    timeout_seconds: int = DEFAULT_STAGE_TIMEOUT  # per node


@dataclass(frozen=True)
class Drain:
    """Before a live node switches: its drain command, then a wait until the
    metric ``idle_metric`` at ``idle_url`` (Prometheus text, summed over its
    series; several metrics are summed together) is at most ``idle_max``,
    all within ``timeout_seconds``. ``runtime`` names the preset it was
    expanded from, if any."""

    timeout_seconds: int
    idle_url: str  # may hold {node}
    idle_metric: str | tuple[str, ...]  # one name as written, or several
    idle_max: float
    runtime: str = ""

    @property
    def idle_metrics(self) -> tuple[str, ...]:
        metric = self.idle_metric
        return (metric,) if isinstance(metric, str) else metric


@dataclass(frozen=True)
class Warmup:
    """One warm-up request, sent ``times`` times after the switch and before
    the node takes requests again. ``runtime`` names the preset it was
    expanded from, if any."""

    url: str  # may hold {node}
    method: str = DEFAULT_WARMUP_METHOD
    body: str = ""
    expect_status: int = DEFAULT_WARMUP_EXPECT_STATUS
    timeout_seconds: int = DEFAULT_WARMUP_TIMEOUT
    times: int = DEFAULT_WARMUP_TIMES
    runtime: str = ""  # the preset it was expanded from, if any


def total_size(artifacts: tuple[Artifact, ...]) -> int:
    """Bytes one node downloads when it holds none of ``artifacts``."""
    return sum(a.size for a in artifacts)
