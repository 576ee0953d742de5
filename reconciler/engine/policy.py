"""The failure policy: one verdict on one node -> one decision (docs/rollouts.md), as a table a reader can check line by line.

``decide`` is pure and total: every (policy, verdict) pair has exactly one
row whose condition holds. The engine records the decision in status before
anything is executed; this module only says what the decision is. It must not
import anything with side effects, nor know about status files.
"""

from __future__ import annotations

from dataclasses import dataclass

from reconciler.spec.model import ON_FAILURE_MODES

POLICIES = ON_FAILURE_MODES  # observe | pause | retry_once | stop | rollback
VERDICTS = ("passed", "failed", "unknown")
ACTIONS = ("next", "continue", "hold", "retry", "stop", "rollback")

ANY = "*"

# Conditions a row may depend on, each a yes/no fact about the node:
ALWAYS = "always"
FIRST_FAILURE = "the node was never retried automatically in this rollout"
RETRIED_BEFORE = "the node was already retried automatically in this rollout"
BACKUP = "a backup of the node's first apply exists"
NO_BACKUP = "no backup to restore (dry-run, or the node had no config)"


@dataclass(frozen=True)
class Decision:
    """``action``: what happens to the node; ``hold``: the hold it opens
    (None: no hold)."""

    action: str
    hold: str | None = None


@dataclass(frozen=True)
class Rule:
    verdict: str
    policy: str  # a policy name, or ANY
    when: str  # one of the conditions above
    decision: Decision
    says: str  # the table cell, as docs/rollouts.md words it


# docs/rollouts.md, row by row. The first rule whose verdict, policy and
# condition match is the decision; `test_policy` checks that exactly one does.
RULES: tuple[Rule, ...] = (
    Rule("passed", ANY, ALWAYS, Decision("next"), "next"),
    Rule("failed", "observe", ALWAYS, Decision("continue"), "record, continue"),
    Rule("failed", "pause", ALWAYS, Decision("hold", "health_failed"), "hold `health_failed`"),
    Rule(
        "failed",
        "retry_once",
        FIRST_FAILURE,
        Decision("retry"),
        "node's first failure in this rollout: send it again as the next attempt",
    ),
    Rule(
        "failed",
        "retry_once",
        RETRIED_BEFORE,
        Decision("hold", "retry_exhausted"),
        "after that: hold `retry_exhausted`",
    ),
    Rule("failed", "stop", ALWAYS, Decision("stop", "stopped"), "node `stopped`, hold `stopped`"),
    Rule(
        "failed",
        "rollback",
        BACKUP,
        Decision("rollback", "rollback_pending"),
        "node `rollback_pending`, hold `rollback_pending`, send a restore job; "
        "then `rolled_back` + hold `rolled_back`, or `rollback_failed` + hold `rollback_failed`",
    ),
    Rule(
        "failed",
        "rollback",
        NO_BACKUP,
        Decision("hold", "rollback_unavailable"),
        "no backup to restore (dry-run, or a node that had no config): hold `rollback_unavailable`",
    ),
    Rule("unknown", "observe", ALWAYS, Decision("continue"), "record, continue"),
    Rule("unknown", "pause", ALWAYS, Decision("hold", "health_unknown"), "hold `health_unknown`"),
    Rule(
        "unknown", "retry_once", ALWAYS, Decision("hold", "health_unknown"), "hold `health_unknown`"
    ),
    Rule("unknown", "stop", ALWAYS, Decision("hold", "health_unknown"), "hold `health_unknown`"),
    Rule(
        "unknown", "rollback", ALWAYS, Decision("hold", "health_unknown"), "hold `health_unknown`"
    ),
)


def _holds(when: str, auto_retried: bool, backup_available: bool) -> bool:
    if when == ALWAYS:
        return True
    if when == FIRST_FAILURE:
        return not auto_retried
    if when == RETRIED_BEFORE:
        return auto_retried
    if when == BACKUP:
        return backup_available
    if when == NO_BACKUP:
        return not backup_available
    raise ValueError(f"unknown condition {when!r}")


def matching_rules(
    policy: str, verdict: str, *, auto_retried: bool, backup_available: bool
) -> tuple[Rule, ...]:
    return tuple(
        rule
        for rule in RULES
        if rule.verdict == verdict
        and rule.policy in (policy, ANY)
        and _holds(rule.when, auto_retried, backup_available)
    )


def decide(policy: str, verdict: str, *, auto_retried: bool, backup_available: bool) -> Decision:
    """The decision for one node's verdict on its current attempt.

    ``auto_retried``: the node already had its automatic retry in this
    rollout. ``backup_available``: a backup of the node's first apply of this
    rollout exists (live only; never on a dry-run).
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown failure policy {policy!r}; expected one of {POLICIES}")
    if verdict not in VERDICTS:
        raise ValueError(f"unknown verdict {verdict!r}; expected one of {VERDICTS}")
    rules = matching_rules(
        policy, verdict, auto_retried=auto_retried, backup_available=backup_available
    )
    return rules[0].decision


def render_policy_table() -> str:
    """The policy table in Markdown, built from ``RULES`` (verdict rows,
    policy columns, as in docs/rollouts.md)."""
    header = "| verdict | " + " | ".join(f"{p} (default)" if p == "pause" else p for p in POLICIES)
    lines = [header + " |", "|---" * (len(POLICIES) + 1) + "|"]
    for verdict in VERDICTS:
        cells = []
        for policy in POLICIES:
            rules = [r for r in RULES if r.verdict == verdict and r.policy in (policy, ANY)]
            cells.append("; ".join(r.says for r in rules))
        lines.append(f"| {verdict} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
