"""Who the read API answers (docs/web.md), decided by ``Routes`` alone:
only a ``Host`` that is the served address or a name the operator allows,
so a DNS-rebound page cannot read the answers; ``/healthz`` open as a
probe, ``/metrics`` behind the same token as the API when they share the
address."""

from __future__ import annotations

import pytest

from reconciler.daemon.web_routes import HostRule, Routes
from reconciler.protocol.h11_server import Response as Reply
from reconciler.text.web_answers import StatusView


def _get(routes: Routes, path: str, host: str | None, **headers: str) -> Reply:
    if host is not None:
        headers["host"] = host
    routes.take(StatusView("a" * 40, {}, None))
    reply = routes.handle("GET", path, headers, "127.0.0.1")
    assert isinstance(reply, Reply)
    return reply


@pytest.mark.parametrize(
    ("bound", "allowed", "host", "answered"),
    [
        ("127.0.0.1", (), "127.0.0.1:8720", True),
        ("127.0.0.1", (), "localhost:8720", True),
        ("127.0.0.1", (), "[::1]:8720", True),
        ("127.0.0.1", (), "rebound.attacker.example:8720", False),
        ("127.0.0.1", (), "127.0.0.1.nip.io:8720", False),
        ("127.0.0.1", (), "10.0.0.5:8720", False),
        ("10.0.0.5", (), "10.0.0.5:8720", True),
        ("10.0.0.5", (), "localhost:8720", False),
        ("0.0.0.0", (), "10.0.0.5:8720", True),
        ("0.0.0.0", (), "[fd00::5]:8720", True),
        ("0.0.0.0", (), "fleet.example.internal", False),
        ("127.0.0.1", ("rollouts.example.internal",), "rollouts.example.internal", True),
        ("127.0.0.1", ("rollouts.example.internal",), "ROLLOUTS.example.internal.:443", True),
        ("127.0.0.1", ("rollouts.example.internal",), "other.example.internal", False),
    ],
)
def test_only_the_served_address_and_allowed_names_are_answered(
    bound: str, allowed: tuple[str, ...], host: str, answered: bool
) -> None:
    routes = Routes(hosts=HostRule.served(bound, allowed))

    reply = _get(routes, "/api/v1/rollouts", host)

    assert (reply.status == 200) is answered
    if not answered:
        assert reply.status == 421
        assert b"unknown_host" in reply.body and b"--http-allow-host" in reply.body


def test_routes_made_without_a_rule_answer_loopback_names_only() -> None:
    routes = Routes()
    assert _get(routes, "/api/v1/rollouts", "127.0.0.1:1").status == 200
    assert _get(routes, "/api/v1/rollouts", "rebound.attacker.example:1").status == 421


def test_with_a_token_healthz_is_open_and_metrics_need_the_token() -> None:
    routes = Routes(
        token="s3cret",
        metrics=lambda: b"reconciler_passes_total 3\n",
        health=lambda: (True, {"status": "ok"}),
    )

    health = _get(routes, "/healthz", "127.0.0.1")
    metrics = _get(routes, "/metrics", "127.0.0.1")
    allowed = _get(routes, "/metrics", "127.0.0.1", authorization="Bearer s3cret")

    assert health.status == 200 and b'"ok"' in health.body
    assert metrics.status == 401
    assert allowed.status == 200 and b"reconciler_passes_total" in allowed.body


def test_a_stale_daemon_s_healthz_says_503() -> None:
    routes = Routes(token="s3cret", health=lambda: (False, {"status": "stale"}))
    assert _get(routes, "/healthz", "127.0.0.1").status == 503
