"""``reconciler plan`` of a rollout with model artifacts: each artifact with
its size, the total to download over the nodes not yet staged, and whether
drain and warm-up are declared, in the headline, the text and the Markdown."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from reconciler.spec.artifact_records import StageRecord
from reconciler.spec.rollout_status import NodeRecord
from reconciler.text import artifact_text, plan
from tests.kit.documents import node_yaml
from tests.markdown_render import plain_text

NODES = {
    f"nodes/gpu-b{i}.yaml": node_yaml(f"gpu-b{i}", labels="{role: wide}", maintenance=None)
    for i in range(1, 6)
}
GIB = 1024**3
WIDE = f"""\
apiVersion: reconciler/v1
kind: Rollout
metadata: {{name: wide}}
spec:
  target:
    runtime: hermes
    provider: ollama
    model: llama3.1-8b
    artifacts:
      - {{name: weights, url: "https://mirror.example/w.gguf", sha256: {"0f" * 32}, size: {4 * GIB}}}
      - {{name: tokenizer, url: "https://mirror.example/t.json", sha256: {"a1" * 32}, size: 1024}}
  selector: {{role: wide}}
  batchSize: 2
  live: true
"""
DRAIN = """\
  drain:
    timeout: 2m
    idle: {url: "http://127.0.0.1:8000/metrics", metric: "vllm:num_requests_running"}
"""


def planned(rollout: str) -> plan.Plan:
    now = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    return plan.make_plan(
        plan.Tree("a" * 40, {p: t.encode() for p, t in NODES.items()}),
        plan.Tree(
            "b" * 40,
            {p: t.encode() for p, t in {**NODES, "rollouts/wide.yaml": rollout}.items()},
        ),
        {},
        now=now,
    )


def test_the_artifacts_their_sizes_and_the_total_to_download_are_shown() -> None:
    result = planned(WIDE)

    assert (
        "stage wide: 20.0 GiB to download ahead (2 artifact(s), 5 node(s)); drain: no, warm-up: no"
    ) in plan.headline(result)
    text = plan.render_text(result)
    assert (
        "artifacts weights (4.0 GiB), tokenizer (1.0 KiB): 20.0 GiB to download "
        "(2 artifact(s) x 5 node(s) not staged)"
    ) in text
    assert "no drain: nodes switch while serving" in text and "no warm-up" in text
    assert "20.0 GiB to download" in plain_text(plan.render_markdown(result))


def test_drain_and_warm_up_are_named_when_declared() -> None:
    warm = '  warmup:\n    - http: {url: "http://127.0.0.1:8000/v1/completions", method: POST}\n'

    result = planned(WIDE + DRAIN + warm)

    assert "drain: yes, warm-up: yes" in plan.headline(result)[1]
    text = plan.render_text(result)
    assert (
        "drain: within 2m, until vllm:num_requests_running at http://127.0.0.1:8000/metrics "
        "is at most 0"
    ) in text
    assert "warm-up: POST http://127.0.0.1:8000/v1/completions x1" in text


def test_a_rollout_without_artifacts_says_nothing_about_them() -> None:
    plain = WIDE.split("    artifacts:")[0] + "  selector: {role: wide}\n  batchSize: 2\n"

    result = planned(plain)

    text = plan.render_text(result)
    assert "artifacts" not in text and "drain" not in text and "warm-up" not in text


def test_nodes_already_staged_do_not_count_toward_the_download() -> None:
    at = datetime(2026, 12, 1, tzinfo=UTC)
    staged = StageRecord("stage-1", 1, "staged", at, at)
    records = [
        NodeRecord("a", 1, state="staged", stage=staged),
        NodeRecord("b", 1, state="staging", stage=StageRecord("stage-2", 1, "staging", at)),
        NodeRecord("c", 2),
    ]

    assert artifact_text.not_staged(["a", "b", "c"], records) == 2
    assert artifact_text.size_words(512) == "512 B"
    assert artifact_text.size_words(3 * 1024**2 // 2) == "1.5 MiB"
