"""Delivery of notification events (docs/operating.md) to a real HTTP
receiver on 127.0.0.1 (tests/kit/webhook.py): retries with the same delivery
id, 4xx dropped, HMAC, giving up, bounded queues, and the checks at start."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from reconciler.daemon.logs import EventLog
from reconciler.daemon.metrics import Metrics
from reconciler.daemon.notifications import (
    Backoff,
    Notifier,
    ReceiverConfigError,
    resolve,
)
from reconciler.spec.model import Receiver
from reconciler.spec.rollout_status import Hold, RolloutStatus
from reconciler.text.notification_events import Event, rollout_events
from tests.kit.fleets import FleetKit
from tests.kit.webhook import Receiver as Hook

FAST = Backoff(first=0.05, cap=0.2, give_up=30.0)
SINCE = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def hold_event(name: str = "web") -> Event:
    hold = Hold("health_failed", "health check failed on web-1", SINCE, ("web-1",), 1)
    (event,) = rollout_events(None, RolloutStatus(name, phase="paused", hold=hold), "c0ffee")
    return event


@pytest.fixture
def hook() -> Iterator[Hook]:
    with Hook() as hook:
        yield hook


def notifier(hook: Hook, metrics: Metrics, backoff: Backoff = FAST, **receiver: object) -> Notifier:
    env = {"HOOK_URL": hook.url, "HOOK_SECRET": "s3cret"}
    spec = Receiver(name="ops", url_env="HOOK_URL", **receiver)  # type: ignore[arg-type]
    return Notifier(resolve([spec], env), metrics=metrics, backoff=backoff, timeout=1.0)


def counter(metrics: Metrics, what: str) -> float:
    value = metrics.registry.get_sample_value(
        f"reconciler_notifications_{what}_total", {"receiver": "ops"}
    )
    return value or 0.0


def test_three_500s_then_the_fourth_try_arrives_with_the_same_delivery_id(hook: Hook) -> None:
    metrics = Metrics()
    n = notifier(hook, metrics)
    hook.fail_next(3)
    try:
        n.publish([hold_event()])
        got = hook.wait_for(4)
        assert n.drain(5)
    finally:
        n.close()

    assert [r.answered for r in got] == [500, 500, 500, 200]
    assert {r.delivery for r in got} == {hold_event().delivery_id}
    assert {r.body for r in got} == {got[0].body}
    assert (counter(metrics, "failed"), counter(metrics, "sent")) == (3, 1)


def test_a_4xx_is_dropped_and_not_retried(hook: Hook) -> None:
    metrics = Metrics()
    n = notifier(hook, metrics)
    hook.answer(410)
    try:
        n.publish([hold_event()])
        hook.wait_for(1)
        assert n.drain(5)
    finally:
        n.close()

    assert len(hook.requests) == 1
    assert (counter(metrics, "dropped"), counter(metrics, "sent")) == (1, 0)


def test_a_receiver_that_keeps_failing_is_given_up_after_the_time_limit(hook: Hook) -> None:
    metrics = Metrics()
    n = notifier(hook, metrics, backoff=Backoff(first=0.05, cap=0.05, give_up=0.3))
    hook.answer(503)
    try:
        n.publish([hold_event()])
        assert n.drain(10)
    finally:
        n.close()

    assert counter(metrics, "dropped") == 1
    assert counter(metrics, "failed") == len(hook.requests) >= 3


def test_refused_connections_are_retried_until_the_receiver_is_back(hook: Hook) -> None:
    metrics = Metrics()
    hook.refuse()
    n = notifier(hook, metrics)
    try:
        n.publish([hold_event()])
        while counter(metrics, "failed") < 2:
            pass
        hook.accept()
        (request,) = hook.wait_for(1)
        assert n.drain(5)
    finally:
        n.close()

    assert request.delivery == hold_event().delivery_id
    assert counter(metrics, "sent") == 1


def test_the_signature_is_the_hmac_sha256_of_the_raw_body_with_the_shared_secret(
    hook: Hook,
) -> None:
    n = notifier(hook, Metrics(), secret_env="HOOK_SECRET")
    try:
        n.publish([hold_event()])
        (request,) = hook.wait_for(1)
    finally:
        n.close()

    expected = hmac.new(b"s3cret", request.body, hashlib.sha256).hexdigest()
    assert request.headers["x-reconciler-signature"] == f"sha256={expected}"
    assert request.json()["deliveryId"] == request.delivery == hold_event().delivery_id


def test_the_same_event_is_queued_once_however_often_it_is_published(hook: Hook) -> None:
    n = notifier(hook, Metrics())
    try:
        n.publish([hold_event(), hold_event()])
        n.publish([hold_event()])
        hook.wait_for(1)
        assert n.drain(5)
    finally:
        n.close()
    assert len(hook.requests) == 1


def test_a_hanging_receiver_fills_its_bounded_queue_and_publish_never_waits(
    hook: Hook,
) -> None:
    metrics = Metrics()
    hook.hang()
    env = {"HOOK_URL": hook.url}
    spec = Receiver(name="ops", url_env="HOOK_URL")
    n = Notifier(resolve([spec], env), metrics=metrics, backoff=FAST, timeout=30, queue_size=2)
    try:
        # One in flight (hanging), two queued, the other two dropped.
        n.publish([hold_event(f"r{i}") for i in range(5)])
        while hook.hanging < 1:
            pass
        n.publish([hold_event(f"s{i}") for i in range(2)])
        assert counter(metrics, "dropped") >= 2
    finally:
        hook.release()
        n.close()


def test_slack_format_sends_a_text_payload(hook: Hook) -> None:
    n = notifier(hook, Metrics(), format="slack")
    try:
        n.publish([hold_event()])
        (request,) = hook.wait_for(1)
    finally:
        n.close()
    text = request.json()["text"]
    assert list(request.json()) == ["text"]
    assert "web" in text and "health_failed" in text and "web-1" in text
    assert "status/README.md" in text and len(text.splitlines()) == 2


def test_the_event_filter_sends_only_the_named_events(hook: Hook) -> None:
    n = notifier(hook, Metrics(), events=("completed",))
    try:
        n.publish([hold_event()])
        done = RolloutStatus("web", phase="completed", message="all 2 nodes succeeded")
        n.publish(rollout_events(None, done, "c0ffee"))
        (request,) = hook.wait_for(1)
        assert n.drain(5)
    finally:
        n.close()
    assert request.event == "completed" and len(hook.requests) == 1


# --- configuration, checked whole at start -----------------------------------------


def test_a_missing_url_variable_is_an_error_naming_the_receiver() -> None:
    with pytest.raises(ReceiverConfigError) as caught:
        resolve([Receiver(name="ops-chat", url_env="HOOK_OPS")], {})
    assert "ops-chat" in str(caught.value) and "HOOK_OPS" in str(caught.value)


def test_a_url_that_is_not_http_is_an_error_that_does_not_show_the_url() -> None:
    env = {"HOOK_OPS": "ftp://user:token@example.invalid/x"}
    with pytest.raises(ReceiverConfigError) as caught:
        resolve([Receiver(name="ops-chat", url_env="HOOK_OPS")], env)
    assert "ops-chat" in str(caught.value) and "http(s)" in str(caught.value)
    assert "token" not in str(caught.value)


def test_a_missing_secret_variable_is_an_error_and_every_problem_is_listed() -> None:
    receivers = [
        Receiver(name="ops-chat", url_env="HOOK_OPS", secret_env="HOOK_OPS_SECRET"),
        Receiver(name="pager", url_env="HOOK_PAGER"),
    ]
    with pytest.raises(ReceiverConfigError) as caught:
        resolve(receivers, {"HOOK_OPS": "https://hooks.example.invalid/x"})
    message = str(caught.value)
    assert "'ops-chat'" in message and "HOOK_OPS_SECRET" in message
    assert "'pager'" in message and "HOOK_PAGER" in message


def test_newer_settings_that_cannot_be_used_keep_the_old_receivers(hook: Hook) -> None:
    log_lines: list[str] = []

    class Log(EventLog):
        def error(self, event: str, message: str, **fields: object) -> None:
            log_lines.append(message)

    spec = Receiver(name="ops", url_env="HOOK_URL")
    n = Notifier(
        resolve([spec], {"HOOK_URL": hook.url}), log=Log(), metrics=Metrics(), backoff=FAST
    )
    n.receivers = (spec,)
    try:
        n.reconfigure((Receiver(name="ops", url_env="GONE"),), {})
        n.publish([hold_event()])
        hook.wait_for(1)
    finally:
        n.close()
    assert any("'ops'" in line and "GONE" in line for line in log_lines)


def test_the_fleet_watch_hook_sends_offline_and_drift_events_keyed_by_node_state_since(
    hook: Hook, tmp_path: Path
) -> None:
    spec = Receiver(name="ops", url_env="HOOK_URL", rollouts=("web-*",))
    n = Notifier(resolve([spec], {"HOOK_URL": hook.url}), metrics=Metrics(), backoff=FAST)
    kit = FleetKit.create(tmp_path, {"n1": {"role": "web"}})
    daemon = kit.daemon(notifier=n)
    try:
        daemon.notify_fleet({}, {"n1": ("offline", SINCE), "n2": ("ok", SINCE)}, "c1")
        daemon.notify_fleet({"n1": ("offline", SINCE)}, {"n1": ("offline", SINCE)}, "c2")
        (request,) = hook.wait_for(1)
        assert n.drain(5)
    finally:
        n.close()
        kit.close()
    assert request.event == "node_offline" and request.json()["nodes"] == ["n1"]
    assert len(hook.requests) == 1
