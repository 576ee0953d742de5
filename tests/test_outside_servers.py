"""A slow or endless answer from a server outside the fleet (where the
daemon expects Prometheus, Alertmanager or a notification receiver) is no
evidence for what was asked (for a receiver, a failed attempt), within the
client's deadline and its size cap: the pass never waits on it and the
daemon's memory does not grow with it (docs/trust.md).

The servers are stand-ins (``tests/kit/hostile_servers.py``): a real
Prometheus, Alertmanager or chat webhook cannot be made to drip a byte a
second or send a body that never ends, which is the fault under test. The
daemon, its clients and the simulated fleet are the real ones."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from reconciler.daemon import outside_http
from reconciler.daemon.agent_http import MAX_ANSWER_BYTES
from reconciler.daemon.alertmanager_client import AlertmanagerClient
from reconciler.daemon.metrics import Metrics
from reconciler.daemon.notifications import Backoff, Notifier, resolve
from reconciler.daemon.prometheus_client import PrometheusClient
from reconciler.daemon.range_queries import RangeQueries, RangeQuery
from reconciler.spec.model import Receiver
from reconciler.spec.rollout_status import Hold, RolloutStatus
from reconciler.text.notification_events import rollout_events
from tests.kit.documents import rollout_yaml
from tests.kit.fleets import FleetKit
from tests.kit.hostile_servers import DripServer, EndlessServer, NestedServer
from tests.kit.waiting import wait_for

NOW = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
# Loopback sockets' buffers: what the kernel takes from the server before the
# client reads it (tcp_rmem grows to 32 MiB here, plus the sender's 4 MiB).
SOCKET_BUFFERS = 48 * 1024 * 1024


def _range_query() -> RangeQuery:
    end = datetime.now(UTC)
    return RangeQuery("up", end - timedelta(seconds=5), end, 1)


def _ask_prometheus(url: str, timeout: float) -> str:
    return PrometheusClient(timeout=timeout).query_all(url, ["up"])["up"].error


def _ask_alertmanager(url: str, timeout: float) -> str:
    matchers = ('severity="page"',)
    return AlertmanagerClient(timeout=timeout).ask_all(url, [matchers])[matchers].error


def _ask_range(url: str, timeout: float) -> str:
    query = _range_query()
    return RangeQueries(timeout=timeout).ask_all(url, [query])[query].error


def _ask_range_as_over_https(url: str, timeout: float) -> str:
    # The path an https Prometheus takes, asked over http (as bench/canary.py
    # does): this stand-in has no certificate the system trusts.
    query = _range_query()
    client = RangeQueries(timeout=timeout)
    client._send_all = client._send_all_httpx  # type: ignore[method-assign]
    return client.ask_all(url, [query])[query].error


CLIENTS: dict[str, Callable[[str, float], str]] = {
    "prometheus": _ask_prometheus,
    "alertmanager": _ask_alertmanager,
    "range queries": _ask_range,
    "range queries (https path)": _ask_range_as_over_https,
}


@pytest.mark.parametrize("ask", CLIENTS.values(), ids=CLIENTS.keys())
def test_an_answer_dripping_a_byte_a_second_is_no_evidence_and_is_hung_up_on(
    ask: Callable[[str, float], str],
) -> None:
    with DripServer(interval=0.5, give_up=30) as drip:
        error = ask(drip.url, 1.0)

        wait_for(lambda: drip.hung_up, 10, "the client to hang up")
    assert drip.requests >= 1
    assert drip.gave_up == 0  # the client stopped waiting; the server never had to
    assert "within 1s" in error and drip.url in error


@pytest.mark.parametrize("ask", CLIENTS.values(), ids=CLIENTS.keys())
def test_an_endless_body_is_read_up_to_the_cap_and_no_further(
    ask: Callable[[str, float], str],
) -> None:
    cap = max(outside_http.MAX_BODY_BYTES, MAX_ANSWER_BYTES)
    with EndlessServer(limit=cap + 4 * SOCKET_BUFFERS) as endless:
        error = ask(endless.url, 30.0)

        wait_for(lambda: endless.hung_up, 10, "the client to hang up")
    assert endless.sent <= cap + SOCKET_BUFFERS
    assert "cut off" in error


@pytest.mark.parametrize("ask", CLIENTS.values(), ids=CLIENTS.keys())
def test_an_answer_nested_too_deep_to_parse_is_no_evidence_not_a_failed_pass(
    ask: Callable[[str, float], str],
) -> None:
    with NestedServer(depth=1_000_000) as nested:
        error = ask(nested.url, 30.0)

    assert error and nested.requests >= 1


def test_a_round_stops_asking_a_server_that_did_not_answer_in_time() -> None:
    queries = [f'up{{node="n{i}"}}' for i in range(12)]
    with DripServer(interval=0.5, give_up=30) as drip:
        answers = PrometheusClient(timeout=1.0, concurrency=2).query_all(drip.url, queries)

    errors = [answers[q].error for q in queries]
    timed_out = [e for e in errors if e.endswith("within 1s")]
    assert 1 <= len(timed_out) <= 2 and 1 <= drip.requests <= 2  # the two first in flight
    assert all(e.startswith("not asked: ") for e in errors if e not in timed_out)


def test_a_receiver_dripping_its_answer_is_a_failed_attempt_not_a_stuck_queue() -> None:
    with DripServer(interval=0.5, give_up=30) as drip:
        spec = Receiver(name="ops", url_env="HOOK_URL")
        metrics = Metrics()
        notifier = Notifier(
            resolve([spec], {"HOOK_URL": drip.url + "/hook"}),
            metrics=metrics,
            backoff=Backoff(first=0.05, cap=0.05, give_up=0.5),
            timeout=1.0,
        )
        hold = Hold("health_failed", "health check failed on web-1", NOW, ("web-1",), 1)
        (event,) = rollout_events(None, RolloutStatus("web", phase="paused", hold=hold), "c0ffee")
        try:
            notifier.publish([event])
            wait_for(lambda: notifier.drain(0.1), 20, "the event dropped after its retries")
        finally:
            notifier.close()

    def counted(what: str) -> float | None:
        labels = {"receiver": "ops"}
        return metrics.registry.get_sample_value(f"reconciler_notifications_{what}_total", labels)

    assert counted("dropped") == 1 and counted("sent") == 0
    assert drip.gave_up == 0 and drip.requests >= 1


def _alerts_health() -> str:
    return "{soak: 1s, interval: 1s, alerts: {matchers: ['severity=\"page\"']}}"


def _rollout(**intents: Any) -> dict[str, str]:
    text = rollout_yaml(
        "web", selector={"role": "web"}, live=True, batchSize=1, health=_alerts_health(), **intents
    )
    return {"rollouts/web.yaml": text}


def test_a_dripping_alertmanager_stops_no_pass_and_a_pause_and_an_abort_are_acted_on(
    tmp_path: Path,
) -> None:
    # Alertmanager is asked before the first batch starts: before the fix the
    # very first pass waited on this server for as long as it dripped.
    with DripServer(interval=1.0, give_up=60) as drip:
        settings = f"apiVersion: reconciler/v1\nkind: Settings\nspec:\n  alertmanager: {{url: '{drip.url}'}}\n"
        kit = FleetKit.create(
            tmp_path,
            {"web-1": {"role": "web"}, "web-2": {"role": "web"}},
            files={"reconciler.yaml": settings},
        )
        try:
            kit.push(_rollout())
            daemon = kit.daemon()
            waiting = kit.run_until(daemon, _waits("alertmanager_unreachable"), timeout=120)
            kit.push(_rollout(paused=True), "Pause web")
            paused = kit.run_until(daemon, lambda s: s["web"]["phase"] == "paused", timeout=120)
            kit.push(_rollout(paused=True, abort=True), "Abort web")
            aborted = kit.run_until(daemon, lambda s: s["web"]["phase"] == "aborted", timeout=120)
            executed = list(kit.fleet.stats()["executed"])
        finally:
            kit.close()
    assert drip.gave_up == 0 and drip.requests >= 1  # no pass waited for the drip to end
    assert waiting["web"]["phase"] == "running"
    assert paused["web"]["hold"]["reason"] == "operator_paused"
    assert aborted["web"]["phase"] == "aborted"
    assert executed == []  # no batch started while Alertmanager gave no answer


def _waits(reason: str) -> Callable[[dict[str, Any]], bool]:
    return lambda s: (s.get("web", {}).get("waiting") or {}).get("reason") == reason
