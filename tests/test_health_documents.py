"""spec.health in rollout files and spec.prometheus in settings: valid
blocks become values, and each kind of bad input gets its own
file:line:col, field and message while nothing else in the file is affected."""

from __future__ import annotations

import pytest

from reconciler.spec.documents import parse_file
from reconciler.spec.health import Health, HealthCheck, HttpProbe, PrometheusQuery, TcpProbe

HEAD = """\
apiVersion: reconciler/v1
kind: Rollout
metadata: {name: canary}
spec:
  target: {runtime: hermes, provider: ollama, model: llama3.1-8b}
  selector: {role: canary}
  live: true
"""


def rollout(health: str) -> tuple[str, bytes]:
    return "rollouts/canary.yaml", (HEAD + health).encode()


def problems(health: str) -> list[str]:
    return [str(p) for p in parse_file(*rollout(health)).problems]


def test_a_full_health_block_becomes_values() -> None:
    parsed = parse_file(
        *rollout(
            """\
  health:
    soak: 2m
    failureThreshold: 2
    interval: 5s
    checks:
      - name: ready
        http: {url: "http://127.0.0.1:8000/ready", expectStatus: 204, bodyContains: ok, timeout: 3s}
      - name: port
        tcp: {host: "{node}", port: 8000}
      - name: errors
        prometheus: {query: 'sum(rate(errors{node="{node}"}[1m]))', max: 0.01}
"""
        )
    )
    assert parsed.problems == ()
    assert parsed.rollout is not None
    assert parsed.rollout.health == Health(
        soak=120,
        failure_threshold=2,
        interval=5,
        checks=(
            HealthCheck("ready", http=HttpProbe("http://127.0.0.1:8000/ready", 204, "ok", 3)),
            HealthCheck("port", tcp=TcpProbe("{node}", 8000, 2)),
            HealthCheck(
                "errors",
                prometheus=PrometheusQuery('sum(rate(errors{node="{node}"}[1m]))', max=0.01),
            ),
        ),
    )


def test_a_rollout_without_health_keeps_version_1s_rule() -> None:
    parsed = parse_file(*rollout(""))
    assert parsed.rollout is not None and parsed.rollout.health is None


def test_defaults_soak_zero_threshold_three_interval_ten_seconds() -> None:
    parsed = parse_file(
        *rollout('  health: {checks: [{name: port, tcp: {host: "::1", port: 1}}]}\n')
    )
    assert parsed.rollout is not None and parsed.rollout.health is not None
    health = parsed.rollout.health
    assert (health.soak, health.failure_threshold, health.interval) == (0, 3, 10)


@pytest.mark.parametrize(
    ("health", "expected"),
    [
        (
            "  health:\n    checks:\n      - {name: ready, tcp: {host: 127.0.0.1, port: 80}}\n"
            "      - {name: ready, tcp: {host: 127.0.0.1, port: 81}}\n",
            'rollouts/canary.yaml:11:16: spec.health.checks[1].name: check name "ready" is '
            "used twice: give each check its own name",
        ),
        (
            "  health:\n    checks:\n      - {name: x, grpc: {port: 80}}\n",
            'rollouts/canary.yaml:10:19: spec.health.checks[0].grpc: unknown field "grpc"; '
            "allowed fields: http, name, prometheus, tcp",
        ),
        (
            '  health:\n    checks:\n      - {name: x, http: {url: "http://10.1.2.3:80/"}}\n',
            "rollouts/canary.yaml:10:31: spec.health.checks[0].http.url: an agent probes only its "
            "own node: the host '10.1.2.3' must be a loopback address (127.0.0.1, ::1, localhost) "
            "or {node}, the node itself as the agent sees it; for another service, ask it "
            "through a prometheus check",
        ),
        (
            '  health:\n    checks:\n      - {name: x, http: {url: "ftp://127.0.0.1/"}}\n',
            "rollouts/canary.yaml:10:31: spec.health.checks[0].http.url: must be an http:// or "
            "https:// URL on a loopback address or {node}, such as http://127.0.0.1:8000/ready; "
            'got "ftp://127.0.0.1/"',
        ),
        (
            "  health:\n    checks:\n      - {name: x, tcp: {host: db.example, port: 5432}}\n",
            "rollouts/canary.yaml:10:31: spec.health.checks[0].tcp.host: an agent probes only its "
            'own node: the host "db.example" must be a loopback address (127.0.0.1, ::1, '
            "localhost) or {node}, the node itself as the agent sees it",
        ),
        (
            "  health: {interval: 0s}\n",
            "rollouts/canary.yaml:8:22: spec.health.interval: duration must be more than zero, "
            "got '0s'",
        ),
        (
            "  health: {interval: -5s}\n",
            "rollouts/canary.yaml:8:22: spec.health.interval: must be a duration: whole numbers "
            'with a unit s, m or h, such as 90s, 5m or 1h30m; got "-5s"',
        ),
        (
            "  health: {failureThreshold: 0}\n",
            "rollouts/canary.yaml:8:30: spec.health.failureThreshold: must be at least 1, got 0",
        ),
    ],
)
def test_bad_health_input_is_named_by_file_line_column_and_field(
    health: str, expected: str
) -> None:
    assert expected in problems(health)


def test_settings_name_the_prometheus_server() -> None:
    data = b"""\
apiVersion: reconciler/v1
kind: Settings
spec:
  prometheus: {url: "http://127.0.0.1:9090"}
"""
    parsed = parse_file("reconciler.yaml", data)
    assert parsed.settings is not None
    assert parsed.settings.prometheus_url == "http://127.0.0.1:9090"
    bad = parse_file("reconciler.yaml", data.replace(b"http://127", b"127"))
    assert [p.field for p in bad.problems] == ["spec.prometheus.url"]
