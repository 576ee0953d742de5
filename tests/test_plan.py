"""``reconciler plan`` on pairs of real commits: each kind of change shows
up as the engine would act on it, the Markdown carries the facts a reviewer
needs, and invalid documents fail the check."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from reconciler.cli import main as cli
from reconciler.engine.step import RolloutInput, step_fleet
from reconciler.protocol.observations import JobObservation, Observations
from reconciler.spec.rollout_status import RolloutStatus
from reconciler.text import plan
from tests.kit.documents import make_status, node_yaml, status_text
from tests.kit.git import clone, commit, git, make_bare_repo, make_repo
from tests.markdown_render import plain_text


def earlier() -> datetime:
    """Statuses are made by the engine a minute before the test, so no
    deadline has passed (taken per test: the suite runs longer than a
    health timeout)."""
    return datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)


def rollout(name: str, selector: str, *, live: bool = True, extra: str = "") -> str:
    return (
        "apiVersion: reconciler/v1\n"
        "kind: Rollout\n"
        f"metadata: {{name: {name}}}\n"
        "spec:\n"
        "  target: {runtime: hermes, provider: ollama, model: llama3.1-8b}\n"
        f"  selector: {selector}\n"
        "  batchSize: 1\n"
        f"  live: {'true' if live else 'false'}\n"
        f"{extra}"
    )


NODES = {
    "nodes/gpu-a1.yaml": node_yaml("gpu-a1", labels="{role: canary}", maintenance=None),
    "nodes/gpu-a2.yaml": node_yaml("gpu-a2", labels="{role: canary}", maintenance=None),
    **{
        f"nodes/gpu-b{i}.yaml": node_yaml(f"gpu-b{i}", labels="{role: wide}", maintenance=None)
        for i in range(1, 6)
    },
}
CANARY = rollout("canary", "{role: canary}")


def engine_statuses(
    root: Path,
    previous: dict[str, RolloutStatus] | None = None,
    observations: Observations | None = None,
) -> dict[str, RolloutStatus]:
    """Step the working tree's rollouts through the engine, as the daemon would."""
    files = {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*.yaml")
        if ".git" not in p.parts
    }
    docs = plan.parse_tree(files)
    previous = previous or {}
    inputs = [
        RolloutInput(
            name=name,
            spec=spec,
            file_present=True,
            problems=(),
            status=previous.get(name),
            spec_commit="c" * 40,
            first_seen_commit="c" * 40,
            queue_key=0,
        )
        for name, spec in docs.rollouts.items()
    ]
    step = step_fleet(inputs, docs.fleet, docs.settings, observations or Observations(), earlier())
    return {**previous, **step.statuses}


def status_files(statuses: dict[str, RolloutStatus]) -> dict[str, str]:
    return {p: t for s in statuses.values() for p, t in status_text(s).items()}


@pytest.fixture
def fleet(tmp_path: Path, identity: dict[str, str]) -> Path:
    """main: the canary rollout running, its first node dispatched; HEAD on a
    branch `change` that the tests edit."""
    root = make_repo(tmp_path / "fleet", {**NODES, "rollouts/canary.yaml": CANARY})
    commit(root, status_files(engine_statuses(root)), "status: canary running")
    git("checkout", "--quiet", "-b", "change", cwd=root)
    return root


def run_plan(
    fleet: Path, capsys: pytest.CaptureFixture[str], fmt: str = "json", *extra: str
) -> tuple[int, str]:
    code = cli.main(["plan", "--repo", str(fleet), "--format", fmt, *extra])
    return code, capsys.readouterr().out


def json_plan(fleet: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> Any:
    code, out = run_plan(fleet, capsys, "json", *extra)
    assert code == 0, out
    return json.loads(out)


# -- new rollouts ---------------------------------------------------------------------


def test_a_new_live_rollout_shows_its_batches_and_jobs_at_merge(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    commit(fleet, {"rollouts/wide.yaml": rollout("wide", "{role: wide}")}, "add wide")

    result = json_plan(fleet, capsys)

    [added] = result["added"]
    assert added["name"] == "wide"
    assert added["live"] is True
    assert added["phase"] == "running"
    assert added["batches"] == [["gpu-b1"], ["gpu-b2"], ["gpu-b3"], ["gpu-b4"], ["gpu-b5"]]
    assert added["jobs_at_merge"] == 1
    assert added["overlaps"] == []
    assert result["intents"] == [] and result["removed"] == [] and result["refused"] == []


def test_a_new_rollout_overlapping_a_running_one_waits(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    commit(
        fleet,
        {"rollouts/all-gpus.yaml": rollout("all-gpus", "{}", live=False)},
        "add all-gpus",
    )

    result = json_plan(fleet, capsys)

    [added] = result["added"]
    assert added["phase"] == "pending"
    assert added["reason"] == "overlap"
    assert added["jobs_at_merge"] == 0
    assert added["overlaps"] == [{"rollout": "canary", "nodes": ["gpu-a1", "gpu-a2"]}]
    assert len(added["batches"]) == 7


def test_a_scheduled_rollout_says_when_it_starts(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    later = '  startAt: "2099-01-01T09:00:00Z"\n'
    commit(fleet, {"rollouts/wide.yaml": rollout("wide", "{role: wide}", extra=later)}, "add")

    code, out = run_plan(fleet, capsys, "text")

    assert code == 0
    assert "starts at 2099-01-01T09:00:00Z" in out


# -- intents ------------------------------------------------------------------------


def test_abort_of_a_running_rollout(fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    commit(fleet, {"rollouts/canary.yaml": CANARY + "  abort: true\n"}, "abort canary")

    result = json_plan(fleet, capsys)

    [intent] = result["intents"]
    assert (intent["rollout"], intent["intent"]) == ("canary", "abort")
    assert "phase running -> aborted (aborted)" in intent["effects"]


def test_pause_holds_the_running_rollout(fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    commit(fleet, {"rollouts/canary.yaml": CANARY + "  paused: true\n"}, "pause canary")

    result = json_plan(fleet, capsys)

    [intent] = result["intents"]
    assert intent["intent"] == "pause"
    assert intent["change"] == "paused: false -> true"
    assert "hold none -> operator_paused" in intent["effects"]


def test_resume_answers_a_health_hold_and_dispatches_again(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # main: gpu-a1 failed its health check, the rollout holds health_failed
    git("checkout", "--quiet", "main", cwd=fleet)
    running = engine_statuses(fleet)
    job = running["canary"].nodes[0].job_id
    assert job is not None
    failed = Observations(jobs={job: JobObservation(job, "failed", error="exit 1")})
    held = engine_statuses(fleet, running, failed)
    assert held["canary"].hold is not None and held["canary"].hold.reason == "health_failed"
    commit(fleet, status_files(held), "status: canary holds")
    git("checkout", "--quiet", "-B", "change", cwd=fleet)
    resumed = CANARY + '  resumeRequest: "2026-12-01T09:00:00Z alice: fixed gpu-a1"\n'
    commit(fleet, {"rollouts/canary.yaml": resumed}, "resume canary")

    result = json_plan(fleet, capsys)

    [intent] = result["intents"]
    assert intent["intent"] == "resume"
    effects = " / ".join(intent["effects"])
    assert "gpu-a1: failed -> dispatched" in effects
    assert "phase paused -> running" in effects
    assert "1 job sent at merge" in effects
    # the headline says that the resume changes live nodes again
    assert intent["note"] == "sends 1 LIVE job again at merge"


def test_skip_and_rollback_requests(fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edited = CANARY + "  skipNodes: [gpu-a2]\n  rollbackRequest: {id: r1, nodes: all}\n"
    commit(fleet, {"rollouts/canary.yaml": edited}, "skip and roll back")

    result = json_plan(fleet, capsys)

    kinds = [i["intent"] for i in result["intents"]]
    assert kinds == ["skip", "rollback"]
    assert result["intents"][1]["change"] == "rollbackRequest r1: all"
    effects = " / ".join(result["intents"][0]["effects"])
    assert "gpu-a2: pending -> skipped" in effects
    # running and not held: the engine refuses the rollback, and says so
    [refusal] = result["refused"]
    assert refusal["type"] == "rollback_refused"
    assert "pause it first" in refusal["message"]


# -- refused and removed ----------------------------------------------------------------


def test_a_frozen_field_change_is_reported_as_refused(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    commit(
        fleet,
        {"rollouts/canary.yaml": CANARY.replace("batchSize: 1", "batchSize: 2")},
        "bigger batches",
    )

    result = json_plan(fleet, capsys)

    [refusal] = result["refused"]
    assert refusal["rollout"] == "canary"
    assert refusal["type"] == "frozen_fields_changed"
    assert "batchSize" in refusal["message"]


def test_removing_a_running_rollout_aborts_it(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    git("rm", "--quiet", "rollouts/canary.yaml", cwd=fleet)
    git("commit", "--quiet", "-m", "remove canary", cwd=fleet)

    result = json_plan(fleet, capsys)

    [removal] = result["removed"]
    assert removal["rollout"] == "canary"
    assert removal["phase"] == "running"
    assert "phase running -> aborted (spec_removed)" in removal["effects"]


def test_node_edits_are_listed(fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    maintenance = (
        node_yaml("gpu-b1", labels="{role: wide}", maintenance=None) + "  maintenance: true\n"
    )
    commit(
        fleet,
        {
            "nodes/gpu-b1.yaml": maintenance,
            "nodes/gpu-c1.yaml": node_yaml("gpu-c1", labels="{role: c}", maintenance=None),
        },
        "nodes",
    )

    result = json_plan(fleet, capsys)

    assert result["nodes"] == ["added gpu-c1", "changed gpu-b1: maintenance false -> true"]


# -- invalid documents ------------------------------------------------------------------


def test_invalid_documents_fail_the_plan_with_file_and_line(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = rollout("wide", "{role: wide}").replace("batchSize: 1", "batchSize: 0")
    commit(fleet, {"rollouts/wide.yaml": broken}, "broken")

    code, out = run_plan(fleet, capsys, "text")

    assert code == 1
    assert "INVALID" in out
    assert "rollouts/wide.yaml:7:" in out and "spec.batchSize" in out


# -- markdown and defaults ----------------------------------------------------------------


def test_markdown_puts_the_risky_facts_first(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    commit(
        fleet,
        {
            "rollouts/wide.yaml": rollout("wide", "{role: wide}"),
            "rollouts/all-gpus.yaml": rollout("all-gpus", "{}", live=False),
            "rollouts/canary.yaml": CANARY + "  paused: true\n",
        },
        "several changes",
    )

    code, out = run_plan(fleet, capsys, "markdown")

    assert code == 0
    assert out.startswith(plan.MARKER)
    # as a forge shows them
    bullets = [plain_text(line) for line in out.splitlines() if line.startswith("- ")]
    # live before dry-run, the overlap right after the rollout it concerns, then intents
    # what changes (the model), how much, how much at first, where it stops
    assert (
        "LIVE rollout wide: ollama/llama3.1-8b to 5 node(s) in 5 batch(es) of 1, "
        "first batch 1 node(s), 14% of the fleet, no pauseAfter" in bullets[0]
    )
    assert "dry-run rollout all-gpus: ollama/llama3.1-8b to 7 node(s)" in bullets[1]
    assert "overlap: all-gpus shares 2 node(s) with canary" in bullets[2]
    assert "overlap: all-gpus shares 5 node(s) with wide" in bullets[3]
    assert "pause canary: paused: false → true" in bullets[4]
    assert "<details><summary>wide: LIVE, 5 node(s)</summary>" in out
    assert "| 1 | gpu-b1 |" in out


def test_the_default_base_is_the_merge_base_with_main(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    commit(fleet, {"rollouts/wide.yaml": rollout("wide", "{role: wide}")}, "add wide")
    fork = git("merge-base", "HEAD", "main", cwd=fleet).strip()
    # main moves on meanwhile: its own changes are not part of this plan
    git("checkout", "--quiet", "main", cwd=fleet)
    commit(fleet, {"rollouts/other.yaml": rollout("other", "{role: c}")}, "other")
    git("checkout", "--quiet", "change", cwd=fleet)

    result = json_plan(fleet, capsys)

    assert result["base"] == fork
    assert [a["name"] for a in result["added"]] == ["wide"]
    assert json_plan(fleet, capsys, "--base", "main", "--head", "main")["added"] == []


def test_no_change_says_so(fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_plan(fleet, capsys, "markdown", "--base", "HEAD")
    assert code == 0
    assert "No rollout, node or settings changes." in out


# --- the plan as a pull-request comment (pure: make_plan on two trees) ----------


def _pure_plan(
    base: dict[str, str], head: dict[str, str], statuses: dict[str, RolloutStatus] | None = None
) -> plan.Plan:
    return plan.make_plan(
        plan.Tree("a" * 40, {p: t.encode() for p, t in base.items()}),
        plan.Tree("b" * 40, {p: t.encode() for p, t in head.items()}),
        statuses or {},
        now=earlier(),
    )


def test_the_headline_names_the_model_the_first_batch_share_and_pause_after() -> None:
    wide = rollout("wide", "{role: wide}", extra="  pauseAfter: [1, 3]\n").replace(
        "batchSize: 1", "batchSize: 2"
    )
    result = _pure_plan(NODES, {**NODES, "rollouts/wide.yaml": wide})

    [line] = plan.headline(result)
    assert line == (
        "LIVE rollout wide: ollama/llama3.1-8b to 5 node(s) in 3 batch(es) of 2, "
        "first batch 2 node(s), 29% of the fleet, pauseAfter [1, 3], onFailure pause; "
        "starts at merge"
    )
    assert line in plain_text(plan.render_markdown(result))


def test_a_rollout_matching_no_node_says_so() -> None:
    none = rollout("none", "{role: nothing}")
    page = plan.render_markdown(_pure_plan(NODES, {**NODES, "rollouts/none.yaml": none}))

    assert "No node matches." in page
    assert "| batch | nodes |" not in page
    assert "none: ollama/llama3.1-8b to no node matches" in plain_text(page)


def test_a_resume_on_a_completed_rollout_has_no_effect() -> None:
    done = make_status("canary", "completed", [("gpu-a1", 1, "succeeded")])
    resumed = CANARY + '  resumeRequest: "again"\n'
    base = {**NODES, "rollouts/canary.yaml": CANARY}
    result = _pure_plan(base, {**base, "rollouts/canary.yaml": resumed}, {"canary": done})

    [intent] = result.intents
    assert intent.effects == ("no effect: the rollout already completed",)
    assert plan.headline(result) == [
        'resume canary: resumeRequest: "again" (no effect: the rollout already completed)'
    ]


def test_nodes_in_maintenance_named_in_node_ids_are_listed_as_left_out() -> None:
    nodes = {
        **NODES,
        "nodes/gpu-b5.yaml": node_yaml("gpu-b5", labels="{role: wide}", maintenance=None)
        + "  maintenance: true\n",
    }
    picked = rollout("picked", "null", extra="  nodeIds: [gpu-b1, gpu-b5]\n").replace(
        "  selector: null\n", ""
    )
    result = _pure_plan(nodes, {**nodes, "rollouts/picked.yaml": picked})

    assert result.added[0].left_out == ("gpu-b5",)
    assert (
        "left out of picked: gpu-b5 is in maintenance; set includeMaintenance: true to include it"
        in plan.headline(result)
    )
    assert "left out: gpu-b5 is in maintenance" in plan.render_text(result)


# --- settings ------------------------------------------------------------------------

SETTINGS = "apiVersion: reconciler/v1\nkind: Settings\nspec:\n"


def settings_plan(
    fleet: Path, capsys: pytest.CaptureFixture[str], before: str, after: str
) -> tuple[Any, str, str]:
    """The json, text and markdown plans of a change of reconciler.yaml's
    spec from ``before`` to ``after`` (YAML under ``spec:``)."""
    commit(fleet, {"reconciler.yaml": SETTINGS + before}, "settings before")
    base = git("rev-parse", "HEAD", cwd=fleet)
    commit(fleet, {"reconciler.yaml": SETTINGS + after}, "settings after")
    outputs = [run_plan(fleet, capsys, f, "--base", base) for f in ("json", "text", "markdown")]
    assert [code for code, _ in outputs] == [0, 0, 0], outputs
    return json.loads(outputs[0][1]), outputs[1][1], outputs[2][1]


RECEIVER = "  notifications:\n    - {name: ops-chat, urlEnv: HOOK_OPS, format: slack}\n"


def test_a_new_notification_receiver_is_a_settings_change(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record, text, md = settings_plan(fleet, capsys, "  offlineAfter: 2m\n", RECEIVER)

    assert record["setting_changes"] == [
        {
            "field": "notifications.ops-chat",
            "before": None,
            "after": {
                "urlEnv": "HOOK_OPS",
                "format": "slack",
                "secretEnv": None,
                "events": [
                    "hold",
                    "completed",
                    "failed",
                    "aborted",
                    "rolled_back",
                    "node_offline",
                    "node_drift",
                ],
                "rollouts": [],
            },
        }
    ]
    line = "notification receiver ops-chat added: "
    assert line in text and "no rollout, node or settings changes" not in text
    assert '"urlEnv": "HOOK_OPS"' in text
    assert "settings: notification receiver ops-chat added" in plain_text(md)
    assert "No rollout, node or settings changes." not in md


@pytest.mark.parametrize(
    ("before", "after", "field", "old", "new", "words"),
    [
        (RECEIVER, "", "notifications.ops-chat", "any", None, "receiver ops-chat removed"),
        (
            RECEIVER,
            RECEIVER.replace("slack", "json"),
            "notifications.ops-chat",
            "any",
            "any",
            "receiver ops-chat changed: format slack -> json",
        ),
        ("", "  fleetCheck: {interval: 30s}\n", "fleetCheck.interval", "1m", "30s", None),
        (
            "",
            "  prometheus: {url: 'http://127.0.0.1:9090'}\n",
            "prometheus.url",
            None,
            "http://127.0.0.1:9090",
            "prometheus.url (none) -> http://127.0.0.1:9090",
        ),
        (
            "",
            "  approvalRules:\n    - {name: owners, settings: true, principals: [a@x], require: 1}\n",
            "approvalRules.owners",
            None,
            {"nodes": None, "settings": True, "principals": ["a@x"], "require": 1},
            "approval rule owners added",
        ),
        ("", "  offlineAfter: 5m\n", "offlineAfter", "2m", "5m", "offlineAfter 2m -> 5m"),
        ("", "  statusBranch: st\n", "statusBranch", None, "st", "statusBranch None -> st"),
        ("", "  defaults: {batchSize: 3}\n", "defaults.batchSize", 1, 3, "defaults changed"),
        (
            "",
            "  windows:\n    - {days: [mon], from: '09:00', to: '17:00', timezone: UTC}\n",
            "windows",
            [],
            [{"days": ["mon"], "from": "09:00", "to": "17:00", "timezone": "UTC"}],
            "deploy windows -> mon 09:00-17:00 UTC",
        ),
        (
            "",
            "  freezes:\n    - {from: '2030-01-01T00:00:00Z', to: '2030-01-02T00:00:00Z'}\n",
            "freezes",
            [],
            [{"from": "2030-01-01T00:00:00Z", "to": "2030-01-02T00:00:00Z", "reason": ""}],
            "freezes -> 2030-01-01T00:00:00Z to 2030-01-02T00:00:00Z",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) and "\n" not in v and v else None,
)
def test_every_setting_is_diffed_with_its_field_before_and_after(
    fleet: Path,
    capsys: pytest.CaptureFixture[str],
    before: str,
    after: str,
    field: str,
    old: Any,
    new: Any,
    words: str | None,
) -> None:
    record, text, _ = settings_plan(fleet, capsys, before or "  {}\n", after or "  {}\n")

    [change] = record["setting_changes"]
    assert change["field"] == field
    if old != "any":
        assert change["before"] == old
    if new != "any":
        assert change["after"] == new
    assert (words or field) in text


def test_every_setting_of_the_model_is_compared() -> None:
    """A setting added to the model and not to the comparison would be
    left out of every plan."""
    from dataclasses import fields

    from reconciler.spec.model import Settings
    from reconciler.text.settings_changes import FIELDS

    assert sorted(FIELDS) == sorted(f.name for f in fields(Settings))


def test_an_unpushed_commit_is_planned_against_the_upstream(
    tmp_path: Path, identity: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    bare = make_bare_repo(tmp_path, NODES)
    work = clone(bare, tmp_path / "work")
    pushed = git("rev-parse", "HEAD", cwd=work)
    commit(work, {"rollouts/wide.yaml": rollout("wide", "{role: wide}")}, "add wide")

    result = json_plan(work, capsys)

    assert result["base"] == pushed
    assert [a["name"] for a in result["added"]] == ["wide"]
