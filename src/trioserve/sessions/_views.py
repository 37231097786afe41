"""Sessions and turns as the API shows them (``GET …/turns/{turnId}``, a webhook's
``data``): the records of the store in the protocol's bodies."""

from __future__ import annotations

from datetime import UTC, datetime

from trioserve.protocol import SessionOut, TurnOut
from trioserve.stores.base import Session, TurnRecord

__all__ = ["rfc3339", "session_out", "turn_out"]


def turn_out(turn: TurnRecord) -> TurnOut:
    """A turn record as the API shows it."""
    return TurnOut(
        id=turn.id,
        sessionId=turn.session_id,
        input=turn.input,
        status=turn.status.value,
        reason=turn.reason,
        createdAt=rfc3339(turn.created_at),
        startedAt=None if turn.started_at is None else rfc3339(turn.started_at),
        endedAt=None if turn.ended_at is None else rfc3339(turn.ended_at),
        firstSeq=turn.first_seq,
        lastSeq=turn.last_seq,
    )


def session_out(session: Session) -> SessionOut:
    """A session as the API shows it."""
    return SessionOut(
        id=session.id,
        agentName=session.agent_name,
        runtimeType=session.runtime_type,
        status=session.status.value,
        createdAt=rfc3339(session.created_at),
        lastActiveAt=rfc3339(session.last_active_at),
    )


def rfc3339(value: datetime) -> str:
    """UTC, to the millisecond, with a ``Z``."""
    utc = value if value.tzinfo is UTC else value.astimezone(UTC)  # stores hand out UTC
    return utc.isoformat(timespec="milliseconds").replace("+00:00", "Z")
