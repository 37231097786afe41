"""A cron's schedule, sans I/O (``sessions._schedule``): its times, DST, and what is refused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from trioserve.errors import InvalidRequest
from trioserve.sessions._schedule import Schedule, parse_schedule, parse_timezone

NEW_YORK = ZoneInfo("America/New_York")
PARIS = ZoneInfo("Europe/Paris")
UTC_ZONE = ZoneInfo("UTC")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def times(schedule: Schedule, start: datetime, count: int) -> list[datetime]:
    out: list[datetime] = []
    when: datetime | None = start
    for _ in range(count):
        assert when is not None
        when = schedule.next_after(when)
        assert when is not None
        out.append(when)
    return out


def local(moments: list[datetime], zone: ZoneInfo) -> list[str]:
    return [m.astimezone(zone).strftime("%m-%d %H:%M %Z") for m in moments]


def test_a_daily_time_the_spring_forward_skips_fires_once_at_the_jump() -> None:
    daily = parse_schedule("30 2 * * *", NEW_YORK, T0)
    found = times(daily, datetime(2026, 3, 7, 12, tzinfo=UTC), 3)
    # 2026-03-08: 02:00 EST becomes 03:00 EDT; 02:30 never shows on the clock.
    assert local(found, NEW_YORK) == ["03-08 03:00 EDT", "03-09 02:30 EDT", "03-10 02:30 EDT"]
    assert len({m.date() for m in found}) == 3  # once a day, the jump's day included


def test_a_daily_time_the_fall_back_repeats_fires_once() -> None:
    daily = parse_schedule("30 1 * * *", NEW_YORK, T0)
    found = times(daily, datetime(2026, 10, 31, 12, tzinfo=UTC), 3)
    # 2026-11-01: 01:00-02:00 happens twice (EDT, then EST); 01:30 fires at the first only.
    assert local(found, NEW_YORK) == ["11-01 01:30 EDT", "11-02 01:30 EST", "11-03 01:30 EST"]
    # Asked again from inside the repeated hour (a late process), it does not fire twice.
    second_pass = datetime(2026, 11, 1, 6, 10, tzinfo=UTC)  # 01:10 EST
    assert daily.next_after(second_pass) == found[1]


def test_paris_spring_forward_and_fall_back() -> None:
    daily = parse_schedule("30 2 * * *", PARIS, T0)
    spring = times(daily, datetime(2026, 3, 28, 12, tzinfo=UTC), 2)
    assert local(spring, PARIS) == ["03-29 03:00 CEST", "03-30 02:30 CEST"]
    autumn = times(daily, datetime(2026, 10, 24, 12, tzinfo=UTC), 2)
    assert local(autumn, PARIS) == ["10-25 02:30 CEST", "10-26 02:30 CET"]


def test_hourly_and_finer_schedules_follow_real_time_across_the_fall_back() -> None:
    half_hourly = parse_schedule("0,30 * * * *", NEW_YORK, T0)
    found = times(half_hourly, datetime(2026, 11, 1, 4, 50, tzinfo=UTC), 5)
    assert [m - found[0] for m in found] == [timedelta(minutes=30 * i) for i in range(5)]
    assert local(found, NEW_YORK)[:4] == [
        "11-01 01:00 EDT",
        "11-01 01:30 EDT",
        "11-01 01:00 EST",
        "11-01 01:30 EST",
    ]


def test_times_only_grow_and_are_utc() -> None:
    weekly = parse_schedule("@weekly", PARIS, T0)
    found = times(weekly, T0, 5)
    assert found == sorted(found) and len(set(found)) == 5
    assert all(m.tzinfo is UTC for m in found)
    assert all(m.astimezone(PARIS).strftime("%a %H:%M") == "Sun 00:00" for m in found)


def test_every_counts_from_its_anchor_in_real_time() -> None:
    anchor = datetime(2026, 3, 8, 6, 59, 59, 250_000, tzinfo=UTC)  # just before the jump
    every = parse_schedule("@every 1s", NEW_YORK, anchor)
    assert every.next_after(anchor - timedelta(hours=1)) == anchor
    assert times(every, anchor, 3) == [anchor + timedelta(seconds=i) for i in (1, 2, 3)]
    assert every.next_after(anchor + timedelta(seconds=2.5)) == anchor + timedelta(seconds=3)
    assert every.count_between(anchor, anchor + timedelta(seconds=3)) == 3
    assert (
        every.count_between(anchor + timedelta(milliseconds=1), anchor + timedelta(seconds=3)) == 2
    )
    long = parse_schedule("@every 1h30m", UTC_ZONE, anchor)
    assert long.next_after(anchor) == anchor + timedelta(minutes=90)


def test_missed_times_are_counted() -> None:
    minutely = parse_schedule("* * * * *", UTC_ZONE, T0)
    assert minutely.count_between(T0, T0 + timedelta(minutes=10)) == 10
    assert minutely.count_between(T0 + timedelta(seconds=1), T0 + timedelta(minutes=10)) == 9


@pytest.mark.parametrize(
    ("schedule", "says"),
    [
        ("61 * * * *", "schedule: invalid cron expression '61 * * * *'"),
        ("* * *", "schedule: a cron expression has five fields"),
        ("0 * * * * *", "schedule: a cron expression has five fields"),
        ("0 0 30 2 *", "schedule: invalid cron expression"),
        ("@every 500ms", "schedule: the interval of '@every 500ms' is too short: at least 1s"),
        ("@every 0s", "too short"),
        ("@every", "schedule: '@every' takes a duration"),
        ("@every soon", "schedule: '@every' takes a duration"),
        ("@fortnightly", "schedule: unknown macro"),
        ("", "schedule: expected a cron expression"),
        ("\x00", "schedule: expected a cron expression"),
    ],
)
def test_bad_schedules_are_refused_naming_the_field(schedule: str, says: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse_schedule(schedule, UTC_ZONE, T0)
    assert says in refused.value.message


@pytest.mark.parametrize(
    "name", ["Mars/Olympus_Mons", "", "../etc/passwd", "/etc/localtime", "x\x00"]
)
def test_unknown_zones_are_refused_naming_the_field(name: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse_timezone(name)
    assert refused.value.message.startswith("timezone: ")


def test_macros_and_names() -> None:
    assert parse_schedule("@daily", PARIS, T0).fields == "0 0 * * *"
    assert parse_schedule(" 0 9 * * MON-FRI ", PARIS, T0).fields == "0 9 * * MON-FRI"
    assert parse_timezone("Europe/Paris") == PARIS
