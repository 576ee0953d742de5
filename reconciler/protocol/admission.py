"""The checks every agent runs on a posted job, in the order docs/protocol.md fixes, shared by the real agent and the simulated fleet so both
refuse the same envelopes with the same codes.

    invalid_job, untrusted_key, bad_signature   (signing.verify_envelope)
    wrong_node, expired, not_yet_valid, unsupported_runtime,
    live_not_allowed, job_conflict              (here)

Pure: the agent's clock reading and what it already knows come in as
arguments. Refusing writes nothing; what to do with an admitted job is the
caller's business.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from datetime import datetime, timedelta
from typing import Any

from reconciler.protocol.job_payload import same_job
from reconciler.protocol.signing import JobRefused, TrustedKey, verify_envelope
from reconciler.spec.times import format_time, parse_time

MAX_CLOCK_AHEAD = timedelta(minutes=2)


def admit_job(
    envelope: Any,
    *,
    node: str,
    trusted: Mapping[str, TrustedKey],
    now: datetime,
    runtimes: Collection[str] | None,
    allow_live: bool,
    known: Callable[[str], Mapping[str, Any] | None],
    path_node: str | None = None,
) -> dict[str, Any]:
    """The verified payload, or ``JobRefused`` with the first failing check's code.

    ``node`` is the node this agent is (or, in the simulator, the node the
    request's path names); ``runtimes`` None means every runtime is managed;
    ``known`` returns the payload already recorded under a job id, or None;
    ``path_node`` is the node the request's URL names, when it may differ.
    """
    payload = verify_envelope(envelope, trusted)
    if payload["node"] != node:
        raise JobRefused(
            "wrong_node",
            f"this agent is node {node}; the job is addressed to {payload['node']}",
        )
    if path_node is not None and path_node != node:
        raise JobRefused(
            "wrong_node", f"this agent is node {node}; the request was sent for {path_node}"
        )
    expires = parse_time(payload["expiresAt"])
    if now >= expires:
        raise JobRefused(
            "expired",
            f"the job expired at {payload['expiresAt']} (agent clock {format_time(now)}); "
            "the daemon sends it again with a fresh signature",
        )
    issued = parse_time(payload["issuedAt"])
    if issued - now > MAX_CLOCK_AHEAD:
        raise JobRefused(
            "not_yet_valid",
            f"the job was issued at {payload['issuedAt']}, more than 2 minutes ahead of the "
            f"agent clock ({format_time(now)}); check both clocks (NTP)",
        )
    runtime = payload["target"]["runtime"]
    if runtimes is not None and runtime not in runtimes:
        managed = ", ".join(sorted(runtimes)) or "none"
        raise JobRefused(
            "unsupported_runtime",
            f"runtime {runtime} is not managed on node {node} (managed: {managed})",
        )
    if payload["mode"] == "live" and not allow_live:
        raise JobRefused(
            "live_not_allowed",
            f"node {node} accepts dry-run jobs only; start its agent with --allow-live-apply",
        )
    previous = known(payload["jobId"])
    if previous is not None and not same_job(previous, payload):
        differing = sorted(
            k
            for k in (set(previous) | set(payload)) - {"issuedAt", "expiresAt"}
            if previous.get(k) != payload.get(k)
        )
        raise JobRefused(
            "job_conflict",
            f"job {payload['jobId']} is already known here with a different payload "
            f"(differs in {', '.join(differing)}); a job id must always carry the same payload",
        )
    return payload
