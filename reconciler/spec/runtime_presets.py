"""Runtime presets: what ``drain.idle: {runtime, port}`` and a ``warmup``
entry ``{runtime, port, times}`` stand for, per inference runtime, as one
table. The daemon expands a preset into the plain url and metrics before it
signs a job, so an agent reads the same fields whether a rollout named a
preset or wrote them out; the agent looks a metric up here only to say how
to switch that runtime's metrics on when one is missing.

Pure data and lookups. Must not read documents or do IO.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class RuntimePreset:
    """One runtime: the gauges of requests it is running and waiting
    (idle when their sum is small enough), and how to make it publish them."""

    idle_metrics: tuple[str, ...]
    metrics_hint: str  # what to do when its metrics are absent


PRESETS: dict[str, RuntimePreset] = {
    "vllm": RuntimePreset(
        ("vllm:num_requests_running", "vllm:num_requests_waiting"),
        "vLLM serves them on /metrics of its API port: check the port, and do not "
        "start it with --disable-log-stats",
    ),
    "sglang": RuntimePreset(
        ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
        "start SGLang with --enable-metrics",
    ),
    "llama.cpp": RuntimePreset(
        ("llamacpp:requests_processing", "llamacpp:requests_deferred"),
        "start llama-server with --metrics",
    ),
    "tgi": RuntimePreset(
        ("tgi_queue_size", "tgi_batch_current_size"),
        "TGI serves them on /metrics: give the port that serves them (its "
        "--prometheus-port where the release has one)",
    ),
}

WARMUP_PATH = "/v1/completions"  # the OpenAI-compatible route every preset runtime serves
WARMUP_METHOD = "POST"
WARMUP_BODY = json.dumps({"prompt": "Hello", "max_tokens": 1, "temperature": 0})
WARMUP_EXPECT_STATUS = 200


def metrics_url(port: int) -> str:
    return f"http://127.0.0.1:{port}/metrics"


def warmup_url(port: int) -> str:
    return f"http://127.0.0.1:{port}{WARMUP_PATH}"


def metrics_hint(metric: str) -> str:
    """How to switch on the runtime that publishes ``metric``; empty when no
    preset runtime does."""
    for preset in PRESETS.values():
        if metric in preset.idle_metrics:
            return preset.metrics_hint
    return ""
