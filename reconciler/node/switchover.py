"""Taking a live node out of service and back for a switch: the drain
command and the wait until the runtime is idle (its Prometheus text on
loopback, the metrics summed over their series), the warm-up requests after
the new config is active, the undrain command, and the moments each step
ended (``timings`` in the job record, agent clock).

Only the node itself is asked: a URL must resolve to loopback or an
address of this machine, as for the agent's http checks.

Must not: write configs or run ``--after-apply`` (``job_runner`` does, in
between these steps); take a command from a job.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

from reconciler.node.probes import ProbeFailed, own_addresses
from reconciler.protocol.job_view import JobDrain, JobWarmup
from reconciler.spec import runtime_presets
from reconciler.spec.times import format_time


def _local_client() -> httpx.Client:
    """A client for the node's own endpoints. Their certificate, when they
    have one, is often self-signed: locality is what is relied on, as for
    the http checks; and loading a CA store would cost more than the call."""
    return httpx.Client(verify=False)


IDLE_POLL = 0.05  # seconds between reads of the idle metric (a loopback GET)
STARTING_POLL = 0.2  # seconds between warm-up requests to a runtime still starting
TIMING_FIELDS = ("drainStartedAt", "drainedAt", "activatedAt", "warmedAt", "servingAt")


class SwitchFailed(Exception):
    """A drain or warm-up that did not hold, as ``code: message``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.text = f"{code}: {message}"


@dataclass
class Timings:
    """When each step of a live switch ended (RFC 3339, agent clock)."""

    clock: Callable[[], datetime]
    moments: dict[str, str | None] = field(default_factory=lambda: dict.fromkeys(TIMING_FIELDS))

    def mark(self, step: str) -> None:
        self.moments[step] = format_time(self.clock())

    def record(self) -> dict[str, str | None]:
        return dict(self.moments)


def _local(url: str, code: str) -> None:
    parts = urlsplit(url)
    try:
        own_addresses(parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))
    except ProbeFailed as exc:
        raise SwitchFailed(code, f"{exc}; nothing was changed") from None


def metric_sums(text: str, metrics: Sequence[str]) -> dict[str, float]:
    """Each of ``metrics`` summed over its samples in Prometheus text; a
    metric absent from the text is absent from the answer."""
    wanted = set(metrics)
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                found[sample.name] = found.get(sample.name, 0.0) + float(sample.value)
    return found


def idle_reading(
    client: httpx.Client, url: str, metrics: str | Sequence[str], timeout: float
) -> float:
    """The sum of the idle metrics now; ValueError saying why it cannot be
    read. Every metric must be there: one missing is no reading, since a
    runtime that does not publish it may well be busy."""
    names = (metrics,) if isinstance(metrics, str) else tuple(metrics)
    try:
        answer = client.get(url, timeout=timeout)
    except httpx.HTTPError as exc:
        raise ValueError(f"GET {url}: {exc}") from None
    if answer.status_code != 200:
        raise ValueError(
            f"GET {url} answered {answer.status_code}, so {', '.join(names)} could not be read"
            + _hints(names)
        )
    try:
        values = metric_sums(answer.text, names)
    except ValueError as exc:
        raise ValueError(f"{url} is not Prometheus text: {exc}") from None
    missing = [m for m in names if m not in values]
    if missing:
        raise ValueError(f"{', '.join(missing)} absent from {url}" + _hints(missing))
    return sum(values.values())


def _hints(metrics: Sequence[str]) -> str:
    """How to switch on the runtimes that publish ``metrics`` (presets only)."""
    hints = dict.fromkeys(h for m in metrics if (h := runtime_presets.metrics_hint(m)))
    return "".join(f": {h}" for h in hints)


def wait_idle(drain: JobDrain, deadline: float) -> None:
    """Until the idle metric is at most its ``max``, or ``drain_timeout``
    at ``deadline`` (``time.monotonic``)."""
    url, metrics, most = drain.idle_url, drain.idle_metrics, drain.idle_max
    _local(url, "drain_timeout")
    last = "not read yet"
    with _local_client() as client:
        while True:
            left = deadline - time.monotonic()
            try:
                value = idle_reading(client, url, metrics, max(0.1, min(left, 5.0)))
                if value <= most:
                    return
                last = f"{' + '.join(metrics)} was {value:g}, more than {most:g}"
            except ValueError as exc:
                last = str(exc)
            if time.monotonic() + IDLE_POLL > deadline:
                raise SwitchFailed(
                    "drain_timeout",
                    f"not idle within {drain.timeout_seconds}s ({last}); nothing was changed",
                )
            time.sleep(IDLE_POLL)


def _content_type(body: str) -> dict[str, str]:
    """A JSON body says so: some runtimes (TGI) refuse JSON sent without
    ``Content-Type: application/json``."""
    if not body.lstrip().startswith(("{", "[")):
        return {}
    try:
        json.loads(body)
    except ValueError:
        return {}
    return {"Content-Type": "application/json"}


def warm_up(warmups: Sequence[JobWarmup]) -> None:
    """Send each warm-up request ``times`` times; ``warmup_failed`` at the
    first that does not answer its ``expectStatus`` in time. A runtime still
    starting (connection refused, or 503 while it loads) is asked again
    until the request's timeout: readiness may be left to the warm-up."""
    if not warmups:
        # Most applies have none: building a client would load httpx's
        # transport stack, a one-time cost the agent's first job would pay.
        return
    with _local_client() as client:
        for warmup in warmups:
            _local(warmup.url, "warmup_failed")
            for turn in range(1, warmup.times + 1):
                where = f"{warmup.method} {warmup.url} (time {turn} of {warmup.times})"
                status = _warm_once(client, warmup, where)
                if status != warmup.expect_status:
                    raise SwitchFailed(
                        "warmup_failed",
                        f"{where} answered {status} (expected {warmup.expect_status})",
                    )


def _warm_once(client: httpx.Client, warmup: JobWarmup, where: str) -> int:
    """One warm-up request's status, asked again while the runtime starts."""
    timeout = float(warmup.timeout_seconds)
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            answer = client.request(
                warmup.method,
                warmup.url,
                content=warmup.body.encode() or None,
                headers=_content_type(warmup.body),
                timeout=max(left, 0.001),
            )
        except httpx.TimeoutException:
            raise SwitchFailed(
                "warmup_failed", f"{where}: no answer within {warmup.timeout_seconds}s"
            ) from None
        except httpx.ConnectError as exc:
            if time.monotonic() + STARTING_POLL >= deadline:
                raise SwitchFailed(
                    "warmup_failed", f"{where}: {exc}, still after {warmup.timeout_seconds}s"
                ) from None
        except httpx.HTTPError as exc:
            raise SwitchFailed("warmup_failed", f"{where}: {exc}") from None
        else:
            starting = answer.status_code == 503 and warmup.expect_status != 503
            if not starting or time.monotonic() + STARTING_POLL >= deadline:
                return answer.status_code
        time.sleep(STARTING_POLL)
