"""The web page as the server renders it (docs/web.md), read as HTML:
what an operator watching a model rollout must see without a click or a
script. Statuses come from the real engine (``World``) or are built as
the engine records them (``make_status``)."""

from __future__ import annotations

import re
from dataclasses import replace
from html import unescape
from html.parser import HTMLParser

from reconciler.engine.holds import hold_message
from reconciler.spec.rollout_status import RolloutStatus, to_record
from reconciler.text.web_numbers import percent, rounded, seconds
from reconciler.text.web_page import render_page, rollout_row
from reconciler.text.web_rollout import eval_section, model_facts_section
from tests.engine_world import World
from tests.kit.documents import make_status
from tests.kit.web_statuses import failed_canary, model_rollout, soaking


def page(*statuses: RolloutStatus, selected: str | None = None) -> str:
    chosen = next((s for s in statuses if s.name == selected), None)
    return render_page(
        commit="c" * 40,
        rows=[rollout_row(s) for s in statuses],
        fleet=None,
        selected=chosen,
        selected_name=selected,
    )


class _Texts(HTMLParser):
    """The text of every element with an id or a data-node/data-rollout
    attribute, and each element's attributes, by tag."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[tuple[str, str | None]] = []
        self.texts: dict[str, str] = {}
        self.elements: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        self.elements.append((tag, found))
        key = found.get("id") or (
            f"{tag}:{found['data-rollout']}" if "data-rollout" in found else None
        )
        if key is None and "data-node" in found:
            key = f"{tag}:{found['data-node']}"
        if tag not in ("meta", "link", "rect", "line", "circle"):
            self.stack.append((tag, key))
            if key:
                self.texts.setdefault(key, "")

    def handle_endtag(self, tag: str) -> None:
        while self.stack:
            if self.stack.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        for _, key in self.stack:
            if key:
                self.texts[key] += data


def read(html: str) -> _Texts:
    parser = _Texts()
    parser.feed(html)
    return parser


def failed_live_canary() -> RolloutStatus:
    """A live rollout whose canary failed its health check after its apply:
    held by the engine, with the message the engine gives that failure."""
    w = World(["canary", "z"])
    w.rollout(batch_size=1, live=True)
    w.step(0)
    error = "health check latency-p95 failed: canary median 0.412 over 0.25"
    w.fail("canary", error=error)
    w.step(5)
    status = w.status()
    assert status.hold is not None and status.hold.reason == "health_failed"
    message = hold_message("health_failed", rollout="r", nodes=["canary"], error=error, live=True)
    return replace(status, hold=replace(status.hold, message=message))


def test_a_failed_live_canary_shows_the_hold_s_reason_its_mode_and_the_rollback_command() -> None:
    status = failed_live_canary()
    html = page(status, selected="r")
    texts = read(html)

    assert status.hold is not None
    why = texts.texts["facts"].split("Why", 1)[1].split("Target", 1)[0]
    assert why == "health_failed: " + unescape(status.hold.message).split("; ")[0]
    assert why.startswith("health_failed: health check failed on canary (latency-p95 failed")
    assert "Modelive" in texts.texts["facts"].replace(" ", "")
    actions = re.findall(r"<code>(.*?)</code>", html.split('id="hold-actions"')[1])
    assert actions == [
        "reconciler resume r --push",
        "reconciler skip r canary --push",
        "reconciler rollback r --nodes canary --push",
        "reconciler abort r --push",
    ]
    assert "batch 1: failed" in texts.texts["batches"]
    assert "dry run" not in texts.texts["tr:r"] and "live" in texts.texts["tr:r"]


def test_a_dry_run_says_so_in_its_own_column() -> None:
    w = World(["a"])
    w.rollout(live=False)
    w.step(0)
    texts = read(page(w.status()))
    assert "dry run" in texts.texts["tr:r"]
    assert [t for t, _ in texts.elements].count("th") == 8


def test_a_rollout_waiting_for_approval_shows_the_rules_and_approvals_missing() -> None:
    w = World(["a"])
    w.rollout()
    w.specs["r"] = None
    w.refusals["r"] = (
        "needs 1 of serving-owners (alice@example.com, bob@example.com); has 0; "
        "a reviewer approves with `reconciler approve 0123456789ab --key FILE --push`"
    )
    w.step(0)
    row = read(page(w.status())).texts["tr:r"]

    assert "0 of 0" not in row
    assert "waiting for approval" in row
    assert "needs 1 of serving-owners (alice@example.com, bob@example.com)" in row
    assert "reconciler approve 0123456789ab" in row


def test_a_soaking_node_shows_when_it_is_judged_and_its_pending_comparisons() -> None:
    texts = read(page(soaking(), selected="soak")).texts
    assert "soaking, judged at 09:15:07; pending: latency-p95" in texts["tr:gpu-1"]


def compared() -> RolloutStatus:
    return failed_canary("canary")


def test_comparison_numbers_are_rounded_for_people_never_raw_json() -> None:
    html = page(compared(), selected="canary")
    row = read(html).texts["tr:gpu-1"]

    assert "canary median 0.412, 13 samples; baseline 0.25, 26 samples" in row
    assert "change +64.8%" in row and "p 0.0000123" in row
    assert "0.41234567" not in row and "{" not in row


def test_the_canary_plot_s_medians_are_the_comparison_recorded_in_status() -> None:
    status = compared()
    recorded = to_record(status)["nodes"][0]["checks"][0]
    html = page(status, selected="canary")
    sides = {
        attrs["data-side"]: attrs
        for tag, attrs in read(html).elements
        if tag == "g" and attrs.get("data-side")
    }

    assert float(sides["canary"]["data-median"] or "nan") == recorded["canary"]["median"]
    assert float(sides["baseline"]["data-median"] or "nan") == recorded["baseline"]["median"]
    assert sides["canary"]["data-samples"] == str(recorded["canary"]["samples"])
    plot = html[html.index('<svg class="plot comparison-plot"') :]
    plot = plot[: plot.index("</svg>")]
    assert "0.412 · n=13" in plot and "0.25 · n=26" in plot
    assert "<script" not in plot and "href" not in plot  # no external asset
    # The samples' spread as recorded: a box from quartile to quartile.
    boxes = re.findall(r'<rect class="box" x="([0-9.]+)" y="[0-9.]+" width="([0-9.]+)"', plot)
    assert len(boxes) == 2
    canary_box, baseline_box = ((float(x), float(x) + float(w)) for x, w in boxes)
    assert canary_box[0] > baseline_box[1]  # the canary's whole middle half is above
    assert "from 0.301 to 0.61" in plot and "from 0.19 to 0.334" in plot


def test_each_batch_s_out_of_service_times_are_plotted_with_their_median() -> None:
    status = make_status(
        "oos", "running", [("a", 1, "succeeded"), ("b", 1, "succeeded"), ("c", 2, "succeeded")]
    )
    times = {"a": 4.5, "b": 12.25, "c": 61.0}
    nodes = tuple(replace(n, timings={}, out_of_service=times[n.name]) for n in status.nodes)
    html = page(replace(status, nodes=nodes), selected="oos")
    batches = {
        attrs["data-batch"]: attrs for tag, attrs in read(html).elements if attrs.get("data-batch")
    }
    assert float(batches["1"]["data-median"] or "nan") == (4.5 + 12.25) / 2
    assert float(batches["2"]["data-median"] or "nan") == 61.0
    assert "1 min 1 s" in read(html).texts["tr:c"]


def test_numbers_for_people() -> None:
    assert [rounded(x) for x in (0.000123456, 2.34567, 12345.6, 0, -0.5)] == [
        "0.000123", "2.35", "12,300", "0", "-0.5",
    ]  # fmt: skip
    assert percent(0.0312345) == "3.12%"
    assert [seconds(x) for x in (0.25, 4.25, 200)] == ["250 ms", "4.25 s", "3 min 20 s"]


def test_each_node_shows_its_stage_drain_warm_up_and_out_of_service_times() -> None:
    texts = read(page(model_rollout("llama-3"), selected="llama-3")).texts
    assert "stage staged; drain 8 s; warm-up 21 s" in texts["tr:gpu-1"]
    assert texts["tr:gpu-1"].endswith("33 s")
    assert "stage staged" in texts["tr:gpu-8"] and "drain" not in texts["tr:gpu-8"]
    # Nothing recorded of evals, signatures or standby slots: no such sections.
    assert not {"evals", "model-facts"} & set(texts)


NODE = {"name": "gpu-1", "batch": 1}
EVAL = {
    "name": "golden",
    "suiteSha256": "a" * 64,
    "passed": 1,
    "total": 2,
    "passRate": 50.0,  # percent, as the agent's job record gives it
    "cases": [
        {"name": "capital", "ok": True, "answer": "Paris", "detail": "", "seconds": 0.4},
        {"name": "sum", "ok": False, "answer": "5", "detail": "expected 4", "seconds": 0.2},
    ],
}


def test_eval_results_signer_and_standby_show_when_a_node_record_has_them() -> None:
    record = {
        "frozen": {"evals": [{"name": "golden", "cases": [
            {"name": "capital", "expect": "Paris"}, {"name": "sum", "expect": "4"},
        ]}]},
        "evalBaseline": {"golden": {"node": "gpu-2", "jobId": "j", "answers": {"sum": "4"}}},
    }  # fmt: skip
    node = {
        **NODE,
        "evals": [EVAL],
        "signature": {"signer": "models@example.com", "sha256": "b" * 64},
        "standby": {"slot": "b", "releasedAt": "2026-12-01T09:30:00Z", "releaseJobId": "rel-1"},
    }
    evals = read(eval_section(record, [node])).texts["evals"]
    assert "gpu-1: golden — 1 of 2 held (50%); baseline from gpu-2" in evals
    assert "sumExpected4" not in evals  # cells, not run-on text
    rows = [row for row in re.findall(r"<tr class=.*?</tr>", eval_section(record, [node]))]
    assert [re.sub(r"<[^>]+>", "|", r).strip("|").split("||") for r in rows] == [
        ["capital", "Paris", "Paris", "—", "yes"],
        ["sum", "4", "5", "4", "no"],
    ]
    facts = read(model_facts_section([node])).texts["tr:gpu-1"]
    assert "models@example.com (sha256 bbbbbbbbbbbb)" in facts
    assert "slot b, released 2026-12-01 09:30:00 UTC (job rel-1)" in facts
    assert eval_section(record, [NODE]) == "" and model_facts_section([NODE]) == ""
