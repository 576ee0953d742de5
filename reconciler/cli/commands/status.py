"""``reconciler status [NAME] [--repo PATH_OR_URL] [--branch main] [--watch]
[-o text|json|yaml]``: rollouts at a glance from the committed status files;
with NAME, every node.

Status is read from the branch's committed tree, never a working tree: from
a bare repository or a remote (through ``GitStore``), or from a working
clone. In a clone whose ``origin`` is where the daemon pushes, the origin is
read, since the clone's own branch is only as fresh as its last pull. With
``statusBranch`` in ``reconciler.yaml`` the status comes from that branch.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import time
from datetime import UTC, datetime

from reconciler.cli.completers import complete_with, rollout_names
from reconciler.cli.output_format import add_format_argument, structured
from reconciler.cli.remote_options import add_branch_source_arguments
from reconciler.daemon.logs import EventLog
from reconciler.git.branch import REMOTE_POLL, Branch, open_branch
from reconciler.readers.status_reader import Snapshot, StatusCache, read_snapshot, status_branch
from reconciler.spec.errors import StoreError
from reconciler.spec.rollout_status import TERMINAL_PHASES
from reconciler.text import status_text

HELP = "show rollouts from the committed status files; with NAME, every node"

LOCAL_POLL = 0.5  # seconds between reads of a local ref while watching
REMOTE_REFETCH = 30.0  # a full fetch at least this often, in case a hint was missed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    complete_with(
        parser.add_argument("name", metavar="NAME", nargs="?", help="one rollout in full"),
        rollout_names,
    )
    add_branch_source_arguments(parser)
    parser.add_argument("--watch", action="store_true", help="redraw as status commits arrive")
    parser.add_argument(
        "--active",
        action="store_true",
        help="leave out finished rollouts (completed, failed, aborted); newest first",
    )
    add_format_argument(
        parser,
        ("text", "json", "yaml"),
        "text for a terminal (default), or the status records as json or yaml",
    )


# --- rendering --------------------------------------------------------------


def use_colour(stream: object) -> bool:
    return (
        bool(getattr(stream, "isatty", lambda: False)())
        and "NO_COLOR" not in os.environ
        and os.environ.get("TERM") != "dumb"
    )


def terminal_size(stream: object) -> os.terminal_size | None:
    """The size of the terminal ``stream`` writes to, asked of the terminal
    itself (a COLUMNS left in the environment may be another window's)."""
    if not getattr(stream, "isatty", lambda: False)():
        return None
    try:
        return os.get_terminal_size(stream.fileno())  # type: ignore[attr-defined]
    except (OSError, AttributeError, ValueError):
        return shutil.get_terminal_size()


def terminal_width(stream: object) -> int:
    """The terminal's columns (the table uses up to 200 of them), or 80 when
    not a terminal."""
    size = terminal_size(stream)
    if size is None:
        return status_text.WIDTH
    return max(status_text.WIDTH, min(size.columns, 200))


def render(
    snapshot: Snapshot,
    name: str | None,
    fmt: str,
    colour: bool,
    width: int = status_text.WIDTH,
    active: bool = False,
) -> tuple[str, bool]:
    """The text to show, and whether NAME was found. ``active`` leaves out
    finished rollouts and shows the newest first."""
    now = datetime.now(UTC)
    if name is not None:
        status = snapshot.statuses.get(name)
        if status is None:
            known = ", ".join(sorted(snapshot.statuses)) or "none"
            return f"no status for {name!r} yet (rollouts with a status: {known})\n", False
        if fmt != "text":
            return structured(status_text.render_json([status], one=True), fmt), True
        return status_text.render_detail(status, now, colour=colour), True
    statuses = snapshot.statuses
    if active:
        statuses = {n: s for n, s in statuses.items() if s.phase not in TERMINAL_PHASES}
        if not statuses and fmt == "text":
            return "no active rollouts (every rollout with a status has finished)\n", True
    if fmt != "text":
        shown = status_text.newest(statuses) if active else statuses.values()
        return structured(status_text.render_json(shown), fmt), True
    table = status_text.render_table(statuses, now, colour=colour, width=width, newest_first=active)
    return table, True


def run(args: argparse.Namespace) -> int:
    source = open_branch(args.repo, args.branch, ssh_key=args.ssh_key, known_hosts=args.known_hosts)
    if args.watch:
        return watch(source, args.name, args.format, args.active)
    snapshot = read_snapshot(source)
    text, found = render(
        snapshot,
        args.name,
        args.format,
        use_colour(sys.stdout),
        terminal_width(sys.stdout),
        args.active,
    )
    sys.stdout.write(text)
    for problem in snapshot.problems:
        print(f"warning: {problem}", file=sys.stderr)
    return 0 if found else 1


def watch(source: Branch, name: str | None, fmt: str, active: bool = False) -> int:
    """Redraw whenever a new status commit arrives; on a terminal also when
    the text changes as ages grow. Ends with Ctrl-C."""
    tty = sys.stdout.isatty()
    colour = use_colour(sys.stdout)
    tip = source.refresh()
    other = status_branch(source, tip) if tip else None
    branches = [source.branch, other] if other else [source.branch]
    snapshot: Snapshot | None = None
    cache = StatusCache()
    shown: tuple[str | None, str] | None = None
    last_read = -REMOTE_REFETCH
    hinted = True
    with contextlib.closing(source.watcher(branches, log=EventLog())) as watcher:
        try:
            while True:
                now = time.monotonic()
                # A local ref is cheap to read every time; a remote is fetched
                # on a hint from the watcher, or now and then in case one was missed.
                if hinted or not source.is_remote or now - last_read >= REMOTE_REFETCH:
                    try:
                        snapshot = read_snapshot(source, cache)
                    except StoreError as exc:
                        print(f"warning: {exc}", file=sys.stderr)
                    last_read = now
                if snapshot is not None:
                    width = terminal_width(sys.stdout)
                    text, _ = render(snapshot, name, fmt, colour, width, active)
                    if shown is None or snapshot.commit != shown[0] or (tty and text != shown[1]):
                        _draw(text, source, snapshot, tty)
                        shown = (snapshot.commit, text)
                hinted = watcher.wait(REMOTE_POLL if source.is_remote else LOCAL_POLL)
        except KeyboardInterrupt:
            return 0


def _draw(text: str, source: Branch, snapshot: Snapshot, tty: bool) -> None:
    commit = snapshot.commit[:10] if snapshot.commit else "no status yet"
    stamp = datetime.now(UTC).strftime("%H:%M:%S")
    footer = f"{source.branch} @ {commit} · read {stamp}Z · Ctrl-C to stop"
    where = status_text.clip(f"from {source.label}", status_text.WIDTH - 1)
    if tty:
        size = terminal_size(sys.stdout)
        text = fit_screen(text, size.lines if size is not None else 24)
        sys.stdout.write("\x1b[H\x1b[2J" + text + "\n" + footer + "\n" + where + "\n")
    else:
        sys.stdout.write(f"--- {footer}\n{text}")
    sys.stdout.flush()


def fit_screen(text: str, rows: int) -> str:
    """The top of ``text`` that fits a terminal of ``rows`` lines with the
    footer (the useful part comes first), and how much was left out."""
    lines = text.splitlines()
    room = max(3, rows - 4)  # the footer: a blank line, two lines, the cursor's line
    if len(lines) <= room:
        return text
    hidden = len(lines) - room + 1
    return (
        "\n".join(
            [*lines[: room - 1], f"… {hidden} more lines: run it without --watch to see them all"]
        )
        + "\n"
    )
