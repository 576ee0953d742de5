"""The daemon's event log: the lines written at once (``info_many``, a pass's
thousands of sent jobs and verdicts) are the lines ``info`` writes one by one,
in text and JSON, with URL credentials redacted either way."""

from __future__ import annotations

import io
from typing import Any

import pytest

from reconciler.daemon.logs import EventLog

EVENTS: list[tuple[str, str, dict[str, Any]]] = [
    ("sent", "apply attempt 1: accepted",
     {"rollout": "r", "node": "web-1", "job": "j1", "commit": "abc", "agent": "http://127.0.0.1:1"}),
    ("transition", "pending -> dispatched (batch 1 started)", {"rollout": "r", "node": "", "x": None}),
    ("sent", "with spaces", {"agent": "https://user:TOKEN@example.invalid/x", "note": "two words"}),
    ("transition", "", {}),
]  # fmt: skip


def without_times(text: str, fmt: str) -> list[str]:
    lines = text.splitlines()
    if fmt == "json":
        return [line.split('"level"', 1)[1] for line in lines]
    return [line.split(" ", 1)[1] for line in lines]


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_lines_written_at_once_are_the_lines_written_one_by_one(fmt: str) -> None:
    one_by_one, at_once = io.StringIO(), io.StringIO()
    plain = EventLog(fmt, stream=one_by_one)
    for event, message, fields in EVENTS:
        plain.info(event, message, **fields)
    EventLog(fmt, stream=at_once).info_many(EVENTS)
    assert without_times(at_once.getvalue(), fmt) == without_times(one_by_one.getvalue(), fmt)
    assert at_once.getvalue().endswith("\n") and len(at_once.getvalue().splitlines()) == 4
    assert "TOKEN" not in at_once.getvalue() and "https://***@example.invalid" in at_once.getvalue()


def test_lines_below_the_level_are_not_written() -> None:
    stream = io.StringIO()
    log = EventLog(stream=stream, level="warning")
    log.info_many(EVENTS)
    log.info_many([])
    assert stream.getvalue() == ""
    EventLog(stream=stream).info_many([])
    assert stream.getvalue() == ""
