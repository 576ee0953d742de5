"""spec.health.compare and spec.health.alerts in rollout files, and
spec.alertmanager in settings: valid blocks become values kept in the
status record, and each bad input of a comparison or of the alerts is a
``file:line:col field message`` from ``reconciler validate``."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.cli import main as cli
from reconciler.spec import health as health_rules
from reconciler.spec.compare import Alerts, Comparison
from reconciler.spec.documents import parse_file

HEAD = """\
apiVersion: reconciler/v1
kind: Rollout
metadata: {name: canary}
spec:
  target: {runtime: hermes, provider: ollama, model: llama3.1-8b}
  selector: {role: canary}
  live: true
  health:
    soak: 5m
"""


def rollout(health: str) -> tuple[str, bytes]:
    return "rollouts/canary.yaml", (HEAD + health).encode()


def problems(health: str) -> list[str]:
    return [str(p) for p in parse_file(*rollout(health)).problems]


FULL = """\
    compare:
      - name: latency-p95
        query: 'histogram_quantile(0.95, rate(request_seconds_bucket{node="{node}"}[1m]))'
        worse: higher
        tolerance: 10%
        minSamples: 12
        baseline: {selector: {role: serving}}
      - name: errors
        errors: 'sum(increase(http_requests_total{node="{node}",code=~"5.."}[1m]))'
        total: 'sum(increase(http_requests_total{node="{node}"}[1m]))'
        tolerance: 0.5%
    alerts:
      matchers: ['severity=~"critical|page"']
"""


def test_comparisons_and_alerts_become_values_with_their_defaults() -> None:
    parsed = parse_file(*rollout(FULL))
    assert parsed.problems == ()
    assert parsed.rollout is not None and parsed.rollout.health is not None
    health = parsed.rollout.health
    assert health.compare == (
        Comparison(
            "latency-p95",
            0.1,
            query='histogram_quantile(0.95, rate(request_seconds_bucket{node="{node}"}[1m]))',
            min_samples=12,
            baseline=(("role", "serving"),),
        ),
        Comparison(
            "errors",
            0.005,
            errors='sum(increase(http_requests_total{node="{node}",code=~"5.."}[1m]))',
            total='sum(increase(http_requests_total{node="{node}"}[1m]))',
        ),
    )
    assert health.compare[1].worse == "higher" and health.compare[1].min_samples == 10
    assert health.alerts == Alerts(('severity=~"critical|page"',), "node")


def test_the_status_record_keeps_every_default_and_reads_back_the_same() -> None:
    parsed = parse_file(*rollout(FULL))
    assert parsed.rollout is not None and parsed.rollout.health is not None
    record = health_rules.to_document(parsed.rollout.health)
    assert record["compare"][1] == {
        "name": "errors",
        "errors": 'sum(increase(http_requests_total{node="{node}",code=~"5.."}[1m]))',
        "total": 'sum(increase(http_requests_total{node="{node}"}[1m]))',
        "tolerance": "0.5%",
        "minSamples": 10,
    }
    assert record["alerts"] == {"matchers": ['severity=~"critical|page"'], "nodeLabel": "node"}
    assert health_rules.from_document(record) == parsed.rollout.health


def test_a_health_block_without_comparisons_keeps_version_2s_record() -> None:
    parsed = parse_file(*rollout(""))
    assert parsed.rollout is not None and parsed.rollout.health is not None
    assert set(health_rules.to_document(parsed.rollout.health)) == {
        "soak",
        "failureThreshold",
        "interval",
        "checks",
    }


@pytest.mark.parametrize(
    ("health", "expected"),
    [
        (
            "    compare:\n      - {name: x, query: up, errors: down, total: all, tolerance: 5%}\n",
            "rollouts/canary.yaml:11:30: spec.health.compare[0].errors: give exactly one of "
            "query or errors, not both: remove one of them",
        ),
        (
            "    compare:\n      - {name: x, errors: down, tolerance: 5%}\n",
            "rollouts/canary.yaml:11:27: spec.health.compare[0].errors: errors needs total: the "
            "query of all requests the error rate is taken of",
        ),
        (
            "    compare:\n      - {name: x, query: up, tolerance: 10}\n",
            "rollouts/canary.yaml:11:41: spec.health.compare[0].tolerance: must be a percentage "
            "such as 10% or 0.5%; got 10",
        ),
        (
            "    compare:\n      - {name: x, query: up, tolerance: ten}\n",
            "rollouts/canary.yaml:11:41: spec.health.compare[0].tolerance: must be a percentage "
            'such as 10% or 0.5%; got "ten"',
        ),
        (
            "    compare:\n      - {name: x, query: up, tolerance: 0%}\n",
            "rollouts/canary.yaml:11:41: spec.health.compare[0].tolerance: must be more than 0%: "
            "a tolerance of 0 fails a node for any difference at all",
        ),
        (
            "    compare:\n      - {name: x, query: up, tolerance: 5%, minSamples: 2}\n",
            "rollouts/canary.yaml:11:57: spec.health.compare[0].minSamples: must be at least 3, "
            "got 2",
        ),
        (
            "    compare:\n      - {name: x, tolerance: 5%}\n",
            "rollouts/canary.yaml:11:9: spec.health.compare[0]: give exactly one kind of "
            "comparison: query (a quantity) or errors with total (a rate); neither is given",
        ),
        (
            "    compare:\n      - {name: x, query: up, worse: bigger, tolerance: 5%}\n",
            "rollouts/canary.yaml:11:37: spec.health.compare[0].worse: must be one of higher, "
            'lower; got "bigger" (did you mean higher?)',
        ),
        (
            "    checks: [{name: x, tcp: {host: 127.0.0.1, port: 80}}]\n"
            "    compare:\n      - {name: x, query: up, tolerance: 5%}\n",
            'rollouts/canary.yaml:12:16: spec.health.compare[0].name: name "x" is already used '
            "by a check, a comparison or the alerts check: give each comparison its own name",
        ),
        (
            "    alerts: {matchers: []}\n",
            "rollouts/canary.yaml:10:24: spec.health.alerts.matchers: must list at least one "
            "item; the list is empty",
        ),
    ],
)
def test_bad_comparisons_are_named_by_file_line_column_and_field(
    health: str, expected: str
) -> None:
    assert expected in problems(health)


def fleet(root: Path, health: str, settings: str) -> Path:
    (root / "nodes").mkdir(parents=True)
    (root / "rollouts").mkdir()
    (root / "nodes" / "gpu-a1.yaml").write_text(
        "apiVersion: reconciler/v1\nkind: Node\nmetadata: {name: gpu-a1}\n"
        "spec:\n  agent: http://127.0.0.1:8710\n  labels: {role: canary}\n"
    )
    (root / "rollouts" / "canary.yaml").write_text(HEAD + health)
    if settings:
        (root / "reconciler.yaml").write_text(
            f"apiVersion: reconciler/v1\nkind: Settings\nspec:\n{settings}"
        )
    return root


ALERTS = "    alerts: {matchers: ['severity=\"page\"']}\n"


def test_validate_says_alerts_need_an_alertmanager(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = fleet(tmp_path / "fleet", ALERTS, "")

    assert cli.main(["validate", str(root)]) == 1

    assert capsys.readouterr().out.splitlines() == [
        f"{root}/rollouts/canary.yaml:10:13: spec.health.alerts: alerts need an Alertmanager "
        "to ask: set spec.alertmanager.url in reconciler.yaml, such as http://127.0.0.1:9093, "
        "or remove alerts"
    ]


def test_with_an_alertmanager_in_the_settings_the_alerts_validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = fleet(tmp_path / "fleet", ALERTS, '  alertmanager: {url: "http://127.0.0.1:9093"}\n')

    assert cli.main(["validate", str(root)]) == 0
    assert capsys.readouterr().out == "ok: 1 node, 1 rollout\n"


def test_the_alertmanager_url_is_checked_by_the_settings_schema(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = fleet(tmp_path / "fleet", "", '  alertmanager: {url: "127.0.0.1:9093"}\n')

    assert cli.main(["validate", str(root)]) == 1

    assert capsys.readouterr().out.splitlines() == [
        f"{root}/reconciler.yaml:4:23: spec.alertmanager.url: must be an http:// or https:// "
        'base URL such as http://127.0.0.1:9093; got "127.0.0.1:9093"'
    ]
    parsed = parse_file(
        "reconciler.yaml",
        b"apiVersion: reconciler/v1\nkind: Settings\nspec:\n"
        b'  alertmanager: {url: "http://127.0.0.1:9093"}\n',
    )
    assert parsed.settings is not None
    assert parsed.settings.alertmanager_url == "http://127.0.0.1:9093"
