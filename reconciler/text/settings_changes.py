"""What a change does to ``reconciler.yaml``: every setting, before and
after, as the document writes it (``plan``). Settings are compared as the
daemon reads them (defaults filled in), so only a change of meaning shows.

It compares values and words them; it reads no file and decides nothing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.spec.durations import format_duration
from reconciler.spec.model import ApprovalRule, Freeze, Receiver, Settings, Window
from reconciler.spec.settings_documents import DAY_NUMBERS
from reconciler.spec.times import format_time


@dataclass(frozen=True)
class SettingChange:
    """One setting that differs: ``field`` as the document names it under
    ``spec`` (``fleetCheck.interval``; ``notifications.NAME`` for one
    receiver), and its value before and after (None: not there)."""

    field: str
    before: Any
    after: Any


def _window(w: Window) -> dict[str, Any]:
    return {
        "days": [d for d, n in DAY_NUMBERS.items() if n in w.days],
        "from": f"{w.start // 60:02d}:{w.start % 60:02d}",
        "to": f"{w.end // 60:02d}:{w.end % 60:02d}",
        "timezone": w.timezone,
    }


def _freeze(f: Freeze) -> dict[str, Any]:
    return {"from": format_time(f.start), "to": format_time(f.end), "reason": f.reason}


def _receiver(r: Receiver) -> dict[str, Any]:
    return {
        "urlEnv": r.url_env,
        "format": r.format,
        "secretEnv": r.secret_env,
        "events": list(r.events),
        "rollouts": list(r.rollouts),
    }


def _key_digest(pem: str) -> str:
    return "sha256:" + hashlib.sha256(pem.strip().encode("utf-8")).hexdigest()[:16]


def _rule(r: ApprovalRule) -> dict[str, Any]:
    nodes: dict[str, Any] | None = None
    if r.selector is not None:
        nodes = {"selector": dict(r.selector)}
    elif r.node_ids is not None:
        nodes = {"nodeIds": list(r.node_ids)}
    return {
        "nodes": nodes,
        "settings": r.settings,
        "principals": list(r.principals),
        "require": r.require,
    }


# Settings attribute -> (document field, its value as the document writes it).
# A mapping value is compared key by key; NAMED fields entry by entry.
FIELDS: dict[str, tuple[str, Callable[[Settings], Any]]] = {
    "status_branch": ("statusBranch", lambda s: s.status_branch),
    "offline_after": ("offlineAfter", lambda s: format_duration(s.offline_after)),
    "defaults": (
        "defaults",
        lambda s: {
            "batchSize": s.defaults.batch_size,
            "healthTimeout": format_duration(s.defaults.health_timeout),
            "onFailure": s.defaults.on_failure,
        },
    ),
    "fleet_check_interval": (
        "fleetCheck",
        lambda s: {"interval": format_duration(s.fleet_check_interval)},
    ),
    "prometheus_url": ("prometheus", lambda s: {"url": s.prometheus_url}),
    "alertmanager_url": ("alertmanager", lambda s: {"url": s.alertmanager_url}),
    "windows": ("windows", lambda s: [_window(w) for w in s.windows]),
    "freezes": ("freezes", lambda s: [_freeze(f) for f in s.freezes]),
    "notifications": ("notifications", lambda s: {r.name: _receiver(r) for r in s.notifications}),
    "approval_rules": ("approvalRules", lambda s: {r.name: _rule(r) for r in s.approval_rules}),
    # A key is shown by its SHA-256, so a changed key is a changed value.
    "model_signers": (
        "modelSigners",
        lambda s: {
            m.name: {"models": list(m.models), "publicKey": _key_digest(m.public_key)}
            for m in s.model_signers
        },
    ),
}
NAMED = ("notifications", "approvalRules")


def settings_changes(old: Settings, new: Settings) -> list[SettingChange]:
    """Every setting that differs between ``old`` and ``new``, in the
    document's order."""
    changes: list[SettingChange] = []
    for name, value in FIELDS.values():
        before, after = value(old), value(new)
        if before == after:
            continue
        if isinstance(before, Mapping) and isinstance(after, Mapping):
            for key in [*before, *(k for k in after if k not in before)]:
                a, b = before.get(key), after.get(key)
                if a != b:
                    changes.append(SettingChange(f"{name}.{key}", a, b))
        else:
            changes.append(SettingChange(name, before, after))
    return changes


def change_words(change: SettingChange) -> str:
    """One line for a person: ``notification receiver ops added: ...``."""
    group, _, key = change.field.partition(".")
    if group in NAMED:
        what = "notification receiver" if group == "notifications" else "approval rule"
        if change.before is None:
            return f"{what} {key} added: {_shown(change.after)}"
        if change.after is None:
            return f"{what} {key} removed (was {_shown(change.before)})"
        parts = [
            f"{k} {_shown(change.before.get(k))} -> {_shown(v)}"
            for k, v in change.after.items()
            if change.before.get(k) != v
        ]
        return f"{what} {key} changed: {'; '.join(parts)}"
    return f"{change.field} {_shown(change.before)} -> {_shown(change.after)}"


def _shown(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, Mapping):
        value = {k: v for k, v in value.items() if v not in (None, [], "")}
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


__all__ = ["FIELDS", "SettingChange", "change_words", "settings_changes"]
