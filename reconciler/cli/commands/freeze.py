"""``reconciler freeze|unfreeze``: stop every rollout's next batch at once,
or let them go on, by editing ``spec.freezes`` in ``reconciler.yaml``,
keeping its comments and layout; optionally commit (and push) the edit."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta

from reconciler.cli import freeze_edits, intent_push
from reconciler.cli.intent_verbs import finish, prepare
from reconciler.cli.remote_options import add_remote_arguments, add_repo_argument
from reconciler.spec.durations import parse_duration
from reconciler.spec.errors import UsageError
from reconciler.spec.times import format_time, parse_time

HELP = "stop new batches of every rollout: add a freeze starting now to reconciler.yaml"

HELP_BY_VERB = {
    "freeze": HELP,
    "unfreeze": "end every freeze in force now, so that rollouts go on",
}

# The settings schema's limit on a freeze's reason.
REASON_MAX = 200


def add_arguments_for(verb: str, parser: argparse.ArgumentParser) -> None:
    parser.description = HELP_BY_VERB[verb]
    if verb == "freeze":
        parser.add_argument(
            "--reason", required=True, metavar="TEXT", help="why, for people: shown while it waits"
        )
        until = parser.add_mutually_exclusive_group(required=True)
        until.add_argument(
            "--for", dest="lasting", metavar="DURATION", help="how long, such as 30m, 2h or 1h30m"
        )
        until.add_argument(
            "--until", metavar="TIME", help="when it ends, RFC 3339, such as 2026-12-24T18:00:00Z"
        )
    add_repo_argument(parser, "a working clone of the fleet repository: the edit is made there")
    parser.add_argument(
        "--commit", action="store_true", help="commit reconciler.yaml (git author: you)"
    )
    parser.add_argument(
        "--push",
        action="store_true",
        help="fetch first, commit and push to the branch this clone tracks; when the "
        "daemon (or anyone) pushed in between, replay the commit on the new tip and push "
        f"again, up to {intent_push.PUSH_TRIES} times. The edit touches only "
        "reconciler.yaml, which the daemon never writes",
    )
    add_remote_arguments(parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_arguments_for("freeze", parser)


def run(args: argparse.Namespace) -> int:
    now = datetime.now(UTC).replace(microsecond=0)
    if args.verb == "freeze":
        reason = _reason(args.reason)
        until = _until(args.lasting, args.until, now)
    root, up = prepare(args, "reconciler.yaml")
    if args.verb == "freeze":
        edit = freeze_edits.freeze(root, now=now, until=until, reason=reason)
        return finish(edit, reason, args.commit, up)
    edit = freeze_edits.unfreeze(root, now=now)
    return finish(edit, "", args.commit, up)


def _reason(text: str) -> str:
    reason = " ".join(text.split())
    if not reason:
        raise UsageError(
            "--reason is empty", "say why, for the people who see rollouts wait: --reason TEXT"
        )
    if len(reason) > REASON_MAX:
        raise UsageError(
            f"--reason is {len(reason)} characters long; at most {REASON_MAX} fit",
            "put the details in the incident ticket and name it in the reason",
        )
    return reason


def _until(duration: str | None, until: str | None, now: datetime) -> datetime:
    if duration is not None:
        try:
            return now + timedelta(seconds=parse_duration(duration))
        except ValueError as exc:
            raise UsageError(f"--for: {exc}") from None
    assert until is not None
    try:
        end = parse_time(until)
    except ValueError:
        raise UsageError(
            f"--until: {until!r} is not an RFC 3339 time",
            "write a date, a time and Z or an offset: 2026-12-24T18:00:00Z",
        ) from None
    if end <= now:
        raise UsageError(
            f"--until {until} is not in the future (now is {format_time(now)})",
            "give a later time, or a duration with --for",
        )
    return end
