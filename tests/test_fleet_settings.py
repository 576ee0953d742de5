"""``spec.fleetCheck.interval`` in reconciler.yaml and the reserved rollout
name ``fleet`` (docs/operating.md)."""

from __future__ import annotations

import pytest

from reconciler.spec.documents import parse_file
from tests.kit.documents import rollout_yaml


def settings(spec: str) -> bytes:
    return f"apiVersion: reconciler/v1\nkind: Settings\nspec:\n{spec}".encode()


@pytest.mark.parametrize(
    ("spec", "seconds"),
    [
        ("  offlineAfter: 2m\n", 60),  # omitted: the default, 1m
        ("  fleetCheck: {interval: 30s}\n", 30),
        ("  fleetCheck: {interval: 0s}\n", 0),  # off
        ("  fleetCheck: {interval: 0m}\n", 0),
        ("  fleetCheck: {}\n", 60),
    ],
)
def test_fleet_check_interval(spec: str, seconds: int) -> None:
    parsed = parse_file("reconciler.yaml", settings(spec))
    assert parsed.problems == ()
    assert parsed.settings is not None
    assert parsed.settings.fleet_check_interval == seconds


def test_a_bad_interval_names_the_field_and_the_fix() -> None:
    parsed = parse_file("reconciler.yaml", settings("  fleetCheck: {interval: soon}\n"))
    (problem,) = parsed.problems
    assert problem.field == "spec.fleetCheck.interval"
    assert "such as 90s, 5m or 1h30m" in problem.message


def test_a_rollout_named_fleet_is_refused_since_its_status_would_be_the_fleet_file() -> None:
    parsed = parse_file("rollouts/fleet.yaml", rollout_yaml("fleet").encode())
    assert parsed.rollout is None
    assert any(
        "'fleet' is reserved" in p.message and "status/fleet.yaml" in p.message
        for p in parsed.problems
    )
