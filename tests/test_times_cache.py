"""``format_time`` remembers the text of aware times; pinned against the
plain formatting for zones, fractions of a second and naive local times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone, tzinfo

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.spec.times import format_time


def plain(moment: datetime) -> str:
    moment = moment.astimezone(UTC)
    if moment.microsecond:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


zones: list[tzinfo | None] = [
    UTC,
    timezone(timedelta(hours=2)),
    timezone(timedelta(hours=-5, minutes=-30)),
    None,
]
moments = st.builds(
    lambda naive, zone: naive.replace(tzinfo=zone),
    st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(9998, 1, 1)),
    st.sampled_from(zones),
)


@given(st.lists(moments, min_size=1, max_size=20))
@settings(max_examples=300, deadline=None)
def test_remembered_texts_are_the_plain_ones(times: list[datetime]) -> None:
    for moment in times + times:  # the second time from the cache
        assert format_time(moment) == plain(moment)


def test_one_instant_in_two_zones_is_one_text() -> None:
    utc = datetime(2026, 12, 1, 9, 0, 0, 500, tzinfo=UTC)
    east = utc.astimezone(timezone(timedelta(hours=3)))
    assert format_time(east) == format_time(utc) == "2026-12-01T09:00:00.000500Z"


def test_naive_times_differing_only_in_fold_are_formatted_each() -> None:
    first = datetime(2026, 10, 25, 2, 30)
    second = first.replace(fold=1)
    assert format_time(first) == plain(first)
    assert format_time(second) == plain(second)
