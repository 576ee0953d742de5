"""Scenarios and properties of rollout shapes (docs/rollouts.md):
growing batches, timed pauses, deploy windows and freezes, and ``after``."""

from __future__ import annotations

import zoneinfo
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.engine.calendar import batch_gate, next_opening
from reconciler.engine.step import next_wakeup
from reconciler.spec.batch_shapes import batch_sizes
from reconciler.spec.model import Freeze, Settings, Window
from reconciler.spec.rollout_status import from_record, to_record
from tests.engine_world import T0, World

BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")


def window(days: set[int], start: str, end: str, zone: str = "Europe/Berlin") -> Window:
    def minutes(text: str) -> int:
        hours, mins = text.split(":")
        return int(hours) * 60 + int(mins)

    return Window(frozenset(days), minutes(start), minutes(end), zone, zoneinfo.ZoneInfo(zone))


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


# --- batch sizes ------------------------------------------------------------


def test_one_then_fifty_percent_of_five_nodes_is_one_three_one() -> None:
    assert batch_sizes((1, "50%"), 1, 5) == (1, 3, 1)


def test_percentages_round_up_and_are_at_least_one_node() -> None:
    assert batch_sizes(("10%",), 1, 3) == (1, 1, 1)
    assert batch_sizes((1, "10%", "50%"), 1, 20) == (1, 2, 10, 7)


def test_batch_size_alone_cuts_equal_chunks() -> None:
    assert batch_sizes((), 2, 5) == (2, 2, 1)


@given(
    st.lists(
        st.one_of(st.integers(1, 50), st.integers(1, 100).map(lambda p: f"{p}%")),
        min_size=1,
        max_size=5,
    ),
    st.integers(1, 500),
)
def test_every_node_is_in_exactly_one_batch_and_no_batch_is_empty(
    entries: list[int | str], count: int
) -> None:
    sizes = batch_sizes(tuple(entries), 1, count)
    assert sum(sizes) == count
    assert all(size >= 1 for size in sizes)


def test_engine_records_batches_one_three_one_and_dispatches_them_in_turn() -> None:
    w = World(["a", "b", "c", "d", "e"])
    w.rollout(batches=(1, "50%"))

    w.step(0)
    assert [n.batch for n in w.status().nodes] == [1, 2, 2, 2, 3]
    assert w.sent_now() == ["a"]
    assert w.status().frozen is not None and w.status().frozen.batches == (1, "50%")
    w.succeed("a")
    w.step(1)
    assert w.sent_now() == ["b", "c", "d"]
    for n in "bcd":
        w.succeed(n)
    w.step(2)
    assert w.sent_now() == ["e"]
    w.succeed("e")
    w.step(3)
    assert w.phase() == "completed"
    again = from_record(to_record(w.status()))
    assert again == w.status()


def test_batches_edited_after_start_are_reported_and_not_applied() -> None:
    w = World(["a", "b", "c"])
    w.rollout(batches=(1, "50%"))
    w.step(0)

    w.edit(batches=(3,))
    w.step(1)

    condition = w.status().condition("frozen_fields_changed")
    assert condition is not None and "batches" in condition.message
    assert [n.batch for n in w.status().nodes] == [1, 2, 2]


# --- timed pauses -----------------------------------------------------------


def test_timed_pause_lifts_by_itself_when_its_time_has_passed() -> None:
    w = World(["a", "b"])
    w.rollout(pause_after=(1,), pause_for=((1, 60),))
    w.step(0)
    w.succeed("a")
    w.step(10)
    hold = w.status().hold
    assert w.phase() == "paused" and hold is not None
    assert hold.until == w.at(70)
    assert "2026-12-01T09:01:10Z" in hold.message
    assert next_wakeup([w.status()]) == w.at(70)

    w.step(69)
    assert w.phase() == "paused" and w.last.effects == ()
    w.step(70)
    assert w.phase() == "running" and w.sent_now() == ["b"]


def test_timed_pause_with_a_failure_in_its_batch_waits_for_a_resume() -> None:
    w = World(["a", "b", "c"])
    w.rollout(batch_size=2, on_failure="observe", pause_after=(1,), pause_for=((1, 60),))
    w.step(0)
    w.succeed("a")
    w.fail("b")
    w.step(10)
    hold = w.status().hold
    assert w.phase() == "paused" and hold is not None and hold.until is None

    w.step(10_000)
    assert w.phase() == "paused" and w.last.effects == ()
    w.resume()
    w.step(10_001)
    assert w.sent_now() == ["c"]


def test_a_resume_lifts_a_timed_pause_early() -> None:
    w = World(["a", "b"])
    w.rollout(pause_after=(1,), pause_for=((1, 3600),))
    w.step(0)
    w.succeed("a")
    w.step(1)
    w.resume()
    w.step(2)
    assert w.sent_now() == ["b"]


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 600),
    st.lists(st.integers(0, 900), min_size=1, max_size=8),
)
def test_a_timed_pause_never_lifts_early(seconds: int, offsets: list[int]) -> None:
    w = World(["a", "b"])
    w.rollout(pause_after=(1,), pause_for=((1, seconds),))
    w.step(0)
    w.succeed("a")
    w.step(1)
    opened = w.at(1)
    for offset in sorted(offsets):
        w.step(1 + offset)
        started = w.status().batches[1].state != "pending"
        if w.now < opened + timedelta(seconds=seconds):
            assert not started
        else:
            assert started


# --- windows and freezes ------------------------------------------------------


def test_outside_the_window_the_rollout_is_scheduled_with_the_opening_time() -> None:
    # T0 is Tuesday 2026-12-01 09:00 UTC = 10:00 in Berlin; the window opens at 14:00.
    w = World(["a"], settings=Settings(windows=(window({1}, "14:00", "17:00"),)))
    w.rollout()
    w.step(0)
    status = w.status()
    assert status.phase == "scheduled" and w.last.effects == ()
    assert status.waiting is not None and status.waiting.reason == "outside_window"
    assert status.waiting.until == utc("2026-12-01T13:00:00")
    assert next_wakeup([status]) == utc("2026-12-01T13:00:00")
    assert w.step(60).statuses == {}  # an idle pass writes nothing

    w.step((utc("2026-12-01T13:00:00") - T0).total_seconds())
    assert w.phase() == "running" and w.sent_now() == ["a"]
    assert w.status().waiting is None


def test_ignore_windows_starts_at_once() -> None:
    w = World(["a"], settings=Settings(windows=(window({1}, "14:00", "17:00"),)))
    w.rollout(ignore_windows=True)
    w.step(0)
    assert w.phase() == "running" and w.sent_now() == ["a"]


def test_a_freeze_mid_rollout_lets_the_batch_finish_and_starts_no_other() -> None:
    freeze = Freeze(utc("2026-12-01T09:00:30"), utc("2026-12-01T10:00:00"), "release")
    w = World(["a", "b"], settings=Settings(freezes=(freeze,)))
    w.rollout()
    w.step(0)
    assert w.sent_now() == ["a"]
    w.succeed("a")
    w.step(40)
    assert w.state("a") == "succeeded" and w.last.effects == ()
    status = w.status()
    assert status.phase == "running"
    assert status.waiting is not None and status.waiting.reason == "freeze"
    assert status.waiting.until == freeze.end
    w.step(3599)
    assert w.last.effects == ()
    w.step(3600)
    assert w.sent_now() == ["b"]


def test_a_freeze_without_windows_keeps_the_first_batch_back_until_it_ends() -> None:
    freeze = Freeze(T0, T0 + timedelta(minutes=30), "incident 7")
    w = World(["a", "b"], settings=Settings(freezes=(freeze,)))
    w.rollout()
    w.step(0)
    status = w.status()
    assert w.phase() == "scheduled" and w.last.effects == ()
    assert status.waiting is not None and status.waiting.reason == "freeze"
    assert status.waiting.until == freeze.end
    w.step(30 * 60)
    assert w.phase() == "running" and w.sent_now() == ["a"]


def test_a_window_across_the_spring_change_in_berlin_lasts_two_hours() -> None:
    # 2026-03-29, a Sunday: clocks go from 02:00 CET to 03:00 CEST.
    sunday = window({6}, "01:00", "04:00")
    assert batch_gate([sunday], [], utc("2026-03-28T23:59:00")) is not None
    assert batch_gate([sunday], [], utc("2026-03-29T00:00:00")) is None  # 01:00 CET
    assert batch_gate([sunday], [], utc("2026-03-29T01:59:00")) is None  # 03:59 CEST
    closed = batch_gate([sunday], [], utc("2026-03-29T02:00:00"))  # 04:00 CEST
    assert closed is not None and closed.until == utc("2026-04-04T23:00:00")  # Sunday 01:00 CEST


def test_a_window_across_the_autumn_change_in_berlin_lasts_four_hours() -> None:
    # 2026-10-25, a Sunday: clocks go from 03:00 CEST back to 02:00 CET.
    sunday = window({6}, "01:00", "04:00")
    assert batch_gate([sunday], [], utc("2026-10-24T22:59:00")) is not None
    assert batch_gate([sunday], [], utc("2026-10-24T23:00:00")) is None  # 01:00 CEST
    assert batch_gate([sunday], [], utc("2026-10-25T02:59:00")) is None  # 03:59 CET
    assert batch_gate([sunday], [], utc("2026-10-25T03:00:00")) is not None  # 04:00 CET


def test_a_window_opening_inside_the_spring_gap_opens_after_it() -> None:
    sunday = window({6}, "02:30", "05:00")
    assert next_opening([sunday], [], utc("2026-03-28T12:00:00")) == utc("2026-03-29T01:30:00")


def test_until_skips_a_freeze_that_covers_the_next_window() -> None:
    weekdays = window({0, 1, 2, 3, 4}, "09:00", "17:00", "UTC")
    freeze = Freeze(utc("2026-12-02T00:00:00"), utc("2026-12-03T12:00:00"))
    waiting = batch_gate([weekdays], [freeze], utc("2026-12-01T18:00:00"))
    assert waiting is not None and waiting.reason == "outside_window"
    assert waiting.until == utc("2026-12-03T12:00:00")


moments = st.datetimes(
    min_value=datetime(2026, 1, 1), max_value=datetime(2027, 12, 31), timezones=st.just(UTC)
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(moments, st.integers(60, 3 * 86400)).map(
            lambda p: Freeze(p[0], p[0] + timedelta(seconds=p[1]))
        ),
        min_size=1,
        max_size=3,
    ),
    st.lists(st.integers(0, 6 * 3600), min_size=3, max_size=12),
    moments,
    st.booleans(),
)
def test_no_batch_starts_in_a_freeze_or_outside_a_window(
    freezes: list[Freeze], offsets: list[int], start: datetime, with_windows: bool
) -> None:
    windows = (window({0, 1, 2, 3, 4}, "09:00", "17:00"),) if with_windows else ()
    w = World(["a", "b", "c", "d"], settings=Settings(windows=windows, freezes=tuple(freezes)))
    w.now = start
    w.rollout()
    for offset in sorted(offsets):
        w.now = start + timedelta(seconds=offset)
        before = len(w.sent)
        w.step()
        if len(w.sent) > before:
            assert not any(f.start <= w.now < f.end for f in freezes)
            local = w.now.astimezone(BERLIN)
            assert not windows or (local.weekday() < 5 and 9 <= local.hour < 17)
        for job in w.sent[before:]:
            w.succeed(job.node)


@settings(max_examples=40, deadline=None)
@given(moments, st.lists(st.sampled_from(range(7)), min_size=1, max_size=7, unique=True))
def test_until_is_inside_a_window_and_no_window_opens_before_it(
    now: datetime, days: list[int]
) -> None:
    berlin = window(set(days), "09:00", "17:00")
    waiting = batch_gate([berlin], [], now)
    if waiting is None:
        return
    assert waiting.until is not None and waiting.until > now
    assert batch_gate([berlin], [], waiting.until) is None
    probe = now
    while probe < waiting.until - timedelta(minutes=30):
        probe += timedelta(minutes=30)
        assert batch_gate([berlin], [], min(probe, waiting.until - timedelta(seconds=1)))


# --- after ----------------------------------------------------------------------


def test_after_waits_for_completion_then_starts() -> None:
    w = World(["a", "b"])
    w.rollout("first", node_ids=("a",))
    w.rollout("second", node_ids=("b",), after=("first",))
    w.step(0)
    assert w.phase("second") == "pending" and w.status("second").reason == "after"
    assert "first" in w.status("second").message
    w.succeed("a", "first")
    w.step(1)
    assert w.phase("first") == "completed"
    assert w.phase("second") == "running" and w.sent_now() == ["b"]


def test_after_a_failed_dependency_stays_pending_naming_it() -> None:
    w = World(["a", "b"])
    w.rollout("first", node_ids=("a",), on_failure="observe")
    w.rollout("second", node_ids=("b",), after=("first",))
    w.step(0)
    w.fail("a", "first")
    w.step(1)
    assert w.phase("first") == "failed"
    status = w.status("second")
    assert status.phase == "pending" and status.reason == "after_failed"
    assert "first" in status.message and "failed" in status.message
    w.edit("second", after=())
    w.step(2)
    assert w.phase("second") == "running"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["ok", "fail", "wait"]), min_size=1, max_size=10))
def test_an_after_rollout_never_starts_before_its_dependencies_complete(
    answers: list[str],
) -> None:
    w = World(["a", "b", "c"])
    w.rollout("one", node_ids=("a",), on_failure="observe")
    w.rollout("two", node_ids=("b",), on_failure="observe")
    w.rollout("three", node_ids=("c",), after=("one", "two"))
    for k, answer in enumerate(answers):
        w.step(k)
        if w.statuses["three"].started:
            assert w.phase("one") == "completed" and w.phase("two") == "completed"
        for rollout, node in (("one", "a"), ("two", "b")):
            if w.statuses[rollout].phase == "running" and answer != "wait":
                (w.succeed if answer == "ok" else w.fail)(node, rollout)
                answer = "ok"


def test_a_version_1_rollout_writes_no_version_2_field() -> None:
    w = World(["a", "b"])
    w.rollout(pause_after=(1,))
    w.step(0)
    w.succeed("a")
    w.step(1)
    record = to_record(w.status())
    assert "waiting" not in record
    assert "until" not in record["hold"]
    assert "batches" not in record["frozen"] and "ignoreWindows" not in record["frozen"]
