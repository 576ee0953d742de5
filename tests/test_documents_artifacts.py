"""target.artifacts, stage, drain and warmup in rollout files: a full
declaration becomes values, defaults are filled, and each kind of bad input
gets its own file:line:col, field and message."""

from __future__ import annotations

from dataclasses import replace

import pytest

from reconciler.spec import schemas
from reconciler.spec.artifacts import Artifact, Drain, Stage, Warmup
from reconciler.spec.documents import parse_file
from reconciler.spec.rollout_status import (
    RolloutStatus,
    freeze,
    from_record,
    frozen_changes,
    to_record,
)

DIGEST = "0f3a" * 16
HEAD = """\
apiVersion: reconciler/v1
kind: Rollout
metadata: {name: llama}
spec:
  selector: {role: canary}
"""
TARGET = """\
  target:
    runtime: hermes
    provider: ollama
    model: llama3.1-8b
    artifacts:
"""


def rollout(body: str, artifacts: str | None = None) -> tuple[str, bytes]:
    if artifacts is None:
        artifacts = f'      - {{name: weights, url: "https://mirror.example/m.gguf", sha256: {DIGEST}, size: 4920734976}}\n'
    return "rollouts/llama.yaml", (HEAD + TARGET + artifacts + body).encode()


def problems(body: str, artifacts: str | None = None) -> list[str]:
    return [str(p) for p in parse_file(*rollout(body, artifacts)).problems]


FULL = """\
  live: true
  stage: {ahead: 2, maxConcurrent: 4, timeout: 30m}
  drain:
    timeout: 2m
    idle: {url: "http://127.0.0.1:8000/metrics", metric: "vllm:num_requests_running", max: 0}
  warmup:
    - http: {url: "http://{node}:8000/v1/completions", method: POST, body: '{"prompt":"hi"}', expectStatus: 200, timeout: 60s}
      times: 2
"""


def test_a_full_declaration_becomes_values() -> None:
    parsed = parse_file(*rollout(FULL))

    assert parsed.problems == ()
    spec = parsed.rollout
    assert spec is not None
    assert spec.artifacts == (
        Artifact("weights", "https://mirror.example/m.gguf", DIGEST, 4920734976),
    )
    assert spec.stage == Stage(ahead=2, max_concurrent=4, timeout_seconds=1800)
    assert spec.drain == Drain(120, "http://127.0.0.1:8000/metrics", "vllm:num_requests_running", 0)
    assert spec.warmup == (
        Warmup("http://{node}:8000/v1/completions", "POST", '{"prompt":"hi"}', 200, 60, 2),
    )


def test_artifacts_alone_stage_with_the_defaults_and_neither_drain_nor_warm_up() -> None:
    spec = parse_file(*rollout("")).rollout

    assert spec is not None
    assert spec.stage == Stage(ahead=1, max_concurrent=10, timeout_seconds=3600)
    assert spec.drain is None and spec.warmup == ()


def test_defaults_of_drain_and_warm_up() -> None:
    body = """\
  live: true
  drain: {idle: {url: "http://localhost:8000/metrics", metric: inflight}}
  warmup: [{http: {url: "http://[::1]:8000/"}}]
"""
    spec = parse_file(*rollout(body)).rollout

    assert spec is not None
    assert spec.drain == Drain(300, "http://localhost:8000/metrics", "inflight", 0)
    assert spec.warmup == (Warmup("http://[::1]:8000/", "GET", "", 200, 60, 1),)


def test_a_rollout_without_artifacts_has_none_of_it() -> None:
    path, data = rollout("")
    plain = data.replace(TARGET.encode(), TARGET.replace("    artifacts:\n", "").encode())
    plain = b"".join(line for line in plain.splitlines(True) if b"weights" not in line)
    spec = parse_file(path, plain).rollout

    assert spec is not None
    assert (spec.artifacts, spec.stage, spec.drain, spec.warmup) == ((), None, None, ())


def test_every_declaration_is_frozen_at_start() -> None:
    before = parse_file(*rollout(FULL)).rollout
    after = parse_file(
        *rollout(FULL.replace("ahead: 2", "ahead: 3").replace("times: 2", "times: 3"))
    ).rollout
    assert before is not None and after is not None

    assert frozen_changes(freeze(before), after) == ["stage", "warmup"]
    assert freeze(before).artifacts == before.artifacts


@pytest.mark.parametrize(
    ("artifacts", "body", "expected"),
    [
        (
            '      - {name: weights, url: "https://m.example/w", sha256: 0F3A, size: 1}\n',
            "",
            "rollouts/llama.yaml:11:61: spec.target.artifacts[0].sha256: must be the file's "
            "SHA-256 as 64 lowercase hex digits, as sha256sum prints it",
        ),
        (
            f'      - {{name: weights, url: "https://m.example/w", sha256: {DIGEST}, size: 0}}\n',
            "",
            "rollouts/llama.yaml:11:133: spec.target.artifacts[0].size: must be at least 1, got 0",
        ),
        (
            f'      - {{name: weights, url: "https://m.example/w", sha256: {DIGEST}, size: 1.5}}\n',
            "",
            "rollouts/llama.yaml:11:133: spec.target.artifacts[0].size: must be",
        ),
        (
            f'      - {{name: weights, url: "https://m.example/w", sha256: {DIGEST}, size: 2.0}}\n',
            "",
            "rollouts/llama.yaml:11:133: spec.target.artifacts[0].size: must be a whole number "
            "of bytes, got 2.0",
        ),
        (
            f'      - {{name: weights, url: "ftp://m.example/w", sha256: {DIGEST}, size: 1}}\n',
            "",
            "rollouts/llama.yaml:11:30: spec.target.artifacts[0].url: must be an http:// or "
            "https:// URL, such as https://mirror.example/llama3.1-8b/model.gguf",
        ),
        (
            f'      - {{name: weights, url: "https://:80/w", sha256: {DIGEST}, size: 1}}\n',
            "",
            "rollouts/llama.yaml:11:30: spec.target.artifacts[0].url: has no host",
        ),
        (
            f'      - {{name: weights, url: "https://m.example/a", sha256: {DIGEST}, size: 1}}\n'
            f'      - {{name: weights, url: "https://m.example/b", sha256: {DIGEST}, size: 1}}\n',
            "",
            "rollouts/llama.yaml:12:16: spec.target.artifacts[1].name: artifact name 'weights' "
            "is used twice (also entry 1): give each artifact its own name",
        ),
        (
            None,
            "  stage: {timeout: 0s}\n",
            "rollouts/llama.yaml:12:20: spec.stage.timeout: duration must be more than zero",
        ),
        (
            None,
            "  stage: {maxConcurrent: 0}\n",
            "rollouts/llama.yaml:12:26: spec.stage.maxConcurrent: must be at least 1, got 0",
        ),
        (
            None,
            '  drain: {idle: {url: "http://127.0.0.1:1/m", metric: m}}\n',
            "rollouts/llama.yaml:12:3: spec.drain: drain needs live: true: a dry run changes "
            "nothing on the node, so there is nothing to drain; set live: true, or remove drain",
        ),
        (
            None,
            '  warmup: [{http: {url: "http://127.0.0.1:1/"}}]\n',
            "rollouts/llama.yaml:12:3: spec.warmup: warmup needs live: true: a dry run changes "
            "nothing on the node, so there is nothing to warm up; set live: true, or remove "
            "warmup",
        ),
        (
            None,
            '  live: true\n  warmup: [{http: {url: "http://10.0.0.5:8000/"}}]\n',
            "rollouts/llama.yaml:13:25: spec.warmup[0].http.url: an agent asks only its own "
            "node: the host '10.0.0.5' must be a loopback address (127.0.0.1, ::1, localhost) "
            "or {node}, the node itself as the agent sees it",
        ),
        (
            None,
            '  live: true\n  drain: {idle: {url: "http://metrics.example/", metric: m}}\n',
            "rollouts/llama.yaml:13:23: spec.drain.idle.url: an agent asks only its own node: "
            "the host 'metrics.example' must be",
        ),
        (
            None,
            '  live: true\n  drain: {idle: {url: "http://127.0.0.1/", metric: "9lives"}}\n',
            "rollouts/llama.yaml:13:52: spec.drain.idle.metric: must be a Prometheus metric name",
        ),
        (
            None,
            '  live: true\n  warmup: [{http: {url: "http://127.0.0.1/", method: BREW}}]\n',
            "rollouts/llama.yaml:13:54: spec.warmup[0].http.method: must be one of",
        ),
    ],
)
def test_bad_artifact_input_is_named_by_file_line_column_and_field(
    artifacts: str | None, body: str, expected: str
) -> None:
    found = problems(body, artifacts)

    assert any(p.startswith(expected) for p in found), found


def test_stage_without_artifacts_is_refused_at_its_key() -> None:
    data = HEAD + "  target: {runtime: hermes, provider: ollama, model: m}\n  stage: {ahead: 2}\n"

    found = [str(p) for p in parse_file("rollouts/llama.yaml", data.encode()).problems]

    assert found == [
        "rollouts/llama.yaml:7:3: spec.stage: stage needs target.artifacts: there is nothing "
        "to download ahead; list the files under target.artifacts, or remove stage"
    ]


def test_the_frozen_declaration_round_trips_through_the_status_record() -> None:
    spec = parse_file(*rollout(FULL)).rollout
    assert spec is not None
    status = RolloutStatus(name="llama", spec_commit="a" * 40, frozen=freeze(spec))

    record = to_record(status)

    assert schemas.validator("rollout-status").is_valid(record)
    assert record["frozen"]["stage"] == {"ahead": 2, "maxConcurrent": 4, "timeout": "30m"}
    assert from_record(record) == status
    plain = to_record(
        RolloutStatus(
            name="llama",
            frozen=freeze(replace(spec, artifacts=(), stage=None, drain=None, warmup=())),
        )
    )
    assert not {"artifacts", "stage", "drain", "warmup"} & plain["frozen"].keys()
