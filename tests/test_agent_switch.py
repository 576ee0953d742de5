"""A live apply with drain and warm-up on a real agent, against a stand-in
inference runtime on loopback: running generations finish before the
switch, a node that never gets idle is left as it was, and a model that
does not warm up is never served."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from reconciler.protocol.signing import SigningKey
from reconciler.spec.artifacts import Drain, Warmup
from reconciler.spec.model import Target
from tests.kit.agents import AgentThread
from tests.kit.jobs import envelope, job
from tests.kit.keys import make_key
from tests.kit.runtime import METRIC, StandInRuntime
from tests.kit.waiting import wait_for

OLD_CONFIG = b"provider: vllm\nmodel: old\nprofile: default\n"


@pytest.fixture
def key(tmp_path: Path) -> SigningKey:
    return make_key(tmp_path / "keys" / "reconciler").signing


@pytest.fixture
def state(tmp_path: Path) -> Path:
    config = tmp_path / "state" / "runtimes" / "hermes.yaml"
    config.parent.mkdir(parents=True)
    config.write_bytes(OLD_CONFIG)
    return tmp_path / "state"


@pytest.fixture
def runtime() -> Iterator[StandInRuntime]:
    with StandInRuntime("old") as stand_in:
        yield stand_in


def _agent(state: Path, key: SigningKey, runtime: StandInRuntime, tmp_path: Path) -> AgentThread:
    commands = runtime.commands(tmp_path / "scripts")
    return AgentThread(
        state,
        [key],
        after_apply=commands["after_apply"],
        drain_command=commands["drain"],
        undrain_command=commands["undrain"],
    )


def _switch_job(runtime: StandInRuntime, job_id: str = "apply-1", **changes: object) -> object:
    settings: dict[str, object] = {
        "drain": Drain(10, f"{runtime.url}/metrics", METRIC, 0),
        "warmup": (Warmup(f"{runtime.url}/v1/completions", "POST", '{"prompt":"hi"}', 200, 10, 2),),
    }
    settings.update(changes)
    return job(job_id, **settings)  # type: ignore[arg-type]


def _generation(runtime: StandInRuntime, answers: list[int]) -> threading.Thread:
    """A client request that runs while the switch begins."""

    def ask() -> None:
        try:
            answers.append(httpx.post(f"{runtime.url}/lb/v1/completions", timeout=60).status_code)
        except httpx.HTTPError:
            answers.append(0)

    thread = threading.Thread(target=ask)
    thread.start()
    wait_for(lambda: runtime.in_flight > 0, what="the generation to start")
    return thread


def test_a_drained_switch_lets_running_generations_finish_then_warms_up_before_serving(
    tmp_path: Path, state: Path, key: SigningKey, runtime: StandInRuntime
) -> None:
    runtime.delay = 1.0
    answers: list[int] = []
    client = _generation(runtime, answers)
    agent = _agent(state, key, runtime, tmp_path)
    try:
        agent.post(envelope(_switch_job(runtime), key))
        record = agent.wait_finished("apply-1")
    finally:
        agent.close()
        client.join()
    assert record["state"] == "succeeded", record
    assert answers == [200]  # the running generation finished: not cut off
    assert runtime.failed == 0
    assert runtime.events == ["drain", "load llama3.1-8b", "undrain"]
    assert runtime.served == 1 + 2  # the generation, then two warm-up requests
    timings = record["timings"]
    order = ["drainStartedAt", "drainedAt", "activatedAt", "warmedAt", "servingAt"]
    assert all(timings[k] for k in order)
    assert [timings[k] for k in order] == sorted(timings[k] for k in order)


def test_a_drain_that_never_reaches_idle_fails_drain_timeout_and_changes_nothing(
    tmp_path: Path, state: Path, key: SigningKey, runtime: StandInRuntime
) -> None:
    runtime.delay = 30.0  # a generation that outlasts the drain timeout
    answers: list[int] = []
    client = _generation(runtime, answers)
    agent = _agent(state, key, runtime, tmp_path)
    try:
        agent.post(
            envelope(_switch_job(runtime, drain=Drain(1, f"{runtime.url}/metrics", METRIC, 0)), key)
        )
        record = agent.wait_finished("apply-1")
        backups = agent.agent.state.list_backups()
    finally:
        agent.close()
        runtime.released.set()
        client.join()
    assert record["state"] == "failed"
    assert record["error"].startswith("drain_timeout: not idle within 1s")
    assert f"{METRIC} was 1" in record["error"] and record["error"].endswith("; undrained")
    assert (state / "runtimes" / "hermes.yaml").read_bytes() == OLD_CONFIG
    assert backups == []
    assert runtime.events == ["drain", "undrain"]
    assert record["timings"]["activatedAt"] is None and record["timings"]["servingAt"]


def test_a_model_that_fails_its_warm_up_is_never_served_the_old_one_comes_back(
    tmp_path: Path, state: Path, key: SigningKey, runtime: StandInRuntime
) -> None:
    runtime.broken = {"llama3.1-8b"}  # loads, then answers 500
    agent = _agent(state, key, runtime, tmp_path)
    try:
        agent.post(envelope(_switch_job(runtime), key))
        record = agent.wait_finished("apply-1")
    finally:
        agent.close()
    assert record["state"] == "failed"
    assert record["error"].startswith("warmup_failed: POST ")
    assert "answered 500 (expected 200)" in record["error"]
    assert record["error"].endswith(
        "; previous config restored, after-apply run again for it; undrained"
    )
    assert (state / "runtimes" / "hermes.yaml").read_bytes() == OLD_CONFIG
    assert runtime.events == ["drain", "load llama3.1-8b", "load old", "undrain"]
    assert runtime.model == "old" and not runtime.drained
    assert record["backupId"]  # the old bytes stay backed up, as for any failed apply


def test_without_drain_a_warm_up_still_comes_before_the_job_succeeds(
    tmp_path: Path, state: Path, key: SigningKey, runtime: StandInRuntime
) -> None:
    agent = _agent(state, key, runtime, tmp_path)
    try:
        agent.post(envelope(_switch_job(runtime, drain=None), key))
        record = agent.wait_finished("apply-1")
    finally:
        agent.close()
    assert record["state"] == "succeeded", record
    assert runtime.events == ["load llama3.1-8b"]  # no drain, so no undrain
    assert record["timings"]["drainStartedAt"] is None
    assert record["timings"]["activatedAt"] <= record["timings"]["servingAt"]


def test_a_plain_live_apply_records_when_it_was_activated_and_serving_again(
    tmp_path: Path, state: Path, key: SigningKey, runtime: StandInRuntime
) -> None:
    agent = _agent(state, key, runtime, tmp_path)
    try:
        agent.post(envelope(job("apply-1"), key))
        record = agent.wait_finished("apply-1")
    finally:
        agent.close()
    assert record["state"] == "succeeded"
    timings = record["timings"]
    # Out of service from the config written (before after-apply) to serving again.
    assert timings["drainStartedAt"] is None and timings["drainedAt"] is None
    assert timings["activatedAt"] <= timings["servingAt"]
    assert runtime.events == ["load llama3.1-8b"]  # no drain, so no undrain


def test_the_drain_command_sees_the_model_it_drains_for(
    tmp_path: Path, state: Path, key: SigningKey, runtime: StandInRuntime
) -> None:
    seen = tmp_path / "seen.txt"
    commands = runtime.commands(tmp_path / "scripts")
    agent = AgentThread(
        state,
        [key],
        after_apply=commands["after_apply"],
        drain_command=f'echo "drain $RECONCILER_MODEL" >> {seen}; {commands["drain"]}',
        undrain_command=f'echo "undrain $RECONCILER_MODEL" >> {seen}; {commands["undrain"]}',
    )
    try:
        agent.post(envelope(_switch_job(runtime), key))
        record = agent.wait_finished("apply-1")
    finally:
        agent.close()
    assert record["state"] == "succeeded", record
    assert seen.read_text().splitlines() == ["drain llama3.1-8b", "undrain llama3.1-8b"]


def test_client_load_sees_no_failed_request_with_drain_and_some_without(
    tmp_path: Path, state: Path, key: SigningKey, runtime: StandInRuntime
) -> None:
    runtime.load_seconds = 0.3  # the model takes a while to load
    agent = _agent(state, key, runtime, tmp_path)
    try:
        load = runtime.load(workers=3, delay=0.05)
        wait_for(lambda: runtime.served >= 5, what="client load to be served")
        agent.post(envelope(_switch_job(runtime), key))
        drained = agent.wait_finished("apply-1")
        served = runtime.served
        wait_for(lambda: runtime.served > served + 5, what="the new model to serve the load")
        with_drain = load.stop()
        failed_with_drain = runtime.failed

        wait_for(lambda: runtime.in_flight == 0, what="the load to end")
        # A generation surely in flight when the new model starts loading.
        answers: list[int] = []
        long_one = threading.Thread(
            target=lambda: answers.append(_status(f"{runtime.url}/lb/v1/completions?delay=30"))
        )
        long_one.start()
        wait_for(lambda: runtime.in_flight == 1, what="the long generation")
        load = runtime.load(workers=3, delay=0.05)
        agent.post(envelope(_switch_job(runtime, "apply-2", drain=None, target=_other()), key))
        undrained = agent.wait_finished("apply-2")
        without_drain = load.stop()
        long_one.join()
    finally:
        agent.close()
    assert drained["state"] == "succeeded" and undrained["state"] == "succeeded"
    assert failed_with_drain == 0, with_drain
    assert set(with_drain) <= {200, 503}  # 503: refused while drained, sent elsewhere
    assert answers == [0]  # cut off by the restart
    assert runtime.failed > 0, without_drain


def _status(url: str) -> int:
    try:
        return httpx.post(url, timeout=60).status_code
    except httpx.HTTPError:
        return 0


def _other() -> Target:
    return Target("hermes", "vllm", "llama3.2-3b", "default")
