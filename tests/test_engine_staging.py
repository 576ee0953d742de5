"""Staging through the real engine: a rollout's artifacts go to its nodes
ahead of their batch, at most maxConcurrent at once, a batch is applied
only once its nodes are staged, and a stage that fails holds, retries or
carries on by the stage table, never stopping or restoring."""

from __future__ import annotations

import pytest

from reconciler.engine.queries import in_flight, next_wakeup
from reconciler.engine.staging import STAGE_RULES, decide, render_stage_table
from reconciler.protocol.canary_observations import AlertAnswer
from reconciler.spec.artifact_records import Vouched
from reconciler.spec.artifacts import Artifact, Drain, ModelSigner, Stage, Warmup
from reconciler.spec.compare import Alerts, FiringAlert
from reconciler.spec.health import Health
from tests.engine_world import World

WEIGHTS = Artifact("weights", "https://mirror.example/m.gguf", "0f" * 32, 4_920_734_976)


def staged_world(nodes: int = 6, **fields: object) -> World:
    w = World(nodes)
    fields.setdefault("batch_size", 2)
    fields.setdefault("stage", Stage(ahead=1, max_concurrent=10))
    w.rollout(artifacts=(WEIGHTS,), **fields)
    return w


def kinds(w: World) -> dict[str, str]:
    """Node -> kind of the job sent to it in the last step."""
    return {j.node: j.kind for j in w.last.effects}


def stage_all(w: World, *names: str) -> None:
    for name in names:
        assert w.job(name).kind == "stage"
        w.succeed(name)


def first_staged(w: World, at: int = 0) -> None:
    """The first node stages alone, and succeeds: the rest may fan out."""
    w.step(at)
    assert kinds(w) == {"n1": "stage"}
    stage_all(w, "n1")


def test_the_first_node_stages_alone_and_the_rest_fan_out_only_after_its_digest_matched() -> None:
    w = staged_world()

    w.step(0)
    assert kinds(w) == {"n1": "stage"}
    assert w.states()["n2"] == "pending"
    w.step(5)
    assert w.last.effects == ()  # n1 still downloading: nobody else starts

    w.fail("n1", error="digest_mismatch: expected 0f0f..., got abab...")
    w.step(10)
    assert w.hold() == "stage_failed"
    assert {n: s for n, s in w.states().items() if n != "n1"} == dict.fromkeys(
        ("n2", "n3", "n4", "n5", "n6"), "pending"
    )  # a digest typo cost one download, not two batches'


def test_a_failed_first_stage_under_observe_passes_the_turn_to_the_next_node_alone() -> None:
    w = staged_world(on_failure="observe")
    w.step(0)
    w.fail("n1", error="digest_mismatch: expected a, got b")
    w.step(10)

    assert kinds(w) == {"n2": "stage"}
    stage_all(w, "n2")
    w.step(20)
    assert kinds(w) == {"n2": "apply", "n3": "stage", "n4": "stage"}


def test_the_first_batches_are_staged_before_any_apply() -> None:
    w = staged_world()

    first_staged(w)
    w.step(5)

    assert kinds(w) == {"n2": "stage", "n3": "stage", "n4": "stage"}
    assert w.states() == {
        "n1": "staged",
        "n2": "staging",
        "n3": "staging",
        "n4": "staging",
        "n5": "pending",
        "n6": "pending",
    }
    job = w.job("n2")
    assert job.artifacts == (WEIGHTS,) and job.job_id.startswith("stage-")
    stage = w.node("n2").stage
    assert stage is not None and (stage.attempt, stage.state, stage.job_id) == (
        1,
        "staging",
        job.job_id,
    )


def test_a_batch_is_applied_once_every_node_in_it_is_staged_and_the_next_stages_meanwhile() -> None:
    w = staged_world()
    first_staged(w)
    w.step(10)
    assert w.state("n1") == "staged" and "n1" not in kinds(w)  # n2 still to stage

    stage_all(w, "n2")
    w.step(20)

    assert kinds(w) == {"n1": "apply", "n2": "apply"}
    apply = w.job("n1")
    assert apply.artifacts == (WEIGHTS,) and apply.attempt == 1
    assert apply.job_id != w.node("n1").stage.job_id  # type: ignore[union-attr]
    # batch 2 stages while batch 1 applies; batch 3 waits for batch 2's turn
    assert w.states()["n3"] == "staging" and w.states()["n5"] == "pending"

    w.succeed("n1")
    w.succeed("n2")
    w.step(30)
    assert w.states()["n1"] == "succeeded"
    assert kinds(w) == {"n5": "stage", "n6": "stage"}  # batch 2 now current: batch 3 is ahead
    assert w.states()["n3"] == "staging"  # batch 2 is not dispatched before it is staged

    stage_all(w, "n3", "n4")
    w.step(40)
    assert kinds(w) == {"n3": "apply", "n4": "apply"}


def test_never_more_than_max_concurrent_nodes_stage_at_once() -> None:
    w = staged_world(5, batch_size=5, stage=Stage(ahead=1, max_concurrent=2))

    first_staged(w)
    w.step(5)
    assert sorted(kinds(w)) == ["n2", "n3"]
    stage_all(w, "n2")
    w.step(10)

    assert kinds(w) == {"n4": "stage"}
    assert sum(1 for s in w.states().values() if s == "staging") == 2


def test_ahead_zero_stages_only_the_batch_about_to_be_applied() -> None:
    w = staged_world(4, stage=Stage(ahead=0, max_concurrent=10))

    first_staged(w)
    w.step(5)
    assert sorted(kinds(w)) == ["n2"]
    stage_all(w, "n2")
    w.step(10)
    assert kinds(w) == {"n1": "apply", "n2": "apply"}
    w.succeed("n1")
    w.succeed("n2")
    w.step(20)

    assert kinds(w) == {"n3": "stage", "n4": "stage"}


@pytest.mark.parametrize("policy", ["pause", "stop", "rollback"])
def test_a_failed_stage_holds_stage_failed_and_nothing_is_stopped_or_restored(policy: str) -> None:
    w = staged_world(live=True, on_failure=policy)
    first_staged(w)
    w.step(5)
    w.fail("n2", error="digest_mismatch: expected 0f0f..., got abab...")
    w.step(10)

    assert w.hold() == "stage_failed" and w.phase() == "paused"
    node = w.node("n2")
    assert (node.state, node.held, node.verdict) == ("failed", "stage_failed", None)
    assert "digest_mismatch" in node.error and node.stage.state == "failed"  # type: ignore[union-attr]
    assert "digest_mismatch" in (w.status().hold.message or "")  # type: ignore[union-attr]
    assert all(j.kind == "stage" for j in w.sent)  # no restore, no apply

    stage_all(w, "n3", "n4")
    w.step(20)
    assert w.last.effects == ()  # held: nothing new starts, the jobs in flight finished
    assert w.state("n3") == "staged"


def test_a_resume_stages_a_stage_failed_node_again_as_a_new_attempt() -> None:
    w = staged_world()
    w.step(0)
    first = w.fail("n1", error="insufficient_space: needed 10 bytes, free 5 bytes")
    w.step(10)
    w.resume()
    w.step(20)

    again = w.job("n1")
    assert again.kind == "stage" and again.attempt == 2 and again.job_id != first.job_id
    assert w.state("n1") == "staging" and w.hold() is None
    stage_all(w, "n1")
    w.step(25)
    stage_all(w, "n2")
    w.step(30)
    assert kinds(w) == {"n1": "apply", "n2": "apply"}


def test_retry_once_stages_once_more_then_holds() -> None:
    w = staged_world(on_failure="retry_once")
    w.step(0)
    w.fail("n1", error="download_failed: 404 Not Found")
    w.step(10)
    assert kinds(w) == {"n1": "stage"} and w.job("n1").attempt == 2 and w.hold() is None

    w.fail("n1", error="download_failed: 404 Not Found")
    w.step(20)

    assert w.hold() == "stage_failed" and w.node("n1").held == "stage_failed"


def test_observe_records_a_failed_stage_and_applies_the_rest_of_the_batch() -> None:
    w = staged_world(on_failure="observe")
    w.step(0)
    w.fail("n1", error="digest_mismatch: expected a, got b")
    w.step(5)
    stage_all(w, "n2")
    w.step(10)

    assert w.state("n1") == "failed" and w.hold() is None
    assert kinds(w)["n2"] == "apply"


def test_no_evidence_of_a_stage_is_unknown_and_holds_health_unknown() -> None:
    w = staged_world()
    w.step(0)
    w.go_offline("n1")
    w.step(500)

    assert w.state("n1") == "unknown" and w.hold() == "health_unknown"
    w.come_back("n1")
    w.resume()
    w.step(510)
    assert w.job("n1").kind == "stage" and w.state("n1") == "staging"


def test_a_node_not_staged_within_the_stage_timeout_fails() -> None:
    w = staged_world(stage=Stage(ahead=1, max_concurrent=10, timeout_seconds=600))
    w.step(0)
    assert next_wakeup([w.status()]) == w.at(600)

    w.step(600)

    node = w.node("n1")
    assert node.state == "failed" and "stage_timeout" in node.error
    assert w.hold() == "stage_failed"


def test_stage_jobs_in_flight_are_rebuilt_from_status_with_the_same_payload() -> None:
    w = staged_world()
    w.step(0)
    sent = {j.job_id: j for j in w.last.effects}

    rebuilt = {j.job_id: j for j in in_flight([w.status()])}

    assert rebuilt == sent


def test_a_live_apply_carries_drain_and_warmup() -> None:
    drain = Drain(300, "http://127.0.0.1:8000/metrics", "inflight", 0)
    warm = (Warmup("http://127.0.0.1:8000/v1/completions", "POST", "{}", 200, 60, 2),)
    w = staged_world(2, batch_size=1, live=True, drain=drain, warmup=warm)
    w.step(0)
    stage_all(w, "n1")
    w.step(10)

    apply = w.job("n1")
    assert (apply.kind, apply.drain, apply.warmup) == ("apply", drain, warm)


def test_skip_nodes_settles_a_node_that_could_not_be_staged() -> None:
    w = staged_world()
    first_staged(w)
    w.step(5)
    w.fail("n2", error="download_failed: connection refused")
    w.step(10)
    w.edit(skip_nodes=["n2"])
    w.step(20)

    assert w.state("n2") == "skipped" and kinds(w) == {"n1": "apply"}


def test_the_stage_table_has_one_decision_per_verdict_and_policy() -> None:
    assert decide("rollback", "failed", auto_retried=False).hold == "stage_failed"
    assert decide("retry_once", "failed", auto_retried=False).action == "restage"
    assert decide("retry_once", "failed", auto_retried=True).hold == "stage_failed"
    assert decide("stop", "unknown", auto_retried=False).hold == "health_unknown"
    assert decide("observe", "unknown", auto_retried=False).action == "continue"
    assert not any(r.decision.action in ("stop", "rollback") for r in STAGE_RULES)
    assert "| failed |" in render_stage_table()


PAGES = Health(soak=60, interval=1, alerts=Alerts(('severity="page"',)))
FLEET_WIDE = FiringAlert("GpuFleetHot", (("severity", "page"),), "2026-12-01T09:00:00Z")


def alerted_world() -> World:
    return staged_world(live=True, health=PAGES)


def test_a_fleet_wide_alert_starts_no_stage_job_until_it_resolves() -> None:
    w = alerted_world()
    w.alerts["r"] = AlertAnswer(alerts=(FLEET_WIDE,))

    w.step(0)

    assert w.last.effects == () and set(w.states().values()) == {"pending"}
    waiting = w.status().waiting
    assert waiting is not None and waiting.reason == "alert_firing"
    assert waiting.alerts == (FLEET_WIDE,)

    w.alerts["r"] = AlertAnswer()  # silenced
    w.step(10)

    assert kinds(w) == {"n1": "stage"}
    assert w.status().waiting is None


def test_an_alert_while_a_batch_applies_stops_the_stages_ahead() -> None:
    w = staged_world(live=True, health=PAGES, stage=Stage(ahead=2, max_concurrent=2))
    w.alerts["r"] = AlertAnswer()
    first_staged(w)
    w.step(5)
    assert kinds(w) == {"n2": "stage", "n3": "stage"}
    stage_all(w, "n2", "n3")
    w.step(10)
    assert kinds(w) == {"n1": "apply", "n2": "apply", "n4": "stage", "n5": "stage"}
    stage_all(w, "n4", "n5")
    w.alerts["r"] = AlertAnswer(alerts=(FLEET_WIDE,))

    w.step(20)  # two stage slots free, batch 3 in the window

    assert w.last.effects == () and w.state("n6") == "pending"
    waiting = w.status().waiting
    assert waiting is not None and waiting.reason == "alert_firing"

    w.alerts["r"] = AlertAnswer()
    w.step(30)
    assert kinds(w) == {"n6": "stage"}


def test_alertmanager_unreachable_starts_no_stage_job() -> None:
    w = alerted_world()
    w.alerts["r"] = AlertAnswer(error="cannot reach http://127.0.0.1:9093: refused")

    w.step(0)

    assert w.last.effects == ()
    waiting = w.status().waiting
    assert waiting is not None and waiting.reason == "alertmanager_unreachable"

    del w.alerts["r"]  # not asked at all: the same, no evidence
    w.step(10)
    assert w.last.effects == ()

    w.alerts["r"] = AlertAnswer()
    w.step(20)
    assert set(kinds(w).values()) == {"stage"}


def test_a_stage_job_carries_the_stage_timeout_when_it_is_not_the_default() -> None:
    shorter = staged_world(stage=Stage(ahead=1, max_concurrent=10, timeout_seconds=600))
    shorter.step(0)
    default = staged_world()
    default.step(0)

    assert shorter.job("n1").stage_timeout == 600  # the agent ends its downloads within it
    assert default.job("n1").stage_timeout is None  # the payload agents of version 3 accept


SIGNATURE = Artifact("signature", "https://mirror.example/m.sig", "5e" * 32, 2304)
RELEASE = ModelSigner("ml-release", "-----BEGIN PUBLIC KEY-----\n...\n", ("llama-*",))


def test_a_signed_stage_records_who_vouched_and_carries_the_frozen_keys() -> None:
    w = staged_world(signature=SIGNATURE, signers=(RELEASE,))
    w.step(0)
    job = w.job("n1")
    assert (job.signature, job.signers) == (SIGNATURE, (RELEASE,))
    w.answer(job, "succeeded", signature={"signer": "ml-release", "sha256": "5e" * 32})
    w.step(10)

    stage = w.node("n1").stage
    assert stage is not None and stage.state == "staged"
    assert stage.signature == Vouched("ml-release", "5e" * 32)
    assert w.job("n1").kind == "stage"  # n2 still staging: no apply yet


@pytest.mark.parametrize(
    "said",
    [None, {"signer": "ml-release", "sha256": "ab" * 32}],
    ids=["no signature", "another signature"],
)
def test_a_signed_stage_that_succeeded_without_vouching_for_this_signature_fails(
    said: dict[str, str] | None,
) -> None:
    """An agent that staged without checking (or checked another file) must
    not let a signed target through."""
    w = staged_world(live=True, signature=SIGNATURE, signers=(RELEASE,))
    w.step(0)
    w.answer(w.job("n1"), "succeeded", signature=said)
    w.step(10)

    node = w.node("n1")
    assert w.hold() == "stage_failed"
    assert node.state == "failed" and "signature_invalid" in node.error
