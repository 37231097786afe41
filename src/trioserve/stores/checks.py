"""The argument checks and normalisations of the ``Store`` contract, written once.

``Store``'s public methods (``stores.base``) run these before they call a
backend's hook, so every backend refuses exactly the same input with the
same ``ValueError``/``TypeError``; ``check_append`` (with ``seq_conflict``)
is the one check a backend runs itself, inside its transaction, against
the stored turn and ``last_seq``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any, Final, NamedTuple

import msgspec

from trioserve.errors import (
    LogConflict,
    SessionBusy,
    TenantSessionCapReached,
    TenantTurnCapReached,
    TurnCapReached,
    TurnNotFound,
)
from trioserve.stores.records import (
    LoggedEvent,
    Session,
    SessionKey,
    SessionStatus,
    TurnBatch,
    TurnEnd,
    TurnRecord,
    TurnStatus,
    _Unset,
)

__all__ = [
    "Append",
    "EventQuery",
    "SessionChange",
    "SessionQuery",
    "check_append",
    "check_batch",
    "check_limit",
    "check_max_bytes",
    "ended_at_of_new",
    "has_nul",
    "new_turn",
    "no_nul",
    "seq_conflict",
    "to_json",
    "utc",
]


class SessionQuery(NamedTuple):
    """``list``'s checked arguments."""

    agent_name: str | None
    status: SessionStatus | None
    limit: int | None
    before: SessionKey | None  # its time in UTC
    tenant: str | None


class SessionChange(NamedTuple):
    """``update``'s checked arguments; ``now`` is the ``ended_at`` a newly terminal one takes."""

    status: SessionStatus | None
    last_active_at: datetime | None
    adapter_state: str | _Unset | None
    now: datetime


class EventQuery(NamedTuple):
    """``read_events``'s checked arguments."""

    after: int
    before: int | None
    turn_id: str | None
    limit: int | None
    max_bytes: int | None


class Append(NamedTuple):
    """``append_events``'s checked arguments: the batch is the store's own copy (a
    ``TurnBatch`` if it was one)."""

    turn_id: str
    events: Sequence[LoggedEvent]
    started_at: datetime | None
    end: TurnEnd | None


def utc(value: datetime, what: str) -> datetime:
    """``value`` in UTC; a naive datetime is a ``ValueError``."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be a timezone-aware datetime, got {value!r}")
    return value.astimezone(UTC)


def opt_utc(value: datetime | None, what: str) -> datetime | None:
    return None if value is None else utc(value, what)


def to_json(value: Any, what: str) -> str:
    """``value`` as compact JSON text (``ValueError`` if it is not JSON-serialisable)."""
    try:
        return json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} is not JSON-serialisable: {exc}") from exc


def copy_json(value: Any) -> Any:
    """A deep copy of JSON (what ``to_json`` took): through msgspec, 7 times faster than
    ``copy.deepcopy`` for a spec (the memory store's reads copy a session's out)."""
    try:
        return _from_json(_to_json(value))
    except (msgspec.MsgspecError, UnicodeEncodeError):  # a lone surrogate in a string
        return copy.deepcopy(value)


_to_json: Final = msgspec.json.encode
_from_json: Final = msgspec.json.decode


def has_nul(*keys: str | None) -> bool:
    """Whether a key (an id, a name, a tenant) holds a NUL.

    No stored key does (``create``, ``create_turn`` and ``update`` refuse one,
    :func:`no_nul`), so a look-up by such a key finds nothing, and the SQL
    stores answer it without asking the database, whose text (PostgreSQL's)
    cannot even hold a NUL.  What a client writes (a turn's input) and what an
    adapter says (a turn's reason) are kept whole, NUL included.
    """
    return any(key is not None and "\x00" in key for key in keys)


def no_nul(what: str, value: object) -> None:
    """Refuse (``ValueError``) a key or name that holds a NUL (see :func:`has_nul`); a
    value that is not a string is left alone."""
    if isinstance(value, str) and has_nul(value):
        raise ValueError(f"{what} must not contain NUL, got {value!r}")


def no_nul_in(what: str, record: object, fields: tuple[str, ...]) -> None:
    """:func:`no_nul` on each of ``record``'s ``fields``."""
    for field in fields:
        no_nul(f"{what}: {field}", getattr(record, field))


def check_limit(limit: int | None) -> None:
    """A ``limit`` must be ``None`` or >= 0."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")


def check_max_bytes(max_bytes: int | None) -> None:
    """``read_events``'s ``max_bytes`` must be positive (or ``None``)."""
    if max_bytes is not None and max_bytes < 1:
        raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")


def check_cap(name: str, cap: int | None) -> None:
    """A ``max_running``/``max_active`` cap must be ``None`` or >= 1."""
    if cap is not None and (type(cap) is not int or cap < 1):
        raise ValueError(f"{name} must be an int >= 1, got {cap!r}")


def ended_at_of_new(session: Session) -> datetime | None:
    """The ``ended_at`` ``create`` stores (``ValueError`` for one on a live session)."""
    if not SessionStatus(session.status).terminal:
        if session.ended_at is not None:
            raise ValueError(
                f"session {session.id!r}: a {session.status} session cannot have an ended_at"
            )
        return None
    return session.last_active_at if session.ended_at is None else session.ended_at


def new_turn(turn: TurnRecord) -> TurnRecord:
    """What ``create_turn`` refuses (``ValueError``); the record in canonical form."""
    status = TurnStatus(turn.status)
    no_nul_in(f"turn {turn.id!r}", turn, ("id", "owner"))
    if turn.first_seq is not None or turn.last_seq is not None:
        raise ValueError(f"turn {turn.id!r}: first_seq/last_seq are kept by the store")
    if status.finished != (turn.ended_at is not None):
        raise ValueError(
            f"turn {turn.id!r}: a {status} turn must {'' if status.finished else 'not '}"
            "have an ended_at"
        )
    return replace(
        turn,
        status=status,
        created_at=utc(turn.created_at, "created_at"),
        started_at=opt_utc(turn.started_at, "started_at"),
        ended_at=opt_utc(turn.ended_at, "ended_at"),
        lease_expires_at=opt_utc(turn.lease_expires_at, "lease_expires_at"),
    )


def check_running(
    session_id: str,
    busy: bool,
    running: int,
    max_running: int | None,
    tenant: TenantCount | None = None,
) -> None:
    """Refuse a new running turn: ``SessionBusy`` if the session runs one (``busy``), else
    ``TenantTurnCapReached`` if its tenant runs its cap (``tenant``), else
    ``TurnCapReached`` if ``running`` turns run and that is ``max_running`` or more."""
    if busy:
        raise SessionBusy(f"session {session_id} already has a turn in flight")
    if tenant is not None and tenant.has >= tenant.cap:
        raise TenantTurnCapReached(
            f"tenant {tenant.name} has too many concurrent turns (max {tenant.cap})"
        )
    if max_running is not None and running >= max_running:
        raise TurnCapReached(f"too many concurrent turns (max {max_running})")


class TenantCount(NamedTuple):
    """A tenant, how many of something it has, and its cap on them."""

    name: str
    has: int
    cap: int


def check_tenant_sessions(tenant: TenantCount | None) -> None:
    """``TenantSessionCapReached`` if the tenant has its cap of active sessions."""
    if tenant is not None and tenant.has >= tenant.cap:
        raise TenantSessionCapReached(
            f"tenant {tenant.name} has too many active sessions (max {tenant.cap})"
        )


def turn_order(turn: TurnRecord) -> tuple[datetime, str]:
    """The order turns are listed in: ``created_at``, then id."""
    return (turn.created_at, turn.id)


def check_batch(
    turn_id: str, events: Sequence[LoggedEvent], end: TurnEnd | None
) -> Sequence[LoggedEvent]:
    """What ``append_events`` refuses before anything else (``ValueError``); else the
    batch as the store keeps it: a copy its caller cannot change (a ``TurnBatch``
    stays one).

    A batch can hold tens of thousands of events: it is checked column by
    column (each taken by ``map``, in C: ``zip(*events)`` costs three times as
    much an event past a few thousand), and only a batch found wrong is
    walked event by event, for the first wrong one's message.
    """
    if end is not None and not TurnStatus(end.status).finished:
        raise ValueError(f"turn {turn_id!r}: a turn cannot end as {end.status}")
    if type(events) is TurnBatch and events.turn_id == turn_id:
        return TurnBatch(turn_id, events)  # numbered by its turn's log writer: as above
    events = tuple(events)
    n = len(events)
    types = list(map(_TYPE, events))
    if (  # counts, not sets: no hashing an event
        list(map(_TURN_ID, events)).count(turn_id) != n
        or list(map(type, map(_SEQ, events))).count(int) != n
        or list(map(type, types)).count(str) != n
        or list(map(type, map(_RAW, events))).count(bytes) != n
        or any(map(has_nul, set(types)))
    ):
        for event in events:
            _check_event(turn_id, event)
    return events


_SEQ, _TURN_ID, _TYPE, _RAW = map(attrgetter, ("seq", "turn_id", "type", "raw"))


def _check_event(turn_id: str, event: LoggedEvent) -> None:
    if (
        event.turn_id != turn_id
        or type(event.seq) is not int
        or type(event.type) is not str
        or type(event.raw) is not bytes
    ):
        raise ValueError(
            f"turn {turn_id!r}: event {event.seq!r} must be of this turn, with an int seq, "
            f"a str type and bytes raw (got turn {event.turn_id!r}, type "
            f"{type(event.type).__name__}, raw {type(event.raw).__name__})"
        )
    no_nul(f"turn {turn_id!r}: event {event.seq}: type", event.type)


def seq_conflict(session_id: str, last_seq: int, events: Sequence[LoggedEvent]) -> str | None:
    """Why ``events`` do not continue a log that ends at ``last_seq`` (``None``: they do)."""
    if type(events) is TurnBatch and events and events[0].seq == last_seq + 1:
        return None  # its seqs run on by one (``TurnBatch``)
    if list(map(_SEQ, events)) == list(range(last_seq + 1, last_seq + 1 + len(events))):
        return None  # the usual answer, found in C
    for expected, event in enumerate(events, last_seq + 1):
        if event.seq != expected:
            return (
                f"session {session_id!r}: expected event seq {expected}, got {event.seq} "
                f"(the log ends at {last_seq}; a batch's seqs must run on by one)"
            )
    return None


def check_append(
    session_id: str,
    turn_id: str,
    turn: tuple[str, str] | None,
    last_seq: int,
    events: Sequence[LoggedEvent],
) -> None:
    """Refuse an append against what is stored: ``TurnNotFound`` if ``turn`` (the stored
    turn's session id and status) is missing or another session's, ``LogConflict`` if it
    has ended or ``events`` do not run on from the log's ``last_seq``."""
    if turn is None or turn[0] != session_id:
        raise TurnNotFound(f"turn {turn_id} of session {session_id} not found")
    if turn[1] != TurnStatus.RUNNING:
        what = "has not started" if turn[1] == TurnStatus.QUEUED else "has already ended"
        raise LogConflict(f"turn {turn_id!r} of session {session_id!r} {what} ({turn[1]})")
    conflict = seq_conflict(session_id, last_seq, events)
    if conflict is not None:
        raise LogConflict(conflict)
