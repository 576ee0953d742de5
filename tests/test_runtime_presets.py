"""Runtime presets and model paths in rollout files: ``drain.idle: {runtime,
port}`` and ``warmup: [{runtime, port, times}]`` become the runtime's own
metrics and warm-up request, expanded before the job is signed; ``metric``
takes a list; an artifact's ``path`` places it in the model directory.
Bad input is named by file, line, column and field; ``plan`` says which
preset and path a rollout uses."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

import pytest

from reconciler.protocol.job_payload import build_payload, payload_problems
from reconciler.protocol.model_ids import layout_pairs, model_id
from reconciler.spec import schemas
from reconciler.spec.artifacts import Drain, Warmup
from reconciler.spec.documents import parse_file
from reconciler.spec.rollout_status import RolloutStatus, freeze, from_record, to_record
from reconciler.spec.runtime_presets import PRESETS, WARMUP_BODY
from reconciler.text import plan
from tests.kit.jobs import job
from tests.test_documents_artifacts import DIGEST, problems, rollout
from tests.test_plan_artifacts import WIDE, planned

PRESET = """\
  live: true
  drain:
    timeout: 2m
    idle: {runtime: llama.cpp, port: 8080}
  warmup:
    - {runtime: llama.cpp, port: 8080, times: 2}
"""
TABLE = {
    "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
    "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
    "llama.cpp": ("llamacpp:requests_processing", "llamacpp:requests_deferred"),
    "tgi": ("tgi_queue_size", "tgi_batch_current_size"),
}


def _artifact(name: str, path: str | None = None) -> str:
    extra = "" if path is None else f", path: {json.dumps(path)}"
    return (
        f'      - {{name: {name}, url: "https://m.example/{name}", sha256: {DIGEST}, '
        f"size: 1{extra}}}\n"
    )


@pytest.mark.parametrize("runtime", sorted(TABLE))
def test_each_preset_drains_on_its_runtimes_running_and_waiting_metrics(runtime: str) -> None:
    body = f"  live: true\n  drain: {{idle: {{runtime: {runtime}, port: 9000, max: 1}}}}\n"

    spec = parse_file(*rollout(body)).rollout

    assert spec is not None
    assert spec.drain == Drain(300, "http://127.0.0.1:9000/metrics", TABLE[runtime], 1, runtime)


def test_the_schema_offers_exactly_the_runtimes_of_the_preset_table() -> None:
    offered = schemas.load_schema("rollout")["$defs"]["presetRuntime"]["enum"]

    assert sorted(offered) == sorted(PRESETS) == sorted(TABLE)


def test_a_warm_up_preset_posts_one_token_at_temperature_zero() -> None:
    spec = parse_file(*rollout(PRESET)).rollout

    assert spec is not None
    assert spec.warmup == (
        Warmup(
            "http://127.0.0.1:8080/v1/completions",
            "POST",
            WARMUP_BODY,
            200,
            60,
            2,
            "llama.cpp",
        ),
    )
    assert json.loads(WARMUP_BODY) == {"prompt": "Hello", "max_tokens": 1, "temperature": 0}
    timed = parse_file(*rollout(PRESET.replace("times: 2}", "times: 2, timeout: 2m}"))).rollout
    assert timed is not None and timed.warmup[0].timeout_seconds == 120


def test_a_metric_list_is_summed_as_one_idle_reading() -> None:
    body = (
        "  live: true\n"
        '  drain: {idle: {url: "http://127.0.0.1:8000/metrics", metric: [a_running, b_waiting]}}\n'
    )

    spec = parse_file(*rollout(body)).rollout

    assert spec is not None and spec.drain is not None
    assert spec.drain.idle_metrics == ("a_running", "b_waiting")


def test_the_daemon_signs_presets_expanded_so_the_agent_reads_plain_fields() -> None:
    spec = parse_file(*rollout(PRESET)).rollout
    assert spec is not None

    payload = build_payload(
        job(artifacts=spec.artifacts, drain=spec.drain, warmup=spec.warmup),
        datetime(2026, 12, 7, tzinfo=UTC),
    )

    assert payload["drain"] == {
        "timeoutSeconds": 120,
        "idle": {
            "url": "http://127.0.0.1:8080/metrics",
            "metric": list(TABLE["llama.cpp"]),
            "max": 0,
        },
    }
    assert payload["warmup"] == [
        {
            "url": "http://127.0.0.1:8080/v1/completions",
            "method": "POST",
            "body": WARMUP_BODY,
            "expectStatus": 200,
            "timeoutSeconds": 60,
            "times": 2,
        }
    ]
    assert payload_problems(payload) == []


def test_a_path_goes_in_the_payload_only_when_written() -> None:
    spec = parse_file(*rollout("", _artifact("weights", "model.gguf") + _artifact("tok"))).rollout
    assert spec is not None

    payload = build_payload(job(artifacts=spec.artifacts), datetime(2026, 12, 7, tzinfo=UTC))

    assert [a.get("path") for a in payload["artifacts"]] == ["model.gguf", None]
    assert payload_problems(payload) == []
    pairs = layout_pairs(payload["artifacts"])
    assert pairs == [["model.gguf", DIGEST], ["tok", DIGEST]]
    canonical = f'[["model.gguf","{DIGEST}"],["tok","{DIGEST}"]]'.encode()
    assert model_id(pairs) == hashlib.sha256(canonical).hexdigest()


def test_presets_and_paths_round_trip_through_the_status_record() -> None:
    spec = parse_file(*rollout(PRESET, _artifact("weights", "gguf/model.gguf"))).rollout
    assert spec is not None
    status = RolloutStatus(name="llama", spec_commit="a" * 40, frozen=freeze(spec))

    record = to_record(status)

    assert schemas.validator("rollout-status").is_valid(record)
    assert record["frozen"]["artifacts"][0]["path"] == "gguf/model.gguf"
    assert record["frozen"]["drain"]["idle"]["runtime"] == "llama.cpp"
    assert from_record(record) == status


@pytest.mark.parametrize(
    ("artifacts", "body", "expected"),
    [
        (
            _artifact("weights", "../model.gguf"),
            "",
            "rollouts/llama.yaml:11:148: spec.target.artifacts[0].path: must be a relative path "
            "inside the model directory",
        ),
        (
            _artifact("weights", "gguf/../../etc/passwd"),
            "",
            "rollouts/llama.yaml:11:148: spec.target.artifacts[0].path: must be a relative path",
        ),
        (
            _artifact("weights", "/srv/models/model.gguf"),
            "",
            "rollouts/llama.yaml:11:148: spec.target.artifacts[0].path: must be a relative path "
            "inside the model directory: segments of lowercase letters, digits, '.', '_' and "
            "'-' joined by '/', with no '..' or '.' segment and no leading '/'",
        ),
        (
            _artifact("weights", "model.gguf") + _artifact("tok", "model.gguf"),
            "",
            "rollouts/llama.yaml:12:140: spec.target.artifacts[1].path: the model directory path "
            "'model.gguf' is taken by artifact 'weights': give each artifact its own path",
        ),
        (
            _artifact("weights", "tok") + _artifact("tok"),
            "",
            "rollouts/llama.yaml:12:16: spec.target.artifacts[1].name: the model directory path "
            "'tok' is taken by artifact 'weights'",
        ),
        (
            _artifact("weights", "tok/model.gguf") + _artifact("tok"),
            "",
            "rollouts/llama.yaml:12:16: spec.target.artifacts[1].name: the model directory path "
            "'tok' and 'tok/model.gguf' (artifact 'weights') would make one file a folder",
        ),
        (
            None,
            "  live: true\n  drain: {idle: {runtime: llama.cpp}}\n",
            "rollouts/llama.yaml:13:17: spec.drain.idle: runtime needs port: add the runtime's "
            "port on this node, such as port: 8000",
        ),
        (
            None,
            "  live: true\n  drain: {idle: {runtime: ollama, port: 11434}}\n",
            "rollouts/llama.yaml:13:27: spec.drain.idle.runtime: must be one of vllm, sglang, "
            "llama.cpp, tgi",
        ),
        (
            None,
            '  live: true\n  drain: {idle: {runtime: vllm, port: 8000, metric: "m"}}\n',
            "rollouts/llama.yaml:13:45: spec.drain.idle.metric: runtime vllm sets metric itself: "
            "remove metric, or write it out without runtime",
        ),
        (
            None,
            '  live: true\n  drain: {idle: {runtime: vllm, port: 8000, url: "http://127.0.0.1/"}}\n',
            "rollouts/llama.yaml:13:18: spec.drain.idle.runtime: give exactly one of url or "
            "runtime, not both",
        ),
        (
            None,
            '  live: true\n  drain: {idle: {url: "http://127.0.0.1/"}}\n',
            "rollouts/llama.yaml:13:17: spec.drain.idle: url needs metric: add metric",
        ),
        (
            None,
            "  live: true\n  drain: {idle: {max: 0}}\n",
            "rollouts/llama.yaml:13:17: spec.drain.idle: give url and metric, or runtime and port",
        ),
        (
            None,
            "  live: true\n  drain: {idle: {runtime: tgi, port: 70000}}\n",
            "rollouts/llama.yaml:13:38: spec.drain.idle.port: must be at most 65535, got 70000",
        ),
        (
            None,
            '  live: true\n  drain: {idle: {url: "http://127.0.0.1/", metric: [ok, "9lives"]}}\n',
            "rollouts/llama.yaml:13:57: spec.drain.idle.metric[1]: must be a Prometheus metric name",
        ),
        (
            None,
            "  live: true\n  warmup: [{runtime: sglang, times: 2}]\n",
            "rollouts/llama.yaml:13:12: spec.warmup[0]: runtime needs port",
        ),
        (
            None,
            '  live: true\n  warmup: [{runtime: vllm, port: 1, http: {url: "http://127.0.0.1/"}}]\n',
            "rollouts/llama.yaml:13:37: spec.warmup[0].http: runtime vllm sets http itself",
        ),
        (
            None,
            "  live: true\n  warmup: [{times: 2}]\n",
            "rollouts/llama.yaml:13:12: spec.warmup[0]: give http, or runtime and port",
        ),
        (
            None,
            '  live: true\n  warmup: [{http: {url: "http://127.0.0.1/"}, timeout: 5s}]\n',
            "rollouts/llama.yaml:13:47: spec.warmup[0].timeout: timeout goes with runtime",
        ),
    ],
)
def test_bad_presets_and_paths_are_named_by_file_line_column_and_field(
    artifacts: str | None, body: str, expected: str
) -> None:
    found = problems(body, artifacts)

    assert any(p.startswith(expected) for p in found), found


def test_plan_names_the_preset_its_metrics_and_the_artifact_paths() -> None:
    with_paths = WIDE.replace("size: 1024}", 'size: 1024, path: "tokenizer/tokenizer.json"}')

    text = plan.render_text(planned(with_paths + PRESET.replace("  live: true\n", "")))

    assert "tokenizer as tokenizer/tokenizer.json (1.0 KiB)" in text
    assert (
        "drain (llama.cpp preset): within 2m, until llamacpp:requests_processing + "
        "llamacpp:requests_deferred at http://127.0.0.1:8080/metrics is at most 0"
    ) in text
    assert "warm-up: POST http://127.0.0.1:8080/v1/completions x2 (llama.cpp preset)" in text
