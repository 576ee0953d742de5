"""status NAME and the dashboard of a rollout with artifacts: the stage
state of each batch's nodes and its longest time out of service, and the
engine's records they are read from (timings from the signed job record)."""

from __future__ import annotations

from reconciler.daemon.agent_answers import job_observation
from reconciler.spec.artifacts import Artifact, Drain, Stage
from reconciler.text.dashboard import render_dashboard
from reconciler.text.status_text import render_detail
from tests.engine_world import World

WEIGHTS = Artifact("weights", "https://mirror.example/m.gguf", "0f" * 32, 3 * 1024**3)
DRAIN = Drain(120, "http://127.0.0.1:8000/metrics", "inflight", 0)


def timings(node: str, w: World, out: float) -> dict[str, str | None]:
    start = w.now.strftime("%Y-%m-%dT%H:%M:%S")
    end = f"{start}.{round(out * 1000):03d}Z" if out < 1 else None
    return {
        "drainStartedAt": f"{start}Z",
        "drainedAt": f"{start}Z",
        "activatedAt": f"{start}Z",
        "warmedAt": end,
        "servingAt": end,
    }


def applied_world() -> World:
    """Batch 1 (n1, n2) applied live with drain; batch 2 staging."""
    w = World(4)
    w.rollout(
        artifacts=(WEIGHTS,),
        stage=Stage(ahead=1, max_concurrent=3),
        batch_size=2,
        live=True,
        drain=DRAIN,
    )
    w.step(0)  # n1 stages alone until its digests matched
    w.succeed("n1")
    w.step(5)
    for n in ("n2", "n3"):
        w.succeed(n)
    w.step(10)  # batch 1 dispatched, n4 still staging
    for n, out in (("n1", 0.25), ("n2", 0.5)):
        job = w.job(n)
        w.answer(job, "succeeded", finished_at="2026-12-01T09:00:10Z", timings=timings(n, w, out))
        w.heartbeat(n, at=w.at(11))
    w.step(12)
    return w


def test_a_live_success_records_its_timings_and_time_out_of_service() -> None:
    w = applied_world()

    node = w.node("n2")
    assert node.state == "succeeded" and node.out_of_service == 0.5
    assert node.timings is not None and node.timings["drainStartedAt"] == "2026-12-01T09:00:10Z"


def test_status_shows_each_batchs_stage_states_and_longest_time_out_of_service() -> None:
    w = applied_world()

    text = render_detail(w.status(), w.now)

    assert "longest out of service 0.5 s" in text
    assert "1 staged, 1 staging" in text
    assert "artifacts weights (3.0 GiB)" in text
    assert "stage     1 batch(es) ahead, at most 3 at once, 1h per node" in text
    assert "drain     within 2m, until inflight at http://127.0.0.1:8000/metrics" in text


def test_the_dashboard_draws_them_in_each_batch_box() -> None:
    w = applied_world()

    page = render_dashboard({"r": w.status()})

    assert '["batch 1<br/>2/2 ok · done<br/>longest out of service 0.5 s"]' in page
    assert '["batch 2<br/>0/2 ok · pending<br/>1 staged, 1 staging"]' in page


def test_the_job_record_timings_are_read_and_bad_ones_are_no_answer() -> None:
    body = (
        b'{"jobId": "apply-1", "state": "succeeded", "timings": {"drainStartedAt": null, '
        b'"activatedAt": "2026-12-01T09:00:00Z", "servingAt": "2026-12-01T09:00:00.4Z"}}'
    )

    seen = job_observation("apply-1", body)

    assert seen.timings is not None and seen.timings["activatedAt"] == "2026-12-01T09:00:00Z"
    assert seen.timings["warmedAt"] is None
    try:
        job_observation("apply-1", b'{"jobId": "apply-1", "state": "succeeded", "timings": 5}')
    except Exception as exc:  # the daemon's Unreachable: an answer it cannot use
        assert "timings" in str(exc)
    else:
        raise AssertionError("a bad timings field was accepted")
