"""How the SQL stores encode values: the columns, times as microseconds, rows to records.

Times are integer microseconds since the Unix epoch (UTC), so ordering is
exact and values round-trip to the microsecond; ``spec`` and ``inputs``
are JSON text.  Shared by the SQLite and PostgreSQL stores (whose rows
have the same columns in the same order); the memory store keeps its events
as the same rows (``events_upto``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from itertools import starmap
from typing import Any, Final

from pydantic_core import from_json

from trioserve.errors import SessionNotFound, TurnNotFound
from trioserve.stores.checks import SessionChange
from trioserve.stores.records import (
    TERMINAL_STATUSES,
    UNSET,
    LogBounds,
    LoggedEvent,
    Session,
    SessionStatus,
    TurnEnd,
    TurnRecord,
    TurnStatus,
)

_COLUMNS: Final = (
    "id, agent_name, runtime_type, status, created_at, last_active_at, spec, inputs, "
    "adapter_state, last_seq, ended_at, tenant"
)
#: In ``TurnRecord``'s field order.
_TURN_COLUMNS: Final = (
    "id, session_id, input, status, created_at, started_at, ended_at, reason, first_seq, last_seq, "
    "owner, lease_expires_at"
)
_TURN_ORDER: Final = "ORDER BY created_at, id"


def _text(value: str | bytes | None) -> Any:
    """A text column's value: PostgreSQL keeps a turn's ``input`` and ``reason`` as UTF-8
    ``bytea`` (its text cannot hold a NUL; :func:`utf8_turn_row`), SQLite as text."""
    return value.decode() if isinstance(value, bytes) else value


def _turn(row: tuple[Any, ...]) -> TurnRecord:
    tid, sid, text, status, created, started, ended, reason, first_seq, last_seq, *lease = row
    owner, lease_expires_at = lease
    return TurnRecord(
        id=tid,
        session_id=sid,
        input=_text(text),
        status=TurnStatus(status),
        created_at=_from_micros(created),
        started_at=_opt_from_micros(started),
        ended_at=_opt_from_micros(ended),
        reason=_text(reason),
        first_seq=first_seq,
        last_seq=last_seq,
        owner=owner,
        lease_expires_at=_opt_from_micros(lease_expires_at),
    )


_ORDER: Final = "ORDER BY last_active_at DESC, id DESC"
_TERMINAL: Final = ", ".join(sorted(f"'{s.value}'" for s in TERMINAL_STATUSES))
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_STATUSES: Final = {status.value: status for status in SessionStatus}
_MICROSECOND: Final = timedelta(microseconds=1)


# --- encoding ---------------------------------------------------------------


def _to_micros(value: datetime, what: str) -> int:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be a timezone-aware datetime, got {value!r}")
    return (value - _EPOCH) // _MICROSECOND


def _from_micros(value: int) -> datetime:
    return _EPOCH + timedelta(0, 0, value)  # microseconds (positional: faster)


def _opt_micros(value: datetime | None, what: str) -> int | None:
    return None if value is None else _to_micros(value, what)


def _opt_from_micros(value: int | None) -> datetime | None:
    return None if value is None else _from_micros(value)


def _session(row: tuple[Any, ...]) -> Session:
    sid, agent, runtime, status, created, last_active, spec, inputs, state, *rest = row
    last_seq, ended, tenant = rest
    return Session(
        id=sid,
        agent_name=agent,
        runtime_type=runtime,
        status=_STATUSES[status],
        created_at=_from_micros(created),
        last_active_at=_from_micros(last_active),
        spec=from_json(spec),  # what json.loads gives, at a quarter of its cost
        inputs=from_json(inputs),
        adapter_state=state,
        last_seq=last_seq,
        ended_at=_opt_from_micros(ended),
        tenant=tenant,
    )


# --- records to rows ----------------------------------------------------------


def session_row(session: Session, spec_json: str, inputs_json: str) -> tuple[Any, ...]:
    """A new session's row, in ``_COLUMNS`` order."""
    return (
        session.id,
        session.agent_name,
        session.runtime_type,
        session.status.value,
        _to_micros(session.created_at, "created_at"),
        _to_micros(session.last_active_at, "last_active_at"),
        spec_json,
        inputs_json,
        session.adapter_state,
        0,
        _opt_micros(session.ended_at, "ended_at"),
        session.tenant,
    )


def update_params(session_id: str, change: SessionChange) -> dict[str, Any]:
    """``update``'s named parameters (both SQL stores' statements use these names)."""
    status, last_active_at, adapter_state, now = change
    return {
        "id": session_id,
        "status": None if status is None else status.value,
        "last_active_at": _opt_micros(last_active_at, "last_active_at"),
        "set_state": adapter_state is not UNSET,
        "adapter_state": None if adapter_state is UNSET else adapter_state,
        "now": _to_micros(now, "now"),
    }


def turn_row(turn: TurnRecord) -> tuple[Any, ...]:
    """A new turn's row: ``_TURN_COLUMNS`` but ``first_seq``/``last_seq`` (the store's)."""
    return (
        turn.id,
        turn.session_id,
        turn.input,
        turn.status.value,
        _to_micros(turn.created_at, "created_at"),
        _opt_micros(turn.started_at, "started_at"),
        _opt_micros(turn.ended_at, "ended_at"),
        turn.reason,
        turn.owner,
        _opt_micros(turn.lease_expires_at, "lease_expires_at"),
    )


def utf8_turn_row(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """:func:`turn_row`'s row with ``input`` and ``reason`` as UTF-8 bytes (PostgreSQL's
    ``bytea`` columns: its text cannot hold a NUL, which a client may send)."""
    tid, sid, text, status, created, started, ended, reason, *rest = row
    encoded = None if reason is None else reason.encode()
    return (tid, sid, text.encode(), status, created, started, ended, encoded, *rest)


def end_params(end: TurnEnd | None) -> tuple[str, str, int] | None:
    """How a turn ends, as ``append_events``' statement takes it."""
    if end is None:
        return None
    return (end.status.value, end.reason, _to_micros(end.ended_at, "ended_at"))


def append_params(
    session_id: str,
    turn_id: str,
    batch: Sequence[LoggedEvent],
    started: int | None,
    end: tuple[str, str, int] | None,
) -> dict[str, Any]:
    """``append_events``' named parameters for its turn and session updates (both SQL stores')."""
    return {
        "turn": turn_id,
        "session": session_id,
        "first": batch[0].seq if batch else None,
        "last": batch[-1].seq if batch else None,
        "started": started,
        "status": None if end is None else end[0],
        "reason": None if end is None else end[1],
        "ended": None if end is None else end[2],
    }


def events_upto(rows: Iterable[tuple[Any, ...]], max_bytes: int | None) -> list[LoggedEvent]:
    """Events of ``(seq, turn_id, type, raw)`` rows, stopping once their ``raw`` reach
    ``max_bytes`` (so at least one event when there is one); all of them with ``None``.

    Reads ``rows`` (a cursor) only as far as needed."""
    if max_bytes is None:
        return list(starmap(LoggedEvent, rows))  # by starmap, in C: a replay can be 100,000 events
    events: list[LoggedEvent] = []
    size = 0
    for seq, tid, kind, raw in rows:
        events.append(LoggedEvent(seq, tid, kind, raw))
        size += len(raw)
        if size >= max_bytes:
            break
    return events


def found_turn(row: tuple[Any, ...] | None, session_id: str, turn_id: str) -> TurnRecord:
    """The turn of a ``_TURN_COLUMNS`` row; ``TurnNotFound`` for no row."""
    if row is None:
        raise TurnNotFound(f"turn {turn_id} of session {session_id} not found")
    return _turn(row)


def log_bounds(row: tuple[Any, ...] | None, session_id: str) -> LogBounds:
    """A session's ``(last_seq, min(seq) of its events)`` row as ``LogBounds``;
    ``SessionNotFound`` for no row."""
    if row is None:
        raise SessionNotFound(f"session {session_id} not found")
    last, earliest = row
    return LogBounds(earliest=last + 1 if earliest is None else earliest, last=last)
