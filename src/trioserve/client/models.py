"""The client's typed results: ``Session`` and ``Event``.

Both are checked against the server's own models (``SessionOut`` for the
session JSON, ``wire.WireEvent`` for events) and keep the whole JSON object
they came from, so fields added by a later server are not lost.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from ..models import SessionOut
from ..stores.base import TERMINAL_STATUSES
from ..wire import ERROR, SESSION_ENDED, WireEvent
from .errors import ProtocolError


@dataclass(frozen=True, slots=True)
class Session:
    """A session as the server shows it (``GET /v1/sessions/{id}``)."""

    id: str
    agent_name: str
    runtime_type: str
    #: ``active``, ``ended``, ``paused``, ``expired`` or ``failed`` (kept as
    #: a string: a later server may add one).
    status: str
    created_at: datetime
    last_active_at: datetime
    #: The JSON object as received.
    json: dict[str, Any]

    @property
    def terminal(self) -> bool:
        """True for ``ended``, ``expired`` and ``failed``: it takes no more turns."""
        return self.status in TERMINAL_STATUSES

    @classmethod
    def from_json(cls, value: Any) -> Session:
        """Check and convert the server's session JSON; ``ProtocolError`` if it is not one."""
        try:
            out = SessionOut.model_validate(value)
            created = datetime.fromisoformat(out.createdAt)
            active = datetime.fromisoformat(out.lastActiveAt)
        except (ValidationError, ValueError) as exc:
            raise ProtocolError(f"the server sent an invalid session: {_short(exc)}") from None
        return cls(
            id=out.id,
            agent_name=out.agentName,
            runtime_type=out.runtimeType,
            status=out.status,
            created_at=created,
            last_active_at=active,
            json=dict(value),
        )


@dataclass(frozen=True, slots=True)
class Event:
    """One wire event of a turn (docs/wire-protocol.md), from either transport.

    ``seq`` is the event's top-level integer ``seq`` and ``last_event_id``
    the SSE ``id`` in force for its frame; both are ``None`` when the server
    sends none (``last_event_id`` is always ``None`` over WebSocket).
    """

    type: str
    data: dict[str, Any]
    #: The whole JSON object, unknown fields included.
    json: dict[str, Any]
    #: The JSON text as received.
    raw: str
    seq: int | None = None
    last_event_id: str | None = None

    @property
    def session_id(self) -> str | None:
        value = self.json.get("sessionId")
        return value if isinstance(value, str) else None

    @property
    def is_end(self) -> bool:
        """True for ``session.ended``: the turn's last event."""
        return self.type == SESSION_ENDED

    @property
    def end_reason(self) -> str | None:
        """``completed``, ``error`` or ``cancelled`` for ``session.ended``, else ``None``."""
        reason = self.data.get("reason") if self.is_end else None
        return reason if isinstance(reason, str) else None

    @property
    def is_error(self) -> bool:
        return self.type == ERROR

    def wire(self) -> WireEvent:
        """The event as the server's typed model."""
        return WireEvent.model_validate(self.json)

    @classmethod
    def parse(cls, text: str, *, last_event_id: str | None = None) -> Event:
        """Parse one event's JSON text; ``ProtocolError`` if it is not a v1 wire event."""
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ProtocolError(f"the server sent an event that is not JSON ({exc})") from None
        return cls.from_json(value, text, last_event_id=last_event_id)

    @classmethod
    def from_json(cls, value: Any, raw: str, *, last_event_id: str | None = None) -> Event:
        """Check a decoded event (``raw`` is its text); ``ProtocolError`` if it is not one."""
        if not isinstance(value, dict):
            raise ProtocolError("the server sent an event that is not a JSON object")
        try:
            event = WireEvent.model_validate(value)
        except ValidationError as exc:
            raise ProtocolError(f"the server sent an invalid event: {_short(exc)}") from None
        seq = value.get("seq")
        return cls(
            type=event.type,
            data=event.data,
            json=value,
            raw=raw,
            seq=seq if isinstance(seq, int) and not isinstance(seq, bool) else None,
            last_event_id=last_event_id or None,
        )


def _short(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in exc.errors()
        )
    return str(exc)
