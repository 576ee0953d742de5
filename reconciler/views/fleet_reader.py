"""The one reader of ``status/fleet.yaml``, for the daemon and
``reconciler fleet``: safe YAML, the schema check, then the value.
Must not decide anything."""

from __future__ import annotations

from typing import Any

from jsonschema.exceptions import best_match  # type: ignore[import-untyped]

from reconciler.git.branch import Branch
from reconciler.spec import schemas
from reconciler.spec.fleet_status import FLEET_KIND, FleetStatus, fleet_from_record
from reconciler.spec.paths import FLEET_STATUS_PATH
from reconciler.spec.safe_yaml import load_yaml
from reconciler.views.status_reader import status_branch

FLEET_SCHEMA = "fleet-status"


def read_fleet_status(path: str, data: bytes) -> FleetStatus:
    """The one reader of ``status/fleet.yaml``: safe YAML, the schema check,
    then the value. ValueError (or ``YamlProblem``) naming the file and what
    is wrong when it is not a fleet status (a hand edit)."""
    record = load_yaml(path, data)
    if not isinstance(record, dict) or not schemas.fast_check(FLEET_SCHEMA)(record):
        raise ValueError(f"{path}: not a valid {FLEET_KIND}: {_schema_error(record)}")
    try:
        return fleet_from_record(record)
    except ValueError as exc:  # a time the pattern let through
        raise ValueError(f"{path}: {exc}") from None


def _schema_error(record: Any) -> str:
    error = best_match(schemas.validator(FLEET_SCHEMA).iter_errors(record))
    if error is None:
        return "does not match the fleet status schema"
    where = ".".join(str(p) for p in error.absolute_path)
    return f"{where}: {error.message}" if where else str(error.message)


def read_branch_fleet(source: Branch) -> tuple[str | None, FleetStatus | None]:
    """The fleet status committed on the branch's status branch (the tracked
    branch, or ``statusBranch``), and the commit read; None before the
    first sweep wrote one."""
    from reconciler.spec.errors import StoreError

    tip = source.refresh()
    if tip is None:
        raise StoreError(f"branch {source.branch!r} not found in {source.label}")
    other = status_branch(source, tip)
    commit = tip if other is None else source.tip(other)
    if commit is None:
        return None, None
    data = source.read(commit, FLEET_STATUS_PATH)
    return commit, None if data is None else read_fleet_status(FLEET_STATUS_PATH, data)


__all__ = ["read_branch_fleet", "read_fleet_status"]
