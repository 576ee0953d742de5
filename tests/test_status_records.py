"""Status values <-> plain data: lossless round trips, the schema, node pages
over 200 nodes, and the file diff the daemon writes from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from reconciler.spec.rollout_status import (
    PAGE_SIZE,
    RolloutStatus,
    changed_files,
    from_record,
    status_files,
    status_from_files,
    to_record,
)
from tests.engine_world import World

SCHEMA = json.loads(
    (Path(__file__).parent.parent / "schemas" / "rollout-status.schema.json").read_text()
)
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def assert_valid(data: dict[str, Any]) -> None:
    errors = sorted(VALIDATOR.iter_errors(data), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:5])


def rich_status() -> RolloutStatus:
    """A status with a hold, a restore, a rollback record, conditions, transitions."""
    w = World(["a", "b", "c"])
    w.rollout(batch_size=1, live=True, on_failure="rollback", pause_after=[2])
    w.step(0)
    w.succeed("a", backup_id="bk-a")
    w.heartbeat("a", at=w.at(1))
    w.step(5.5)
    w.fail("b", backup_id="bk-b")
    w.step(10)
    w.edit(batch_size=3)
    w.rollback(id="rb1", nodes=["a", "zz"])
    w.step(12)
    return w.status()


def test_every_field_survives_a_round_trip_through_plain_data() -> None:
    status = rich_status()
    assert status.hold is not None and status.rollbacks and status.conditions

    data = to_record(status)
    again = from_record(json.loads(json.dumps(data)))

    assert again == status
    assert_valid(data)


def test_records_use_the_documented_names() -> None:
    data = to_record(rich_status())

    assert data["kind"] == "RolloutStatus" and data["apiVersion"] == "reconciler/v1"
    node = data["nodes"][0]
    for key in (
        "name",
        "batch",
        "state",
        "attempt",
        "jobId",
        "dispatchedAt",
        "deadline",
        "finishedAt",
        "verdict",
        "error",
        "backupId",
        "firstBackupId",
        "autoRetried",
    ):
        assert key in node
    assert set(data["hold"]) == {"reason", "message", "nodes", "nodeCount", "since"}
    assert data["frozen"]["nodes"] == ["a", "b", "c"]
    assert data["transitions"][0].keys() == {"time", "from", "to", "reason", "commit"}


def test_the_schema_refuses_unknown_fields() -> None:
    data = to_record(rich_status())
    data["surprise"] = 1

    assert list(VALIDATOR.iter_errors(data))


def big_status(nodes: int) -> tuple[World, RolloutStatus]:
    w = World(nodes)
    w.rollout(batch_size=250)
    w.step(0)
    return w, w.status()


def test_over_200_nodes_records_move_to_pages_of_200_in_frozen_order() -> None:
    _, status = big_status(450)

    files = status_files(status)

    assert sorted(files) == [
        "status/r.yaml",
        "status/r/nodes-0001.yaml",
        "status/r/nodes-0002.yaml",
        "status/r/nodes-0003.yaml",
    ]
    main = files["status/r.yaml"]
    assert "nodes" not in main and main["nodePages"] == 3 and main["nodeCount"] == 450
    assert [len(files[p]["nodes"]) for p in sorted(files)[1:]] == [PAGE_SIZE, PAGE_SIZE, 50]
    assert files["status/r/nodes-0002.yaml"]["nodes"][0]["name"] == status.nodes[200].name
    for data in files.values():
        assert_valid(data)
    pages = {p: json.loads(json.dumps(d)) for p, d in files.items() if p != "status/r.yaml"}
    assert status_from_files(json.loads(json.dumps(main)), pages) == status


def test_200_nodes_or_fewer_stay_in_the_main_file() -> None:
    _, status = big_status(200)

    files = status_files(status)

    assert list(files) == ["status/r.yaml"]
    assert len(files["status/r.yaml"]["nodes"]) == 200
    assert status_from_files(files["status/r.yaml"], {}) == status


def test_a_missing_page_is_an_error_naming_it() -> None:
    _, status = big_status(450)
    files = status_files(status)
    del files["status/r/nodes-0002.yaml"]

    with pytest.raises(ValueError, match="nodes-0002"):
        status_from_files(files["status/r.yaml"], files)


def test_a_transition_rewrites_only_the_pages_it_touches() -> None:
    w, before = big_status(450)
    w.succeed(before.nodes[10].name)
    w.step(5)
    after = w.status()

    write, gone = changed_files(before, after)

    assert sorted(write) == ["status/r.yaml", "status/r/nodes-0001.yaml"]
    assert gone == ()


def test_an_unchanged_status_writes_nothing_and_a_new_one_writes_everything() -> None:
    _, status = big_status(450)

    assert changed_files(status, status) == ({}, ())
    write, _ = changed_files(None, status)
    assert len(write) == 4
