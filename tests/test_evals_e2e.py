"""Evals end to end: the daemon, a real bare repository and real agent
processes. A node whose suite does not hold fails ``eval_failed``, goes
back to its old config, and holds the rollout under the pause policy; its
status record keeps every case, each eval is one of its checks, and
``status NAME`` shows the cases.

The runtime is the OpenAI-compatible stand-in (tests/kit), used only for a
fault a real llama-server does not produce on cue: one case is answered
with HTTP 500. A model whose answers differ, on real llama-server nodes
under client load, is tests/test_evals_llama_e2e.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reconciler.spec.rollout_status import from_record
from reconciler.text import status_text
from tests.kit.documents import rollout_yaml
from tests.kit.fleets import AgentFleet
from tests.kit.openai_stand_in import METRIC, OpenAIStandIn, Reply

OLD_CONFIG = b"provider: ollama\nmodel: old\nprofile: default\n"
SUITE = """\
apiVersion: reconciler/v1
kind: EvalSuite
metadata: {name: golden}
spec:
  cases:
    - name: capital
      prompt: "The capital of France is"
      expect: {contains: "Paris"}
    - name: greeting
      prompt: "Say hello"
      expect: {regex: "^Hello"}
"""


def _rollout(url: str) -> str:
    return rollout_yaml(
        "llama",
        selector={"role": "gpu"},
        live=True,
        onFailure="pause",
        drain=f'{{idle: {{url: "{url}/metrics", metric: "{METRIC}"}}}}',
        health=f"{{evals: [{{name: golden, suite: golden, url: '{url}', minPassRate: 100%}}]}}",
    )


def test_a_node_whose_suite_fails_goes_back_and_holds_the_rollout(tmp_path: Path) -> None:
    replies = {"The capital of France is": Reply(" Paris"), "Say hello": Reply(status=500)}
    with OpenAIStandIn(replies) as runtime:
        nodes: dict[str, Any] = {f"gpu-{i}": {"config": OLD_CONFIG} for i in (1, 2)}
        kit = AgentFleet.create(tmp_path, nodes)
        try:
            kit.push({"evals/golden.yaml": SUITE, "rollouts/llama.yaml": _rollout(runtime.url)})
            held = kit.run_until(
                kit.daemon(),
                lambda s: (s.get("llama", {}).get("hold") or {}).get("reason") is not None,
                timeout=60,
            )
            configs = {name: agent.config_bytes() for name, agent in kit.agents.items()}
        finally:
            kit.close()

    nodes_seen = {n["name"]: n for n in held["llama"]["nodes"]}
    first, second = nodes_seen["gpu-1"], nodes_seen["gpu-2"]
    assert first["state"] == "failed" and second["state"] == "pending"
    assert first["error"].startswith(
        "job failed: eval_failed: golden: 1 of 2 cases held (50%; minimum 100%)"
    )
    assert held["llama"]["hold"]["reason"] == "health_failed"
    assert configs == {"gpu-1": OLD_CONFIG, "gpu-2": OLD_CONFIG}
    [result] = first["evals"]
    assert [(c["name"], c["ok"], c["answer"]) for c in result["cases"]] == [
        ("capital", True, " Paris"),
        ("greeting", False, ""),
    ]
    assert first["checks"] == [
        {"name": "golden", "ok": False, "detail": "1 of 2 cases held (50%; minimum 100%)"}
    ]
    shown = status_text.render_detail(
        from_record(held["llama"]), from_record(held["llama"]).started_at
    )
    assert "gpu-1 golden: 1 of 2 cases held (50%)" in shown
    assert "  greeting  FAILED  '' (answered HTTP 500)" in shown
