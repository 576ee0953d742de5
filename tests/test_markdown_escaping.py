"""Text from agents and people stays text in every Markdown we write: a
corpus of hostile strings, escaped by ``text.markdown.text``, rendered by a
real GFM renderer (markdown-it-py with tables and autolinks), produces no
link, emphasis, code, HTML or block of its own, and reads as the string."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from reconciler.spec.rollout_status import Condition
from reconciler.text import markdown, plan
from reconciler.text.dashboard import render_dashboard
from tests.kit.documents import make_status, node_yaml
from tests.markdown_render import GFM, constructs, plain_text

NASTY = [
    "job failed: disk full | see <script>alert(1)</script> and `df -h` **now** "
    "[docs](https://example.invalid)",
    "ok `rm -rf /` **go** _now_",
    "hf.co/org/_beta_.v1:q4",
    "<img src=x onerror=alert(1)>",
    "<!-- hidden --> after",
    "<details><summary>x</summary>",
    "![img](https://example.invalid/x.png)",
    "[ref][1] and [1]: https://example.invalid",
    "https://example.invalid/path?q=1",
    "www.example.invalid",
    "user@example.invalid",
    "mailto:user@example.invalid",
    "<https://example.invalid>",
    "javascript:alert(1)",
    "&lt;class 'OSError'&gt; &amp; &#60; &#x3C;",
    "a|b || c",
    "| a | b |\n|---|---|\n| c | d |",
    "*em* _em_ **strong** __strong__ ~~strike~~ ~one~ ***both***",
    "``double `code` span``",
    "```python\nprint(1)\n```",
    "~~~\nfenced\n~~~",
    "# heading",
    "- item",
    "+ item",
    "* item",
    "1. item",
    "2) item",
    "> quote",
    "    indented code",
    "---",
    "===",
    "\\*not em\\* and a trailing backslash\\",
    "\\",
    "line one\n\nline two\n# heading two",
    "- [ ] task",
    "$x^2$ and $$y$$",
    "@someone and @org/team",
    "#12 and GH-12",
    "snake_case_name a_b_c 2*3*4",
    "\u00a0*nbsp*\u00a0",
    "[link\n](https://example.invalid)",
    "[^1] footnote",
    "<a href='https://example.invalid'>x</a>",
    "a  \nhard break",
]


@pytest.mark.parametrize("nasty", NASTY)
def test_escaped_text_renders_as_itself_and_nothing_else(nasty: str) -> None:
    escaped = markdown.text(nasty)
    expected = " ".join(nasty.split())

    for context in (escaped, f"- {escaped}", f"| a |\n|---|\n| {escaped} |"):
        baseline = context.replace(escaped, "plain")
        assert constructs(context) == constructs(baseline), context
        assert plain_text(context) == plain_text(baseline).replace("plain", expected)
    assert "\n" not in escaped


@pytest.mark.parametrize("nasty", NASTY)
def test_html_text_stays_text_inside_raw_html(nasty: str) -> None:
    line = f"<details><summary>{markdown.html(nasty)}</summary>\n\n</details>"
    rendered = GFM.render(line)
    assert rendered.count("<") == line.count("<")  # no tag of the text's own
    assert "\n" not in markdown.html(nasty)


def _dashboard_with(text: str) -> str:
    status = make_status("x", "paused", [("a", 1, "failed")], hold="health_failed")
    assert status.hold is not None
    hold = replace(status.hold, message=f"health check failed on a ({text}); set a new resume")
    since = status.hold.since
    return render_dashboard(
        {"x": replace(status, hold=hold, conditions=(Condition("unverified", text, since),))}
    )


@pytest.mark.parametrize("nasty", NASTY)
def test_the_dashboard_keeps_agent_text_as_text(nasty: str) -> None:
    page = _dashboard_with(nasty)
    assert constructs(page) == constructs(_dashboard_with("plain"))
    assert " ".join(nasty.split()) in plain_text(page)


def _plan_with(text: str, model: str = "llama3.1-8b", label: str = "canary") -> str:
    rollout = (
        "apiVersion: reconciler/v1\nkind: Rollout\nmetadata: {name: canary}\nspec:\n"
        f"  target: {{runtime: hermes, provider: ollama, model: '{model}'}}\n"
        "  selector: {role: canary}\n  batchSize: 1\n  live: true\n"
    )
    base = {
        "rollouts/canary.yaml": rollout.encode(),
        "nodes/gpu-a1.yaml": node_yaml(
            "gpu-a1", labels="{role: canary}", maintenance=None
        ).encode(),
    }
    head = {
        **base,
        "rollouts/canary.yaml": (rollout + f"  resumeRequest: {_yaml_string(text)}\n").encode(),
        "rollouts/next.yaml": rollout.replace("canary}", "next}", 1)
        .replace(f"model: '{model}'", f"model: '{model}'")
        .encode(),
        "nodes/gpu-a1.yaml": node_yaml(
            "gpu-a1", labels=f"{{role: canary, team: '{label}'}}", maintenance=None
        ).encode(),
    }
    result = plan.make_plan(
        plan.Tree("a" * 40, base), plan.Tree("b" * 40, head), {}, now=datetime.now(UTC)
    )
    return plan.render_markdown(result)


def _yaml_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


@pytest.mark.parametrize("nasty", NASTY)
def test_the_plan_keeps_resume_requests_as_text(nasty: str) -> None:
    page = _plan_with(nasty)
    assert constructs(page) == constructs(_plan_with("plain"))
    # The plan quotes the value in JSON notation.
    assert " ".join(json.dumps(nasty, ensure_ascii=False).split()) in plain_text(page)


@pytest.mark.parametrize("model", ["hf.co/org/_beta_.v1:q4", "org/__init__:latest"])
def test_the_plan_keeps_model_names_and_label_values_as_text(model: str) -> None:
    label = "_a_b_"
    page = _plan_with("plain", model=model, label=label)
    assert constructs(page) == constructs(_plan_with("plain", model="m", label="x"))
    assert model in plain_text(page)
    assert f'"team": "{label}"' in plain_text(page)  # JSON notation, not Python's repr


@pytest.mark.parametrize("nasty", NASTY)
def test_the_fleet_section_keeps_what_an_agent_reports_as_text(nasty: str) -> None:
    from reconciler.spec.fleet_status import DesiredRuntime, FleetNode, FleetRuntime, FleetStatus
    from reconciler.text.fleet_text import fleet_dashboard_section

    def section(model: str) -> str:
        desired = DesiredRuntime("ollama", "llama3.1-8b", "default", "r")
        runtime = FleetRuntime("hermes", "ollama", model, "default", desired)
        node = FleetNode("a", "drift", datetime(2026, 12, 1, tzinfo=UTC), (runtime,))
        return fleet_dashboard_section(FleetStatus((node,)))

    page = section(nasty)
    assert constructs(page) == constructs(section("plain"))
    assert " ".join(nasty.split()) in plain_text(page)
