"""Statuses for the web page's tests and screenshots, as the engine records
them: a failed live canary held with the engine's own message and its
comparison, a soaking node, and a model rollout in progress with staging,
drain, warm-up and out-of-service times."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from reconciler.engine.holds import hold_message
from reconciler.spec.artifact_records import StageRecord
from reconciler.spec.compare import Comparison, Measured
from reconciler.spec.health import Health
from reconciler.spec.rollout_status import CheckOutcome, Hold, RolloutStatus
from reconciler.spec.times import format_time
from tests.kit.documents import T0, make_status

LATENCY = Comparison("latency-p95", 0.1, query='latency{node="{node}"}')
ERRORS = Comparison("errors", 0.01, errors="e", total="t")
HEALTH = Health(soak=600, interval=5, compare=(LATENCY, ERRORS))


def failed_canary(name: str = "canary") -> RolloutStatus:
    """A live rollout whose canary failed its latency comparison: held, the
    hold's message offering the rollback."""
    status = make_status(name, "paused", [("gpu-1", 1, "failed"), ("gpu-2", 2, "pending")])
    assert status.frozen is not None
    measured = Measured(
        "median", 0.41234567, 13, 0.2501234, 26, ("gpu-2",), 0.6485, 1.2345e-5,
        canary_spread=(0.301, 0.38, 0.455, 0.61), baseline_spread=(0.19, 0.231, 0.268, 0.334),
    )  # fmt: skip
    error = "health check latency-p95 failed: canary median 0.412 over 0.25 (+64.8%)"
    check = CheckOutcome("latency-p95", False, "median 0.412 vs 0.25 …", measured)
    node = replace(status.nodes[0], checks=(check,), error=error, held="health_failed")
    message = hold_message("health_failed", rollout=name, nodes=["gpu-1"], error=error, live=True)
    return replace(
        status,
        frozen=replace(status.frozen, health=HEALTH),
        hold=Hold("health_failed", message, T0, ("gpu-1",), 1),
        nodes=(node, *status.nodes[1:]),
    )


def soaking(name: str = "soak") -> RolloutStatus:
    """A live node sent and soaking: one comparison decided, one pending."""
    status = make_status(name, "running", [("gpu-1", 1, "dispatched"), ("gpu-2", 2, "pending")])
    assert status.frozen is not None
    decided = CheckOutcome(
        "errors",
        True,
        "rate …",
        Measured("rate", 0.00123, 12, 0.0011, 30, ("gpu-2",), 0.00013, 0.4),
    )
    node = replace(
        status.nodes[0],
        dispatched_at=T0,
        deadline=T0 + timedelta(minutes=15, seconds=7),
        checks=(decided,),
    )
    return replace(
        status, frozen=replace(status.frozen, health=HEALTH), nodes=(node, *status.nodes[1:])
    )


def model_rollout(name: str = "llama-3") -> RolloutStatus:
    """A model rollout in its third batch: two batches switched, with their
    stage jobs, drain, warm-up and out-of-service times; the third soaking."""
    placed = [(f"gpu-{i}", 1 + (i - 1) // 3, "succeeded") for i in range(1, 7)]
    placed += [("gpu-7", 3, "dispatched"), ("gpu-8", 3, "staged"), ("gpu-9", 3, "staged")]
    status = make_status(name, "running", placed, batch_size=3)
    assert status.frozen is not None
    nodes = []
    for i, node in enumerate(status.nodes):
        start = T0 + timedelta(minutes=4 * i)
        stage = StageRecord(f"stage-{node.name}", 1, "staged", start, start + timedelta(seconds=95))
        if node.state == "staged":
            nodes.append(replace(node, stage=stage))
            continue
        drain = start + timedelta(minutes=2)
        times = {
            "drainStartedAt": drain,
            "drainedAt": drain + timedelta(seconds=8 + i),
            "activatedAt": drain + timedelta(seconds=10 + i),
            "warmedAt": drain + timedelta(seconds=31 + 3 * i),
            "servingAt": drain + timedelta(seconds=33 + 3 * i),
        }
        timings = {k: format_time(v) for k, v in times.items()}
        out = (times["servingAt"] - times["drainStartedAt"]).total_seconds()
        nodes.append(
            replace(
                node,
                stage=stage,
                timings=timings,
                out_of_service=out if node.state == "succeeded" else None,
                dispatched_at=drain,
                deadline=drain + timedelta(minutes=15),
            )
        )
    health = Health(soak=600, interval=5, compare=(LATENCY,))
    return replace(status, frozen=replace(status.frozen, health=health), nodes=tuple(nodes))


def held(name: str = "web") -> RolloutStatus:
    """A dry run paused by the operator in its second batch."""
    status = make_status(
        name,
        "paused",
        [("web-1", 1, "succeeded"), ("web-2", 2, "dispatched"), ("web-3", 3, "pending")],
        live=False,
        operator_paused=True,
    )
    message = hold_message("operator_paused", rollout=name)
    return replace(status, hold=Hold("operator_paused", message, T0, (), 0))
