"""What a runtime's config holds: parsed from its bytes, described as a
change, and remembered per runtime so that the bytes the last job wrote are
parsed once.

Must not: write configs (``state_dir`` does), or decide what goes in them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from reconciler.spec.safe_yaml import YamlProblem, load_yaml

TARGET_FIELDS = ("provider", "model", "profile")


class JobFailed(Exception):
    """Ends a job as failed with this message (and ``detail``)."""

    def __init__(
        self,
        message: str,
        detail: str = "",
        timings: dict[str, str | None] | None = None,
        evals: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail
        self.timings = timings  # of a live switch that got under way
        self.evals = evals  # the results of a live apply's evals, when it ran them


def parse_config(runtime: str, data: bytes) -> dict[str, Any]:
    try:
        value = load_yaml(f"runtimes/{runtime}.yaml", data)
    except YamlProblem as exc:
        raise JobFailed(
            f"the current config is not valid YAML ({exc.problem}); fix or remove it"
        ) from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise JobFailed(f"the current config runtimes/{runtime}.yaml is not a YAML mapping")
    return value


def describe_change(before: Mapping[str, Any] | None, target: Mapping[str, str]) -> str:
    if before is None:
        return "create the config with " + ", ".join(f"{k} {target[k]}" for k in TARGET_FIELDS)
    changes = [
        f"{k} {before.get(k)} -> {target[k]}" for k in TARGET_FIELDS if before.get(k) != target[k]
    ]
    return "change " + ", ".join(changes) if changes else ""


class ParsedConfigs:
    """runtime -> the config bytes last parsed and what they hold (read
    only): the heartbeat and the next job read the config the last job
    wrote, so it is parsed once, not at every read. Each entry is replaced
    whole, from either thread."""

    def __init__(self) -> None:
        self._parsed: dict[str, tuple[bytes, Mapping[str, Any]]] = {}

    def values(self, runtime: str, data: bytes) -> Mapping[str, Any]:
        """``parse_config`` of the runtime's config bytes ``data``."""
        known = self._parsed.get(runtime)
        if known is not None and known[0] == data:
            return known[1]
        values = MappingProxyType(parse_config(runtime, data))
        self._parsed[runtime] = (data, values)
        return values
