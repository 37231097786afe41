"""A cron's schedule: parsed once, then the times it fires at (sans I/O).

Two forms (``POST /v1/crons``'s ``schedule``):

- a five-field cron expression (``minute hour day-of-month month
  day-of-week``, or one of ``@hourly``, ``@daily``/``@midnight``,
  ``@weekly``, ``@monthly``, ``@yearly``/``@annually``), read in the
  cron's IANA ``timezone`` by ``cronsim`` (Debian cron's rules, DST
  included: a time the clock skips on the spring-forward day fires once
  when the clock jumps, a time it repeats on the fall-back day fires once,
  not twice; hourly and finer schedules follow real time);
- ``@every <duration>`` (Go syntax: ``30s``, ``1m30s``, ``2h``; at least
  ``MIN_INTERVAL``): the times ``anchor + k * interval``, ``anchor`` being
  when the cron was made or last rescheduled, whatever the time zone.

Every time is an aware ``datetime`` in UTC.  ``next_after(t)`` is the first
time strictly after ``t``; the times it gives only ever grow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from trioserve.errors import InvalidRequest
from trioserve.units import format_duration, parse_duration

__all__ = ["MIN_INTERVAL", "Schedule", "parse_schedule", "parse_timezone"]

#: The shortest ``@every`` interval, in seconds.
MIN_INTERVAL: Final = 1.0
#: The longest: a bound for arithmetic on datetimes (100 years).
_MAX_INTERVAL: Final = 100 * 365 * 86400.0
_MACROS: Final = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
#: At most this many times are counted by ``count_between`` (a bound, not a limit of use).
MAX_COUNT: Final = 10_000


def parse_timezone(name: str) -> ZoneInfo:
    """The IANA zone ``name`` (``InvalidRequest`` naming ``timezone`` for an unknown one)."""
    if not name or "\x00" in name or len(name) > 64 or name.startswith(("/", ".")):
        raise InvalidRequest(f"timezone: expected an IANA time zone name, got {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidRequest(
            f"timezone: unknown time zone {name!r} (expected an IANA name such as"
            " 'UTC' or 'Europe/Paris')"
        ) from None


@dataclass(frozen=True, slots=True)
class Schedule:
    """A parsed schedule (``parse_schedule``)."""

    #: The five fields cronsim reads (a macro spelled out); ``None`` for ``@every``.
    fields: str | None
    zone: ZoneInfo
    #: ``@every``'s interval and the time its slots count from.
    interval: timedelta | None = None
    anchor: datetime | None = None

    def next_after(self, moment: datetime) -> datetime | None:
        """The first time strictly after ``moment`` (``None``: never again)."""
        moment = moment.astimezone(UTC)
        if self.interval is not None and self.anchor is not None:
            if moment < self.anchor:
                return self.anchor
            steps = (moment - self.anchor) // self.interval + 1
            return self.anchor + steps * self.interval
        assert self.fields is not None
        times = CronSim(self.fields, moment.astimezone(self.zone))
        try:
            for found in times:
                when = found.astimezone(UTC)
                # On the fall-back day a local time comes twice: cronsim reads the hour
                # again from the wall clock; a time not after ``moment`` was given already.
                if when > moment:
                    return when
        except (StopIteration, CronSimError, OverflowError, ValueError):
            pass  # no time in the next 50 years, or past year 9999
        return None

    def count_between(self, start: datetime, end: datetime) -> int:
        """How many times fall in ``[start, end)`` (at most ``MAX_COUNT``)."""
        if self.interval is not None and self.anchor is not None:
            first = start if start >= self.anchor else self.anchor
            if end <= first:
                return 0
            first_step = math.ceil((first - self.anchor) / self.interval)
            last_step = math.ceil((end - self.anchor) / self.interval)  # exclusive
            return min(max(last_step - first_step, 0), MAX_COUNT)
        count = 0
        when: datetime | None = start - timedelta(microseconds=1)
        while count < MAX_COUNT:
            when = self.next_after(when) if when is not None else None
            if when is None or when >= end:
                break
            count += 1
        return count


def parse_schedule(text: str, zone: ZoneInfo, anchor: datetime) -> Schedule:
    """Read ``schedule`` (see the module doc) in ``zone``; ``anchor`` starts ``@every``.

    ``InvalidRequest`` naming ``schedule`` for an expression cronsim refuses,
    one of other than five fields, an interval under ``MIN_INTERVAL`` or a
    schedule that never fires.
    """
    value = text.strip()
    if "\x00" in value or not value:
        raise InvalidRequest(f"schedule: expected a cron expression or '@every 30s', got {text!r}")
    lowered = value.lower()
    if lowered.startswith("@every"):
        return _every(value[len("@every") :].strip(), text, zone, anchor)
    fields = _MACROS.get(lowered, value)
    if fields.startswith("@"):
        known = ", ".join([*_MACROS, "@every <duration>"])
        raise InvalidRequest(f"schedule: unknown macro {value!r} (expected one of {known})")
    parts = fields.split()
    if len(parts) != 5:
        raise InvalidRequest(
            f"schedule: a cron expression has five fields (minute hour day-of-month month"
            f" day-of-week), got {len(parts)} in {text!r}"
        )
    try:
        CronSim(" ".join(parts), anchor.astimezone(zone))
    except (CronSimError, ValueError, IndexError, KeyError) as exc:
        raise InvalidRequest(f"schedule: invalid cron expression {text!r}: {exc}") from None
    schedule = Schedule(" ".join(parts), zone)
    if schedule.next_after(anchor) is None:
        raise InvalidRequest(f"schedule: {text!r} never fires (no time in the next 50 years)")
    return schedule


def _every(duration: str, text: str, zone: ZoneInfo, anchor: datetime) -> Schedule:
    try:
        seconds = parse_duration(duration)
    except ValueError:
        raise InvalidRequest(
            f"schedule: '@every' takes a duration such as 30s, 1m30s or 2h, got {text!r}"
        ) from None
    if not seconds >= MIN_INTERVAL or not math.isfinite(seconds):
        raise InvalidRequest(
            f"schedule: the interval of {text!r} is too short: at least"
            f" {format_duration(MIN_INTERVAL)}"
        )
    if seconds > _MAX_INTERVAL:
        raise InvalidRequest(f"schedule: the interval of {text!r} is too long: at most 100 years")
    return Schedule(None, zone, timedelta(seconds=seconds), anchor.astimezone(UTC))
