"""What an attestation's statement says, from status values alone
(docs/attestations.md): which nodes are its subject and with what digest,
the approvals, the predicate's schema, and that schema kept in step with
the status schema whose records it carries."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from reconciler.attestations.attestation import predicate_problem, statement_of, subjects_of
from reconciler.spec import schemas
from reconciler.spec.model import Target
from reconciler.spec.rollout_status import (
    ApprovalRecord,
    CheckOutcome,
    FrozenSpec,
    NodeEvidence,
    NodeRecord,
    RestoreRecord,
    RolloutStatus,
)

REPO = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((REPO / "schemas" / "deployment-attestation.schema.json").read_text())
STATUS_SCHEMA = json.loads((REPO / "schemas" / "rollout-status.schema.json").read_text())
AT = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
SPEC = "9d2bee0e738d46b8890c16d90cc3cbc8b8c505fa"
STATUS = "e1cc3b75a3b9500078362ff40b94e6f332ac36d0"
JOB = f"apply-{'0' * 32}"
DIGEST = "662e95a2820fc1a559b823754592bc8f1fe3f986064b62fdab55406cc055a53f"


def evidence(node: str, digest: str | None = DIGEST) -> NodeEvidence:
    beat = None
    if digest is not None:
        runtime = {"type": "hermes", "provider": "ollama", "model": "m", "profile": "default"}
        beat = {"node": node, "runtimes": [{**runtime, "configDigest": f"sha256:{digest}"}]}
    return NodeEvidence(
        key_id="SHA256:agent",
        job_record={"jobId": JOB, "state": "succeeded"},
        job_signature="c2ln",
        heartbeat=beat,
        heartbeat_signature=None if beat is None else "c2ln",
    )


def node(name: str, state: str = "succeeded", **fields: Any) -> NodeRecord:
    fields.setdefault("evidence", evidence(name))
    verdict = {"succeeded": "passed", "failed": "failed"}.get(state, "failed")
    return NodeRecord(
        name=name,
        batch=1,
        state=state,
        attempt=1,
        job_id=JOB,
        source_commit=SPEC,
        dispatched_at=AT,
        deadline=AT,
        finished_at=AT,
        verdict=verdict,
        **fields,
    )


def status(*nodes: NodeRecord, live: bool = True, **fields: Any) -> RolloutStatus:
    return RolloutStatus(
        name="r",
        phase="completed",
        spec_commit=SPEC,
        start_commit=SPEC,
        frozen=FrozenSpec(Target("hermes", "ollama", "m"), 1, live, "rollback"),
        started_at=AT,
        finished_at=AT,
        nodes=nodes,
        **fields,
    )


def test_the_subject_is_each_node_that_succeeded_on_signed_evidence() -> None:
    restore = RestoreRecord("policy", f"restore-{'1' * 32}", "b1", 1, SPEC, AT, AT, AT)
    statement = statement_of(
        status(
            node("a", checks=(CheckOutcome("http", True, "200"),)),
            node("b", "failed"),
            node("c", "rolled_back", restore=restore),
            node("d", evidence=None),  # a node without agentKey signs nothing
            node("e", evidence=evidence("e", digest=None)),  # no heartbeat, no digest
        ),
        STATUS,
    )

    assert statement["subject"] == [{"name": "a/hermes", "digest": {"sha256": DIGEST}}]
    assert [n["name"] for n in statement["predicate"]["nodes"]] == ["a", "b", "c", "d", "e"]
    jsonschema.Draft202012Validator(SCHEMA).validate(statement["predicate"])


def test_a_dry_run_has_no_subject() -> None:
    assert statement_of(status(node("a"), live=False), STATUS)["subject"] == []


def test_artifacts_are_the_subject_when_the_target_has_them() -> None:
    predicate = statement_of(status(node("a"), node("b", evidence=None)), STATUS)["predicate"]
    predicate["frozen"]["artifacts"] = [  # where status keeps them
        {"name": "weights", "url": "https://mirror.example/w", "sha256": "ab" * 32, "size": 9},
        {"name": "tokenizer", "url": "https://mirror.example/t", "sha256": "cd" * 32, "size": 1},
    ]

    assert subjects_of(predicate) == [
        {
            "name": "a/hermes",
            "digest": {"sha256": "ab" * 32},
            "annotations": {"artifact": "weights"},
        },
        {
            "name": "a/hermes",
            "digest": {"sha256": "cd" * 32},
            "annotations": {"artifact": "tokenizer"},
        },
    ]
    jsonschema.Draft202012Validator(SCHEMA).validate(predicate)


def test_approvals_carry_the_rules_they_counted_for() -> None:
    approved = status(node("a"), approved_by=(ApprovalRecord("alice@example.com", "SHA256:k"),))
    predicate = statement_of(approved, STATUS)["predicate"]
    assert predicate["approvals"] == [
        {"principal": "alice@example.com", "keyId": "SHA256:k", "rules": []}
    ]
    assert predicate["statusCommit"] == STATUS


def test_the_predicate_schema_refuses_what_is_not_a_finished_rollout() -> None:
    predicate = statement_of(status(node("a")), STATUS)["predicate"]
    validator = jsonschema.Draft202012Validator(SCHEMA)
    for path, value in [
        (("phase",), "running"),
        (("specCommit",), ""),
        (("nodes", 0, "evidence", "signatures"), None),
        (("surprise",), 1),
    ]:
        broken = copy.deepcopy(predicate)
        target: Any = broken
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
        assert not validator.is_valid(broken), path
        # The compiled check that spares jsonschema agrees, and puts it in words.
        assert not schemas.fast_check("deployment-attestation")(broken), path
        assert predicate_problem(broken), path
    assert schemas.fast_check("deployment-attestation")(predicate)
    assert predicate_problem(predicate) == ""


@pytest.mark.parametrize("name", ["name", "time", "jobId", "frozen", "node", "restore", "evidence"])
def test_the_records_it_carries_have_the_status_schemas_shape(name: str) -> None:
    # The predicate holds status records exactly: a change to their shape
    # in the status schema must be made here too.
    assert SCHEMA["$defs"][name] == STATUS_SCHEMA["$defs"][name]


def test_the_target_is_the_status_schemas_with_artifacts() -> None:
    ours = copy.deepcopy(SCHEMA["$defs"]["target"])
    assert ours["properties"].pop("artifacts")["items"] == {"$ref": "#/$defs/artifact"}
    assert ours == STATUS_SCHEMA["$defs"]["target"]


def _properties(node: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        found += list(node.get("properties", {}).values())
        for key, sub in node.items():
            if key not in ("enum", "const"):
                found += _properties(sub)
    elif isinstance(node, list):
        for sub in node:
            found += _properties(sub)
    return found


def test_the_schema_is_valid_2020_12_described_and_closed() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$id"] == "https://reconciler.invalid/schemas/deployment-attestation.schema.json"
    assert SCHEMA["additionalProperties"] is False
    own = {k: v for k, v in SCHEMA.items() if k != "$defs"}
    for sub in _properties(own) + _properties(SCHEMA["$defs"]["artifact"]):
        assert sub.get("description"), sub
        if sub.get("type") == "object" and "properties" in sub:
            assert sub.get("additionalProperties") is False, sub


def test_a_standby_rollouts_records_fit_the_predicate() -> None:
    from dataclasses import replace

    from reconciler.spec.rollout_status import StandbyRecord

    kept = StandbyRecord("a", f"release-{'2' * 32}", AT, AT)
    timings = {
        "drainStartedAt": None,
        "drainedAt": None,
        "activatedAt": "2026-12-01T09:00:01Z",
        "warmedAt": "2026-12-01T09:00:02Z",
        "servingAt": "2026-12-01T09:00:03Z",
        "routedAt": "2026-12-01T09:00:03Z",
    }
    restore = RestoreRecord(
        "policy", f"restore-{'1' * 32}", "b1", 1, SPEC, AT, AT, AT, timings={"routedAt": "x"}
    )
    rollout = status(
        node("a", standby=kept, timings=timings, out_of_service=0),
        node("b", "rolled_back", standby=kept, restore=restore),
    )
    frozen = rollout.frozen
    assert frozen is not None
    statement = statement_of(
        replace(rollout, frozen=replace(frozen, standby="untilSoaked")), STATUS
    )

    assert statement["predicate"]["frozen"]["standby"] == {"keepPrevious": "untilSoaked"}
    assert predicate_problem(statement["predicate"]) == ""
