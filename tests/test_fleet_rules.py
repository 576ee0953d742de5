"""The fleet watch's rules (docs/operating.md), pure: the state table,
the desired state from rollout statuses, one sweep to the next fleet
status, and the events a notifier reads from it."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from reconciler.engine.fleet import (
    KEEP,
    RULES,
    NodeFacts,
    NodeSighting,
    decide,
    desired_state,
    fleet_changes,
    fleet_events,
    next_fleet,
)
from reconciler.protocol.observations import Heartbeat, RuntimeReport
from reconciler.readers.fleet_reader import FleetReader, read_fleet_status
from reconciler.spec import schemas
from reconciler.spec.fleet_status import (
    FLEET_PAGE_SIZE,
    FLEET_STATES,
    DesiredRuntime,
    FleetNode,
    FleetRuntime,
    FleetStatus,
    fleet_from_record,
    fleet_to_files,
    fleet_to_record,
)
from reconciler.spec.model import Target
from reconciler.spec.rollout_status import FrozenSpec, NodeRecord, RolloutStatus
from reconciler.spec.safe_yaml import dump_yaml
from reconciler.text.fleet_text import fleet_dashboard_section, render_fleet_text

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
OFFLINE_AFTER = 120


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def rollout(
    name: str,
    model: str,
    nodes: dict[str, str],
    *,
    phase: str = "completed",
    live: bool = True,
    finished: float = 0,
    runtime: str = "hermes",
) -> RolloutStatus:
    target = Target(runtime=runtime, provider="ollama", model=model, profile="default")
    return RolloutStatus(
        name=name,
        phase=phase,
        frozen=FrozenSpec(target=target, batch_size=1, live=live, on_failure="pause"),
        finished_at=at(finished) if phase in ("completed", "failed", "aborted") else None,
        nodes=tuple(
            NodeRecord(name=n, batch=1, state=s, attempt=1, finished_at=at(finished))
            for n, s in nodes.items()
        ),
    )


def beat(node: str, model: str = "llama3.1-8b", runtime: str = "hermes") -> Heartbeat:
    return Heartbeat(
        node=node,
        time="2026-12-01T09:00:00Z",
        runtimes=(RuntimeReport(runtime, "ollama", model, "default"),),
    )


# --- the table ---------------------------------------------------------------------


def test_exactly_one_rule_applies_to_every_combination_of_facts() -> None:
    for answered, long, verified, drifted in itertools.product(
        (True, False), (True, False), (True, False, None), (True, False)
    ):
        facts = NodeFacts(answered, long and not answered, verified, drifted)
        assert sum(rule.applies(facts) for rule in RULES) == 1, facts


def test_every_state_is_decided_by_some_rule_and_each_rule_says_when() -> None:
    assert {rule.state for rule in RULES} == {*FLEET_STATES, KEEP}
    assert all(rule.when for rule in RULES)


@pytest.mark.parametrize(
    ("facts", "state"),
    [
        (NodeFacts(False, True, None, False), "offline"),
        (NodeFacts(False, False, None, False), KEEP),
        (NodeFacts(True, False, False, False), "unverified"),
        (NodeFacts(True, False, False, True), "unverified"),  # a forged answer proves no drift
        (NodeFacts(True, False, None, True), "drift"),
        (NodeFacts(True, False, True, True), "drift"),
        (NodeFacts(True, False, None, False), "ok"),
        (NodeFacts(True, False, True, False), "ok"),
    ],
)
def test_the_table_decides_as_section_14_says(facts: NodeFacts, state: str) -> None:
    assert decide(facts) == state


# --- desired state ---------------------------------------------------------------


def test_desired_is_the_newest_live_rollout_that_ended_with_the_node_succeeded() -> None:
    statuses = [
        rollout("old", "llama3-8b", {"a": "succeeded", "b": "succeeded"}, finished=10),
        rollout("new", "llama3.1-8b", {"a": "succeeded", "b": "failed"}, finished=20),
        rollout("dry", "mistral", {"a": "succeeded"}, live=False, finished=30),
        rollout("busy", "qwen", {"c": "dispatched"}, phase="running"),
    ]
    desired = desired_state(statuses)
    assert desired.desired[("a", "hermes")] == DesiredRuntime(
        "ollama", "llama3.1-8b", "default", "new"
    )
    # b failed in the newer rollout: it should still run what the older one set.
    assert desired.desired[("b", "hermes")].rollout == "old"
    assert ("c", "hermes") not in desired.desired
    assert desired.changing == {("c", "hermes")}


def test_a_node_rolled_back_falls_back_to_the_rollout_before() -> None:
    statuses = [
        rollout("old", "llama3-8b", {"a": "succeeded"}, finished=10),
        rollout("new", "llama3.1-8b", {"a": "rolled_back"}, finished=20, phase="failed"),
    ]
    assert desired_state(statuses).desired[("a", "hermes")].model == "llama3-8b"


# --- one sweep ---------------------------------------------------------------------


def test_a_node_no_rollout_touched_is_ok_with_no_desired_state() -> None:
    fleet = next_fleet(None, [NodeSighting("a", beat("a", "anything"))], desired_state([]), 120, T0)
    assert fleet.nodes == (
        FleetNode("a", "ok", T0, (FleetRuntime("hermes", "ollama", "anything", "default"),)),
    )


def test_a_changed_runtime_is_drift_naming_both_values_and_since_stays() -> None:
    desired = desired_state([rollout("r", "llama3.1-8b", {"a": "succeeded"})])
    first = next_fleet(None, [NodeSighting("a", beat("a"))], desired, OFFLINE_AFTER, at(0))
    assert first.by_name()["a"].state == "ok"
    drifted = next_fleet(
        first, [NodeSighting("a", beat("a", "hand-edited"))], desired, OFFLINE_AFTER, at(60)
    )
    node = drifted.by_name()["a"]
    assert (node.state, node.since) == ("drift", at(60))
    (change,) = fleet_changes(first, drifted)
    assert (change.from_state, change.to_state) == ("ok", "drift")
    assert change.detail == (
        "hermes runs ollama/hand-edited/default, desired ollama/llama3.1-8b/default (rollout r)"
    )
    again = next_fleet(
        drifted, [NodeSighting("a", beat("a", "hand-edited"))], desired, OFFLINE_AFTER, at(120)
    )
    assert again == drifted  # nothing to commit: no newer-heartbeat churn


def test_a_runtime_a_running_rollout_is_changing_is_not_drift() -> None:
    statuses = [
        rollout("r", "llama3.1-8b", {"a": "succeeded"}),
        rollout("next", "qwen", {"a": "dispatched"}, phase="running"),
    ]
    fleet = next_fleet(
        None, [NodeSighting("a", beat("a", "qwen"))], desired_state(statuses), 120, T0
    )
    assert fleet.by_name()["a"].state == "ok"


def test_a_runtime_that_is_no_longer_reported_is_drift() -> None:
    desired = desired_state([rollout("r", "llama3.1-8b", {"a": "succeeded"})])
    gone = Heartbeat(node="a", time="2026-12-01T09:00:00Z", runtimes=())
    node = next_fleet(None, [NodeSighting("a", gone)], desired, 120, T0).by_name()["a"]
    assert node.state == "drift"
    assert node.runtimes[0].provider is None


def test_unreachable_is_offline_only_after_offline_after_since_the_first_failure() -> None:
    desired = desired_state([])
    ok = next_fleet(None, [NodeSighting("a", beat("a"))], desired, OFFLINE_AFTER, at(0))
    still = next_fleet(ok, [NodeSighting("a", None, at(60))], desired, OFFLINE_AFTER, at(100))
    assert still == ok  # not long enough: the recorded state and runtimes stay
    gone = next_fleet(ok, [NodeSighting("a", None, at(60))], desired, OFFLINE_AFTER, at(180))
    node = gone.by_name()["a"]
    assert (node.state, node.since) == ("offline", at(60))
    assert node.runtimes == ok.by_name()["a"].runtimes  # as last reported
    back = next_fleet(gone, [NodeSighting("a", beat("a"))], desired, OFFLINE_AFTER, at(240))
    assert (back.by_name()["a"].state, back.by_name()["a"].since) == ("ok", at(240))


def test_a_node_never_seen_and_unreachable_is_listed_once_offline() -> None:
    desired = desired_state([])
    early = next_fleet(None, [NodeSighting("a", None, at(0))], desired, OFFLINE_AFTER, at(60))
    assert early.nodes == ()
    late = next_fleet(None, [NodeSighting("a", None, at(0))], desired, OFFLINE_AFTER, at(120))
    assert late.by_name()["a"].state == "offline"


def test_an_answer_failing_the_key_check_is_unverified() -> None:
    fleet = next_fleet(
        None, [NodeSighting("a", beat("a"), verified=False)], desired_state([]), 120, T0
    )
    assert fleet.by_name()["a"].state == "unverified"


def test_a_node_removed_from_nodes_leaves_the_fleet_status() -> None:
    two = next_fleet(
        None, [NodeSighting("a", beat("a")), NodeSighting("b", beat("b"))], desired_state([]), 1, T0
    )
    one = next_fleet(two, [NodeSighting("a", beat("a"))], desired_state([]), 1, at(60))
    assert [n.name for n in one.nodes] == ["a"]
    assert [(c.node, c.from_state, c.to_state) for c in fleet_changes(two, one)] == [
        ("b", "ok", None)
    ]


# --- events for notifications ---------------------------------------------------------


def test_fleet_events_are_keyed_by_node_state_and_since_from_status_alone() -> None:
    desired = desired_state([rollout("r", "llama3.1-8b", {"a": "succeeded"})])
    fleet = next_fleet(
        None,
        [
            NodeSighting("a", beat("a", "hand-edited")),
            NodeSighting("b", None, at(0)),
            NodeSighting("c", beat("c")),
        ],
        desired,
        OFFLINE_AFTER,
        at(300),
    )
    events = fleet_events(fleet)
    assert [(e.event, e.key) for e in events] == [
        ("node_drift", ("a", "drift", at(300).isoformat())),
        ("node_offline", ("b", "offline", at(0).isoformat())),
    ]
    assert "hand-edited" in events[0].message
    # Read back from its file, the same events with the same keys.
    reread = fleet_from_record(fleet_to_record(fleet))
    assert fleet_events(reread) == events


# --- the file and its views ----------------------------------------------------------


def test_the_record_matches_its_schema_and_reads_back_equal() -> None:
    desired = desired_state([rollout("r", "llama3.1-8b", {"a": "succeeded"})])
    fleet = next_fleet(
        None,
        [NodeSighting("a", beat("a", "x" * 300)), NodeSighting("b", beat("b"))],
        desired,
        OFFLINE_AFTER,
        T0,
    )
    record = fleet_to_record(fleet)
    assert schemas.fast_check("fleet-status")(record)
    assert read_fleet_status("status/fleet.yaml", dump_yaml(record)) == fleet


def test_a_file_that_is_not_a_fleet_status_is_refused_naming_the_field() -> None:
    bad = b"apiVersion: reconciler/v1\nkind: FleetStatus\nmetadata: {name: fleet}\nnodes: [{name: a, state: gone}]\n"
    with pytest.raises(ValueError, match=r"status/fleet.yaml: not a valid FleetStatus: nodes.0"):
        read_fleet_status("status/fleet.yaml", bad)


def test_the_dashboard_section_counts_states_and_lists_only_nodes_not_ok() -> None:
    desired = desired_state([rollout("r", "llama3.1-8b", {"a": "succeeded"})])
    fleet = next_fleet(
        None,
        [NodeSighting("a", beat("a", "hand-edited")), NodeSighting("b", beat("b"))],
        desired,
        OFFLINE_AFTER,
        T0,
    )
    section = fleet_dashboard_section(fleet)
    assert "2 nodes: 1 ok, 0 offline, 1 drift, 0 unverified" in section
    assert "| `a` |" in section and "| `b` |" not in section
    text = render_fleet_text(fleet)
    assert "hand-edited" in text and "llama3.1-8b" in text and "(r)" in text


def test_fleet_status_counts_every_state() -> None:
    assert FleetStatus().counts() == dict.fromkeys(FLEET_STATES, 0)


class Files:
    """A status source of plain files: blob ids are paths."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.data = files

    def files(self, commit: str, folder: str) -> dict[str, str]:
        return {p: p for p in self.data if p.rsplit("/", 1)[0] == folder and p.endswith(".yaml")}

    def blob(self, blob_id: str) -> bytes:
        return self.data[blob_id]


def test_a_large_fleet_is_paged_and_reads_back_equal_with_each_file_under_the_yaml_cap() -> None:
    count = FLEET_PAGE_SIZE * 2 + 10
    sightings = [NodeSighting(f"n{i:05d}", beat(f"n{i:05d}", "m" * 256)) for i in range(count)]
    fleet = next_fleet(None, sightings, desired_state([]), OFFLINE_AFTER, T0)
    files = {path: dump_yaml(record) for path, record in fleet_to_files(fleet).items()}
    assert sorted(files) == [
        "status/fleet.yaml",
        "status/fleet/nodes-0001.yaml",
        "status/fleet/nodes-0002.yaml",
        "status/fleet/nodes-0003.yaml",
    ]
    assert max(len(data) for data in files.values()) < 1024 * 1024
    assert FleetReader().read(Files(files), "tip") == fleet
    del files["status/fleet/nodes-0002.yaml"]
    with pytest.raises(ValueError, match=r"nodes-0002\.yaml is missing"):
        FleetReader().read(Files(files), "tip")


class Blobs(Files):
    """Files that name a file's blob directly, as the daemon's store does."""

    def file_blob(self, commit: str, path: str) -> str | None:
        return path if path in self.data else None


@pytest.mark.parametrize("count", [3, FLEET_PAGE_SIZE + 7])
def test_the_fleet_status_a_pass_wrote_is_kept_as_reading_it_back_gives(count: int) -> None:
    # After a pass commits status/fleet.yaml, the reader keeps the value it
    # wrote instead of parsing the file at the next pass: it must be the
    # value the files read back as (desired states, runtimes no longer
    # reported, times with and without fractions of a second).
    names = [f"n{i:05d}" for i in range(count)]
    first = next_fleet(
        None,
        [NodeSighting(n, beat(n)) for n in names],
        desired_state([rollout("llama", "llama3.1-8b", {names[0]: "succeeded"})]),
        OFFLINE_AFTER,
        T0,
    )
    fleet = next_fleet(
        first,
        [NodeSighting(n, beat(n, "other")) for n in names[1:]],
        desired_state([rollout("llama", "llama3.1-8b", {names[1]: "succeeded"})]),
        OFFLINE_AFTER,
        T0 + timedelta(seconds=OFFLINE_AFTER + 1, microseconds=250_000),
    )
    for value in (first, fleet):
        files = {path: dump_yaml(record) for path, record in fleet_to_files(value).items()}
        source = Blobs(files)
        reader = FleetReader()
        reader.remember(source, "tip", value)
        assert reader.read(source, "tip") is value
        assert FleetReader().read(source, "tip") == value
