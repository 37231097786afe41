"""How the SQL stores encode values: the columns, times as microseconds, rows to records.

Times are integer microseconds since the Unix epoch (UTC), so ordering is
exact and values round-trip to the microsecond; ``spec`` and ``inputs``
are JSON text.  Shared by the SQLite and PostgreSQL stores (whose rows
have the same columns in the same order).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Final

from pydantic_core import from_json

from trioserve.stores.records import (
    TERMINAL_STATUSES,
    Session,
    SessionStatus,
    TurnRecord,
    TurnStatus,
)

_COLUMNS: Final = (
    "id, agent_name, runtime_type, status, created_at, last_active_at, spec, inputs, "
    "adapter_state, last_seq, ended_at, tenant"
)
#: In ``TurnRecord``'s field order.
_TURN_COLUMNS: Final = (
    "id, session_id, input, status, created_at, started_at, ended_at, reason, first_seq, last_seq"
)
_TURN_ORDER: Final = "ORDER BY created_at, id"


def _turn(row: tuple[Any, ...]) -> TurnRecord:
    tid, sid, text, status, created, started, ended, reason, first_seq, last_seq = row
    return TurnRecord(
        id=tid,
        session_id=sid,
        input=text,
        status=TurnStatus(status),
        created_at=_from_micros(created),
        started_at=_opt_from_micros(started),
        ended_at=_opt_from_micros(ended),
        reason=reason,
        first_seq=first_seq,
        last_seq=last_seq,
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
