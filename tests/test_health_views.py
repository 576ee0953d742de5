"""Health checks for people: ``status NAME`` shows the checks, the soak and
the failing checks; the dashboard names the failing checks under the hold;
``plan`` shows a new rollout's checks and soak."""

from __future__ import annotations

from datetime import UTC, datetime

from test_engine_health_checks import HEALTH, HealthWorld, at

from reconciler.protocol.observations import CheckReport
from reconciler.text import plan
from reconciler.text.dashboard import render_dashboard
from reconciler.text.status_text import render_detail
from tests.markdown_render import plain_text

NODE = b"""\
apiVersion: reconciler/v1
kind: Node
metadata: {name: gpu-a1}
spec: {agent: "http://127.0.0.1:8710", labels: {role: canary}}
"""
ROLLOUT = b"""\
apiVersion: reconciler/v1
kind: Rollout
metadata: {name: canary}
spec:
  target: {runtime: hermes, provider: ollama, model: llama3.1-8b}
  selector: {role: canary}
  live: true
  health:
    soak: 2m
    checks:
      - name: ready
        http: {url: "http://127.0.0.1:8000/ready", bodyContains: ok}
      - name: errors
        prometheus: {query: 'rate(errors{node="{node}"}[1m])', max: 0.01}
"""
SETTINGS = b"""\
apiVersion: reconciler/v1
kind: Settings
spec: {prometheus: {url: "http://127.0.0.1:9090"}}
"""


def failed_world() -> HealthWorld:
    world = HealthWorld()
    world.rollout(live=True, health=HEALTH)
    world.step(0)
    job = world.succeed("n1", at=at(5)).job_id
    world.now = at(30)
    world.beat("n1", CheckReport("ready", job, False, None, 3, "status 503 (expected 200)"))
    world.step(30)
    return world


def test_status_detail_shows_the_checks_and_the_failing_ones() -> None:
    text = render_detail(failed_world().status(), at(40))
    assert "  health    soak 2m, 2 check(s) every 10s, failing after 3 consecutive failures" in text
    assert "            ready: http http://127.0.0.1:8000/ready expects 200" in text
    assert "            errors: prometheus rate(errors[1m]) (max 0.01)" in text
    assert (
        "failing checks\n  n1 ready: failed 3 times in a row: status 503 (expected 200)\n" in text
    )


def test_the_dashboard_names_the_failing_checks_under_the_hold() -> None:
    world = failed_world()
    text = render_dashboard({"r": world.status()})
    line = next(x for x in text.splitlines() if x.startswith("- 🛑 **r** `health_failed`"))
    assert "Failing checks: n1 ready (failed 3 times in a row: status 503 (expected 200))" in (
        plain_text(line)
    )


def test_plan_shows_the_checks_and_the_soak() -> None:
    base = plan.Tree("a" * 40, {"nodes/gpu-a1.yaml": NODE, "reconciler.yaml": SETTINGS})
    head = plan.Tree("b" * 40, {**base.files, "rollouts/canary.yaml": ROLLOUT})
    result = plan.make_plan(base, head, {}, now=datetime(2026, 12, 1, tzinfo=UTC))
    text = plan.render_text(result)
    assert (
        "health: soak 2m, 2 check(s) every 10s, failing after 3 consecutive failures; "
        "check ready: http http://127.0.0.1:8000/ready expects 200, body contains 'ok'; "
        'check errors: prometheus rate(errors{node="{node}"}[1m]) (max 0.01)'
    ) in " ".join(text.split())
    assert result.added[0].health[0].startswith("soak 2m")
    assert "health" in plan.render_json(result)
