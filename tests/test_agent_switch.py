"""A live apply with drain and warm-up on a real agent, against a real
llama-server (llama.cpp, built by `make llama-server`) run by the shipped
after-apply script, with models staged from Debian's nginx: running
generations finish before the switch, a node that never gets idle is left
as it was, a model that does not load is never served, and client load sees
no failed request with drain and some without.

Client load goes through a client-side balancer (reconciler/cli/llama_runtime.py)
that the node's drain command takes the node out of, as a load balancer
would; the answers' ``model`` field names the file that served each one.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from reconciler.cli.llama_runtime import IDLE_METRICS, Answer, Balancer, LlamaNode, free_port
from reconciler.protocol.signing import SigningKey
from reconciler.spec.artifacts import Artifact, Drain, Warmup
from reconciler.spec.model import Target
from tests.kit.agents import AgentThread
from tests.kit.jobs import envelope, job
from tests.kit.keys import make_key
from tests.kit.llama import (
    Models,
    complete,
    llama_server_binary,
    model_artifact,
    node_config,
    which_model,
)
from tests.kit.nginx import NginxServer
from tests.kit.runtime import METRIC, StandInRuntime
from tests.kit.waiting import wait_for

pytestmark = pytest.mark.slow

METRIC_PROCESSING = IDLE_METRICS[0]  # llamacpp:requests_processing
# Room for generations long enough to be running while the node drains.
LONG_ARGS = "--metrics -c 8192 -np 2"
LONG = {"prompt": "Hello", "max_tokens": 1000, "temperature": 0, "ignore_eos": True}
# Longer than a drain timeout of 1 s by far: 3000 tokens of a slot's 4096.
LONGER = {**LONG, "max_tokens": 3000}
TARGET = Target("hermes", "llama.cpp", "tiny-llama-2", "default")


@dataclass
class Node:
    """One node: its llama-server (run by the after-apply script), the
    models A (serving) and B (staged by each test), the balancer in front."""

    server: LlamaNode
    balancer: Balancer
    models: dict[str, Path]
    artifact: Artifact  # model B, from nginx
    config: Path
    key: SigningKey
    tmp_path: Path

    def agent(self, balancer: Balancer | None = None, *, wait: bool = True) -> AgentThread:
        """The node's agent; ``wait=False``: the after-apply script returns
        once the server starts (LLAMA_SERVER_WAIT=0), the warm-up waits."""
        commands = (balancer or self.balancer).commands("gpu")
        after_apply = self.server.after_apply()
        return AgentThread(
            self.config.parent.parent,
            [self.key],
            after_apply=after_apply if wait else f"LLAMA_SERVER_WAIT=0 {after_apply}",
            drain_command=commands["drain"],
            undrain_command=commands["undrain"],
            after_apply_timeout=90,
        )

    def serving(self) -> str:
        """The label of the model the server answers from."""
        return which_model(complete(self.server.url)["model"], self.models)

    def pid(self) -> str:
        return self.server.pid_file.read_text().strip()


@pytest.fixture
def node(tmp_path: Path, models: Models) -> Iterator[Node]:
    key = make_key(tmp_path / "keys" / "reconciler").signing
    model_a, model_b, broken = models.model(1), models.model(2), models.truncated()
    slow = models.slow(3)
    config = tmp_path / "state" / "runtimes" / "hermes.yaml"
    config.parent.mkdir(parents=True)
    config.write_bytes(node_config(model_a, 1))
    server = LlamaNode(llama_server_binary(), free_port(), tmp_path / "run", LONG_ARGS)
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for name, path in {"b.gguf": model_b, "broken.gguf": broken, "slow.gguf": slow}.items():
        (mirror / name).symlink_to(path)  # nginx follows it
    started = server.start(config)
    assert started.returncode == 0, started.stderr
    balancer = Balancer({"gpu": server.url})
    try:
        with NginxServer(tmp_path / "nginx", mirror) as nginx:
            artifact = model_artifact(nginx.url("b.gguf"), model_b)
            yield Node(
                server,
                balancer,
                {"A": model_a, "B": model_b},
                artifact,
                config,
                key,
                tmp_path,
            )
    finally:
        balancer.close()
        server.stop()


def _switch(node: Node, job_id: str = "apply-1", **changes: Any) -> Any:
    settings: dict[str, Any] = {
        "target": TARGET,
        "artifacts": (node.artifact,),
        "drain": Drain(300, f"{node.server.url}/metrics", METRIC_PROCESSING, 0),
        "warmup": (
            Warmup(
                f"{node.server.url}/v1/completions",
                "POST",
                '{"prompt": "Hello", "max_tokens": 1, "temperature": 0}',
                200,
                30,
                2,
            ),
        ),
    }
    settings.update(changes)
    return job(job_id, **settings)


def _finished(agent: AgentThread, job_id: str, timeout: float = 400) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        status, record = agent.get(f"jobs/{job_id}")
        return record if status == 200 and record["state"] in ("succeeded", "failed") else None

    record: dict[str, Any] = wait_for(done, timeout, what=f"job {job_id} to finish")
    return record


def _staged(agent: AgentThread, node: Node, artifact: Artifact | None = None) -> None:
    stage = job("stage-1", kind="stage", artifacts=(artifact or node.artifact,))
    agent.post(envelope(stage, node.key))
    assert _finished(agent, "stage-1")["state"] == "succeeded"


def _long_generation(
    node: Node, body: dict[str, Any] = LONG
) -> tuple[threading.Thread, list[Answer]]:
    """A client request running when the switch begins; its answer lands in the list."""
    answers: list[Answer] = []
    load = Balancer({"gpu": node.server.url})

    def ask() -> None:
        load.start(1, max_requests=1, max_seconds=600, body=body)
        answers.extend(load.wait())
        load.close()

    thread = threading.Thread(target=ask)
    thread.start()
    wait_for(lambda: _running(node) > 0, what="the long generation to start")
    return thread, answers


def _running(node: Node) -> float:
    text = httpx.get(f"{node.server.url}/metrics", timeout=10).text
    line = next(x for x in text.splitlines() if x.startswith(METRIC_PROCESSING + " "))
    return float(line.split()[1])


def test_a_drained_switch_lets_a_running_generation_finish_then_warms_up_before_serving(
    node: Node,
) -> None:
    agent = node.agent()
    try:
        _staged(agent, node)
        pid = node.pid()
        client, answers = _long_generation(node)
        agent.post(envelope(_switch(node), node.key))
        record = _finished(agent, "apply-1")
        client.join()
        serving = node.serving()
    finally:
        agent.close()
    assert record["state"] == "succeeded", record
    # The running generation finished on the old model: not cut off.
    assert [(a.status, which_model(a.model, node.models)) for a in answers] == [(200, "A")]
    assert serving == "B" and node.pid() != pid
    assert node.balancer.events == ["drain gpu", "undrain gpu"]
    timings = record["timings"]
    order = ["drainStartedAt", "drainedAt", "activatedAt", "warmedAt", "servingAt"]
    assert all(timings[k] for k in order)
    assert [timings[k] for k in order] == sorted(timings[k] for k in order)
    # It was still running when the drain began, and ended before the switch.
    assert _epoch(timings["drainStartedAt"]) < answers[0].answered
    assert answers[0].answered <= _epoch(timings["activatedAt"])


def test_a_drain_that_never_reaches_idle_fails_drain_timeout_and_changes_nothing(
    node: Node,
) -> None:
    agent = node.agent()
    before = node.config.read_bytes()
    try:
        _staged(agent, node)
        pid = node.pid()
        client, _ = _long_generation(node, LONGER)  # outlasts the drain timeout
        drain = Drain(1, f"{node.server.url}/metrics", METRIC_PROCESSING, 0)
        agent.post(envelope(_switch(node, drain=drain), node.key))
        record = _finished(agent, "apply-1")
        backups = agent.agent.state.list_backups()
    finally:
        agent.close()
        node.server.stop()  # ends the long generation
        client.join()
    assert record["state"] == "failed"
    assert record["error"].startswith("drain_timeout: not idle within 1s")
    assert f"{METRIC_PROCESSING} was 1" in record["error"]
    assert record["error"].endswith("; undrained")
    assert node.config.read_bytes() == before
    assert backups == []
    assert node.pid() == pid  # never restarted
    assert node.balancer.events == ["drain gpu", "undrain gpu"]
    assert record["timings"]["activatedAt"] is None and record["timings"]["servingAt"]


def test_a_model_that_does_not_load_is_never_served_the_old_one_comes_back(
    node: Node, models: Models
) -> None:
    """A truncated GGUF, as an interrupted copy of a shard leaves it: the
    after-apply script sees llama-server exit while loading and fails; the
    agent puts the old config back and runs the script again for it."""
    broken = model_artifact(node.artifact.url.replace("b.gguf", "broken.gguf"), models.truncated())
    agent = node.agent()
    before = node.config.read_bytes()
    try:
        _staged(agent, node, broken)
        node.balancer.start(2, max_requests=100_000, max_seconds=300)
        agent.post(envelope(_switch(node, artifacts=(broken,)), node.key))
        record = _finished(agent, "apply-1")
        answers = node.balancer.stop()
        serving = node.serving()
    finally:
        agent.close()
    assert record["state"] == "failed"
    assert record["error"].startswith(
        "after-apply command failed (exit status 1); previous config restored, "
        "after-apply run again for it; undrained; output: "
    )
    assert "llama-server exited while loading" in record["error"] + record.get("detail", "")
    assert node.config.read_bytes() == before
    assert serving == "A"
    assert node.balancer.events == ["drain gpu", "undrain gpu"]
    assert answers and {a.status for a in answers} == {200}  # drained first: none failed
    assert {which_model(a.model, node.models) for a in answers} == {"A"}


def test_without_waiting_in_after_apply_a_corrupt_model_fails_its_warm_up_and_the_old_serves(
    node: Node, models: Models
) -> None:
    """LLAMA_SERVER_WAIT=0: the script starts llama-server on a truncated
    GGUF and returns; the server exits while loading, so the runtime never
    comes back: warmup_failed, the old config byte for byte, the old model
    answering again."""
    broken = model_artifact(node.artifact.url.replace("b.gguf", "broken.gguf"), models.truncated())
    warmup = Warmup(f"{node.server.url}/v1/completions", "POST", '{"prompt": "Hello"}', 200, 5, 1)
    agent = node.agent(wait=False)
    before = node.config.read_bytes()
    try:
        _staged(agent, node, broken)
        agent.post(envelope(_switch(node, artifacts=(broken,), warmup=(warmup,)), node.key))
        record = _finished(agent, "apply-1")
        serving = wait_for(_answering(node), 120, what="the old model to answer again")
    finally:
        agent.close()
    assert record["state"] == "failed"
    assert record["error"].startswith(f"warmup_failed: POST {warmup.url} (time 1 of 1): ")
    assert record["error"].endswith(
        "; previous config restored, after-apply run again for it; undrained"
    )
    assert "llama-server exited while loading" not in record["error"]  # not after-apply's
    assert node.config.read_bytes() == before
    assert serving == "A"
    assert node.balancer.events == ["drain gpu", "undrain gpu"]


def test_without_waiting_in_after_apply_the_warm_up_waits_for_a_good_model_to_load(
    node: Node,
) -> None:
    """LLAMA_SERVER_WAIT=0 with a model that loads: the warm-up asks again
    while the server starts, and the job succeeds on the new model."""
    agent = node.agent(wait=False)
    try:
        _staged(agent, node)
        agent.post(envelope(_switch(node), node.key))
        record = _finished(agent, "apply-1")
        serving = node.serving()
    finally:
        agent.close()
    assert record["state"] == "succeeded", record
    assert serving == "B"


def _answering(node: Node) -> Any:
    """A check for wait_for: the label of the model answering, None while
    the server cannot answer yet."""

    def check() -> str | None:
        try:
            return node.serving()
        except (httpx.HTTPError, AssertionError, KeyError):
            return None

    return check


def test_a_model_too_slow_for_its_warm_up_fails_warmup_failed_and_the_old_one_serves_again(
    node: Node, models: Models
) -> None:
    """The model loads and answers /health, but generates far slower than
    the warm-up allows: warmup_failed, the old config and model come back."""
    slow = model_artifact(node.artifact.url.replace("b.gguf", "slow.gguf"), models.slow(3))
    body = json.dumps({**LONG, "max_tokens": 1000})
    warmup = Warmup(f"{node.server.url}/v1/completions", "POST", body, 200, 1, 1)
    agent = node.agent()
    before = node.config.read_bytes()
    try:
        _staged(agent, node, slow)
        node.balancer.start(2, max_requests=100_000, max_seconds=300)
        agent.post(envelope(_switch(node, artifacts=(slow,), warmup=(warmup,)), node.key))
        record = _finished(agent, "apply-1")
        answers = node.balancer.stop()
        serving = node.serving()
    finally:
        agent.close()
    assert record["state"] == "failed"
    assert record["error"] == (
        f"warmup_failed: POST {warmup.url} (time 1 of 1): no answer within 1s; "
        "previous config restored, after-apply run again for it; undrained"
    )
    assert node.config.read_bytes() == before
    assert serving == "A"
    assert node.balancer.events == ["drain gpu", "undrain gpu"]
    assert answers and {a.status for a in answers} == {200}
    assert {which_model(a.model, node.models) for a in answers} == {"A"}


def test_a_loaded_model_that_fails_its_warm_up_is_never_served_the_old_one_comes_back(
    tmp_path: Path,
) -> None:
    """Stand-in runtime (tests/kit/runtime.py): a model that loads and then
    answers 500 is a fault a real llama-server cannot be made to show."""
    key = make_key(tmp_path / "keys" / "reconciler").signing
    config = tmp_path / "state" / "runtimes" / "hermes.yaml"
    config.parent.mkdir(parents=True)
    old = b"provider: vllm\nmodel: old\nprofile: default\n"
    config.write_bytes(old)
    with StandInRuntime("old") as runtime:
        runtime.broken = {"llama3.1-8b"}
        commands = runtime.commands(tmp_path / "scripts")
        agent = AgentThread(
            tmp_path / "state",
            [key],
            after_apply=commands["after_apply"],
            drain_command=commands["drain"],
            undrain_command=commands["undrain"],
        )
        warmup = Warmup(f"{runtime.url}/v1/completions", "POST", '{"prompt":"hi"}', 200, 10, 2)
        try:
            agent.post(
                envelope(
                    job(
                        "apply-1",
                        drain=Drain(10, f"{runtime.url}/metrics", METRIC, 0),
                        warmup=(warmup,),
                    ),
                    key,
                )
            )
            record = agent.wait_finished("apply-1")
        finally:
            agent.close()
    assert record["state"] == "failed"
    assert record["error"].startswith("warmup_failed: POST ")
    assert "answered 500 (expected 200)" in record["error"]
    assert record["error"].endswith(
        "; previous config restored, after-apply run again for it; undrained"
    )
    assert config.read_bytes() == old
    assert runtime.events == ["drain", "load llama3.1-8b", "load old", "undrain"]
    assert runtime.model == "old" and not runtime.drained
    assert record["backupId"]


def test_without_drain_a_warm_up_still_comes_before_the_job_succeeds(node: Node) -> None:
    agent = node.agent()
    try:
        _staged(agent, node)
        agent.post(envelope(_switch(node, drain=None), node.key))
        record = _finished(agent, "apply-1")
        serving = node.serving()
    finally:
        agent.close()
    assert record["state"] == "succeeded", record
    assert serving == "B"
    assert node.balancer.events == []  # no drain, so no undrain
    assert record["timings"]["drainStartedAt"] is None
    assert record["timings"]["activatedAt"] <= record["timings"]["warmedAt"]
    assert record["timings"]["warmedAt"] <= record["timings"]["servingAt"]


def test_a_plain_live_apply_records_when_it_was_activated_and_serving_again(
    node: Node,
) -> None:
    agent = node.agent()
    try:
        pid = node.pid()
        agent.post(envelope(job("apply-1"), node.key))
        record = _finished(agent, "apply-1")
        serving = node.serving()
    finally:
        agent.close()
    assert record["state"] == "succeeded"
    timings = record["timings"]
    # Out of service from the config written (before after-apply) to serving again.
    assert timings["drainStartedAt"] is None and timings["drainedAt"] is None
    assert timings["activatedAt"] <= timings["servingAt"]
    assert node.pid() != pid and serving == "A"  # restarted on the same model


def test_the_drain_command_sees_the_model_it_drains_for(node: Node) -> None:
    seen = node.tmp_path / "seen.txt"
    commands = node.balancer.commands("gpu")
    agent = AgentThread(
        node.config.parent.parent,
        [node.key],
        after_apply=node.server.after_apply(),
        drain_command=f'echo "drain $RECONCILER_MODEL" >> {seen}; {commands["drain"]}',
        undrain_command=f'echo "undrain $RECONCILER_MODEL" >> {seen}; {commands["undrain"]}',
        after_apply_timeout=90,
    )
    try:
        _staged(agent, node)
        agent.post(envelope(_switch(node), node.key))
        record = _finished(agent, "apply-1")
    finally:
        agent.close()
    assert record["state"] == "succeeded", record
    assert seen.read_text().splitlines() == ["drain tiny-llama-2", "undrain tiny-llama-2"]


def test_client_load_sees_no_failed_request_with_drain_and_some_without(node: Node) -> None:
    spare = LlamaNode(node.server.binary, free_port(), node.tmp_path / "spare", LONG_ARGS)
    assert spare.start(node.config).returncode == 0
    # A second node behind the balancer takes the drained one's share.
    load = Balancer({"gpu": node.server.url, "spare": spare.url})
    agent = node.agent(load)
    try:
        _staged(agent, node)
        load.start(3, max_requests=100_000, max_seconds=300)
        wait_for(lambda: len(load.answers) >= 10, what="client load to be served")
        agent.post(envelope(_switch(node), node.key))
        drained = _finished(agent, "apply-1")
        served = len(load.answers)
        wait_for(lambda: len(load.answers) > served + 10, what="the new model to serve")
        with_drain = load.stop()

        load.start(3, max_requests=100_000, max_seconds=300)
        wait_for(lambda: len(load.answers) > len(with_drain) + 10, what="client load again")
        other = Target("hermes", "llama.cpp", "tiny-llama-2-again", "default")
        agent.post(envelope(_switch(node, "apply-2", drain=None, target=other), node.key))
        undrained = _finished(agent, "apply-2")
        without_drain = load.stop()[len(with_drain) :]
    finally:
        agent.close()
        load.close()
        spare.stop()
    assert drained["state"] == "succeeded" and undrained["state"] == "succeeded"
    assert {a.status for a in with_drain} == {200}, _failures(with_drain)
    serving_at = _epoch(drained["timings"]["servingAt"])
    gpu = [a for a in with_drain if a.node == "gpu"]
    assert {which_model(a.model, node.models) for a in gpu if a.sent >= serving_at} == {"B"}
    # Without drain the restart refuses or cuts off what reaches the node meanwhile.
    assert [a for a in without_drain if a.status != 200], without_drain


def _failures(answers: list[Answer]) -> list[Answer]:
    return [a for a in answers if a.status != 200]


def _epoch(stamp: str) -> float:
    from reconciler.spec.times import parse_time

    return parse_time(stamp).timestamp()
