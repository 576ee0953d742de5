"""Model artifacts in words, for ``plan``, ``status`` and the dashboard:
sizes in binary units, what a rollout downloads, and its drain, warm-up and
time out of service. Pure text from values; must not read status files.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from reconciler.spec.artifacts import Artifact, Drain, Warmup
from reconciler.spec.durations import format_duration
from reconciler.spec.rollout_status import FrozenSpec, NodeRecord
from reconciler.text import standby_text

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def size_words(count: int) -> str:
    """``4.6 GiB``, ``512 B``: a byte count as people read it."""
    value = float(count)
    for unit in _UNITS:
        if value < 1024 or unit == _UNITS[-1]:
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def artifact_words(artifacts: Sequence[Artifact], to_stage: int) -> str:
    """``artifacts weights (4.6 GiB), tokenizer (1.0 KiB): 9.2 GiB to download
    (2 artifact(s) x 2 node(s) not staged)``."""
    each = ", ".join(
        f"{a.name}{f' as {a.path}' if a.path and a.path != a.name else ''} ({size_words(a.size)})"
        for a in artifacts
    )
    total = sum(a.size for a in artifacts) * to_stage
    return (
        f"artifacts {each}: {size_words(total)} to download "
        f"({len(artifacts)} artifact(s) x {to_stage} node(s) not staged)"
    )


def headline_words(
    rollout: str,
    artifacts: Sequence[Artifact],
    to_stage: int,
    drain: Drain | None,
    warmup: Sequence[Warmup],
) -> str:
    """``stage llama: 9.2 GiB to download ahead (2 artifact(s), 2 node(s)); drain: yes,
    warm-up: no``."""
    total = sum(a.size for a in artifacts) * to_stage
    return (
        f"stage {rollout}: {size_words(total)} to download ahead ({len(artifacts)} "
        f"artifact(s), {to_stage} node(s)); drain: {'yes' if drain else 'no'}, "
        f"warm-up: {'yes' if warmup else 'no'}"
    )


def signer_words(signers: Sequence[str]) -> str:
    """Who vouches for a rollout's files: ``signed by ml-release``."""
    if not signers:
        return "unsigned (no signer covers this model)"
    return f"signed by {' or '.join(signers)}"


def vouched_words(node: NodeRecord) -> str:
    """Who vouched for a node's files, as its stage verified them:
    ``signed by ml-release (signature 5e5e5e5e5e5e)``; "" when no one did."""
    vouched = node.stage.signature if node.stage is not None else None
    if vouched is None:
        return ""
    return f"signed by {vouched.signer} (signature {vouched.sha256[:12]})"


def drain_words(drain: Drain | None) -> str:
    if drain is None:
        return "no drain: nodes switch while serving"
    metrics = " + ".join(drain.idle_metrics)
    preset = f" ({drain.runtime} preset)" if drain.runtime else ""
    return (
        f"drain{preset}: within {format_duration(drain.timeout_seconds)}, until {metrics} "
        f"at {drain.idle_url} is at most {drain.idle_max:g}"
    )


def warmup_words(warmup: Sequence[Warmup]) -> str:
    if not warmup:
        return "no warm-up"
    requests = ", ".join(
        f"{w.method} {w.url} x{w.times}" + (f" ({w.runtime} preset)" if w.runtime else "")
        for w in warmup
    )
    return f"warm-up: {requests}"


def not_staged(nodes: Iterable[str], records: Sequence[NodeRecord]) -> int:
    """How many of ``nodes`` still have to download: those whose record
    does not say staged."""
    staged = {n.name for n in records if n.stage is not None and n.stage.state == "staged"}
    return sum(1 for name in nodes if name not in staged)


def longest_out_of_service(nodes: Iterable[NodeRecord]) -> float | None:
    """The longest ``outOfService`` among ``nodes`` (None: none recorded)."""
    times = [n.out_of_service for n in nodes if n.out_of_service is not None]
    return max(times) if times else None


def seconds_words(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 60 else format_duration(round(seconds))


def batch_words(nodes: Iterable[NodeRecord]) -> str:
    """What a batch's nodes say about staging and time out of service:
    ``2 staged, 1 staging · longest out of service 0.4 s``; "" when nothing."""
    counts = {"staged": 0, "staging": 0, "stage failed": 0}
    longest: float | None = None
    nodes = list(nodes)
    for node in nodes:
        if node.state in ("staged", "staging"):
            counts[node.state] += 1
        elif node.stage is not None and node.stage.state == node.state:
            counts["stage failed"] += 1  # failed or unknown at staging
        if node.out_of_service is not None:
            longest = max(node.out_of_service, longest or 0.0)
    parts = [", ".join(f"{n} {what}" for what, n in counts.items() if n)]
    if longest is not None:
        parts.append(f"longest out of service {seconds_words(longest)}")
    parts.append(standby_text.batch_words(nodes))
    return " · ".join(p for p in parts if p)


def detail_lines(frozen: FrozenSpec) -> list[str]:
    """``status NAME``'s lines about a rollout's artifacts, drain and warm-up."""
    if not frozen.artifacts and frozen.drain is None and not frozen.warmup:
        return []
    lines = []
    if frozen.artifacts:
        each = ", ".join(f"{a.name} ({size_words(a.size)})" for a in frozen.artifacts)
        lines.append(f"  artifacts {each}")
        if frozen.stage is not None:
            stage = frozen.stage
            lines.append(
                f"  stage     {stage.ahead} batch(es) ahead, at most {stage.max_concurrent} "
                f"at once, {format_duration(stage.timeout_seconds)} per node"
            )
    if frozen.signature is not None:
        signers = " or ".join(s.name for s in frozen.signers) or "no signer"
        lines.append(
            f"  signature {frozen.signature.sha256[:12]} ({size_words(frozen.signature.size)}), "
            f"checked on each node against {signers}"
        )
    lines.append(f"  drain     {drain_words(frozen.drain).removeprefix('drain: ')}")
    lines.append(f"  warm-up   {warmup_words(frozen.warmup).removeprefix('warm-up: ')}")
    return lines
