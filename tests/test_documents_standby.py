"""spec.standby in rollout files: it becomes a frozen value, its default is
filled, it round-trips through the status record, and a rollout that is not
live is refused with file, line, field and what to do."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from reconciler.spec import schemas
from reconciler.spec.documents import parse_file
from reconciler.spec.rollout_status import (
    NodeRecord,
    RestoreRecord,
    RolloutStatus,
    StandbyRecord,
    freeze,
    from_record,
    frozen_changes,
    to_record,
)
from tests.engine_world import T0

HEAD = """\
apiVersion: reconciler/v1
kind: Rollout
metadata: {name: llama}
spec:
  selector: {role: canary}
  target: {runtime: hermes, provider: ollama, model: llama3.1-8b}
"""


def parse(body: str) -> tuple[object, list[str]]:
    parsed = parse_file("rollouts/llama.yaml", (HEAD + body).encode())
    return parsed.rollout, [str(p) for p in parsed.problems]


def test_standby_becomes_its_keep_previous_with_the_default_filled() -> None:
    soaked, problems = parse("  live: true\n  standby: {keepPrevious: untilSoaked}\n")
    assert problems == [] and getattr(soaked, "standby", None) == "untilSoaked"
    default, problems = parse("  live: true\n  standby: {}\n")
    assert problems == [] and getattr(default, "standby", None) == "untilCompleted"
    none, problems = parse("  live: true\n")
    assert problems == [] and getattr(none, "standby", "?") is None


def test_standby_on_a_dry_run_is_refused_at_its_key() -> None:
    _, problems = parse("  standby: {keepPrevious: untilSoaked}\n")
    assert problems == [
        "rollouts/llama.yaml:7:3: spec.standby: standby needs live: true: a dry run starts "
        "no slot on the node, so there is no previous slot to keep warm; set live: true, "
        "or remove standby"
    ]
    _, problems = parse("  live: false\n  standby: {}\n")
    assert len(problems) == 1 and problems[0].startswith("rollouts/llama.yaml:8:3: spec.standby")


SLOT_URLS = """\
  warmup: [{http: {url: "http://127.0.0.1:{slotPort}/v1/models"}}]
  health: {evals: [{name: golden, suite: golden, url: "http://127.0.0.1:{slotPort}"}]}
"""


def test_slot_port_in_warmup_and_eval_urls_is_read_as_the_port_with_standby() -> None:
    rollout, problems = parse("  live: true\n  standby: {}\n" + SLOT_URLS)
    assert problems == []
    [warmup] = getattr(rollout, "warmup", ())
    assert warmup.url == "http://127.0.0.1:{slotPort}/v1/models"  # the agent fills it in


def test_slot_port_without_standby_is_refused_at_each_url() -> None:
    _, problems = parse("  live: true\n" + SLOT_URLS)
    what = (
        "{slotPort} is the port of the slot a standby apply starts, and only a rollout "
        "with standby starts one: set standby, or write the port: "
    )
    assert problems == [
        f"rollouts/llama.yaml:8:25: spec.warmup[0].http.url: {what}"
        "'http://127.0.0.1:{slotPort}/v1/models'",
        f"rollouts/llama.yaml:9:55: spec.health.evals[0].url: {what}"
        "'http://127.0.0.1:{slotPort}'",
    ]


def test_the_rollout_on_the_standby_page_is_valid() -> None:
    page = (Path(__file__).parent.parent / "docs/standby.md").read_text()
    [example] = [b for b in page.split("```yaml\n")[1:] if b.startswith("spec:\n")]
    body = example.split("```")[0].removeprefix("spec:\n")
    rollout, problems = parse(body)
    assert problems == []
    [warmup] = getattr(rollout, "warmup", ())
    assert warmup.url == "http://127.0.0.1:{slotPort}/health"


def test_a_keep_previous_that_is_not_one_of_the_two_is_refused() -> None:
    _, problems = parse("  live: true\n  standby: {keepPrevious: forever}\n")
    assert len(problems) == 1
    assert problems[0].startswith("rollouts/llama.yaml:8:27: spec.standby.keepPrevious: must be")


def test_standby_is_frozen_and_round_trips_through_the_status_record() -> None:
    spec, _ = parse("  live: true\n  standby: {keepPrevious: untilSoaked}\n")
    frozen = freeze(spec)  # type: ignore[arg-type]
    assert frozen.standby == "untilSoaked"
    assert frozen_changes(frozen, replace(spec, standby="untilCompleted")) == ["standby"]  # type: ignore[type-var]
    node = NodeRecord(
        name="n1",
        batch=1,
        state="rolled_back",
        attempt=1,
        timings={
            "drainStartedAt": None,
            "drainedAt": None,
            "activatedAt": "x",
            "warmedAt": "x",
            "servingAt": "y",
            "routedAt": "y",
        },
        out_of_service=0,
        standby=StandbyRecord(
            slot="a", release_job_id="release-" + "0" * 32, release_deadline=T0, released_at=T0
        ),
        restore=RestoreRecord(
            request="policy",
            job_id="restore-" + "1" * 32,
            backup_id="bk",
            attempt=1,
            source_commit="a" * 40,
            dispatched_at=T0,
            deadline=T0,
            finished_at=T0,
            timings={"routedAt": "2026-12-01T09:00:00Z"},
        ),
    )
    status = RolloutStatus(name="llama", spec_commit="a" * 40, frozen=frozen, nodes=(node,))
    record = to_record(status)
    schemas.validator("rollout-status").validate(record)
    assert record["frozen"]["standby"] == {"keepPrevious": "untilSoaked"}
    assert record["nodes"][0]["standby"]["slot"] == "a"
    assert record["nodes"][0]["timings"]["routedAt"] == "y"
    assert record["nodes"][0]["restore"]["timings"] == {"routedAt": "2026-12-01T09:00:00Z"}
    assert from_record(record) == status
    plain = to_record(replace(status, frozen=replace(frozen, standby=None), nodes=()))
    assert "standby" not in plain["frozen"]
