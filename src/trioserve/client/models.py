"""The client's typed results: ``Session`` (and ``SessionPage``), ``Turn`` and ``Event``.

Each is checked against the server's own model (``SessionOut`` for the
session JSON, ``TurnOut`` for a turn record, ``WireEvent`` for events)
and keeps the whole JSON object it came from, so fields added by a later
server are not lost.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from trioserve.client.errors import ProtocolError
from trioserve.protocol import (
    ERROR,
    TERMINAL_STATUSES,
    EndOfTurn,
    SessionOut,
    TurnOut,
    WireEvent,
)


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
class SessionPage:
    """One page of ``GET /v1/sessions``: its sessions, and the token of the next page.

    ``next_page`` (the ``Trioserve-Next-Page`` header) is ``None`` on the
    last page; pass it as ``before=`` for the next one.
    """

    sessions: list[Session]
    next_page: str | None


@dataclass(frozen=True, slots=True)
class Turn:
    """A turn record (``GET /v1/sessions/{id}/turns/{turnId}``; docs/api.md, "Turns")."""

    id: str
    session_id: str
    input: str
    #: ``queued``, ``running``, ``completed``, ``failed``, ``cancelled`` or
    #: ``interrupted`` (kept as a string: a later server may add one).
    status: str
    #: Why it finished (``completed``, ``adapter_exit``, ``client_disconnected``,
    #: …); ``None`` while it runs.
    reason: str | None
    #: When it was admitted, when its adapter started (``None`` if it never
    #: did), when it finished (``None`` while it runs).
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    #: The seqs of its first and last logged events (``None`` before the first).
    first_seq: int | None
    last_seq: int | None
    #: The JSON object as received.
    json: dict[str, Any]

    @property
    def running(self) -> bool:
        """True while the turn is in flight (``status == "running"``)."""
        return self.status == "running"

    @property
    def finished(self) -> bool:
        """True once the turn has ended: not ``queued`` (waiting its turn), not running, not
        ``waiting`` (for an approval)."""
        return self.status not in ("queued", "running", "waiting")

    @classmethod
    def from_json(cls, value: Any) -> Turn:
        """Check and convert the server's turn JSON; ``ProtocolError`` if it is not one."""
        try:
            out = TurnOut.model_validate(value)
            created = datetime.fromisoformat(out.createdAt)
            started = None if out.startedAt is None else datetime.fromisoformat(out.startedAt)
            ended = None if out.endedAt is None else datetime.fromisoformat(out.endedAt)
        except (ValidationError, ValueError) as exc:
            raise ProtocolError(f"the server sent an invalid turn: {_short(exc)}") from None
        return cls(
            id=out.id,
            session_id=out.sessionId,
            input=out.input,
            status=out.status,
            reason=out.reason,
            created_at=created,
            started_at=started,
            ended_at=ended,
            first_seq=out.firstSeq,
            last_seq=out.lastSeq,
            json=dict(value),
        )


@dataclass(frozen=True, slots=True)
class Approval:
    """A tool call that waits, or waited, for a person (``GET …/approvals``; docs/api.md,
    "Approvals")."""

    id: str
    session_id: str
    turn_id: str
    #: The tool and the arguments the model gave it.
    tool: str
    arguments: Any
    #: ``pending``, ``approved`` or ``denied``.
    status: str
    expires_at: datetime
    #: Why the server denied it (``expired``, ``interrupted``, …); ``None`` for a person.
    reason: str | None
    #: ``TENANT/sha256:KEYID`` of the key that decided; ``None`` without keys.
    decided_by: str | None
    #: The JSON object as received.
    json: dict[str, Any]

    @property
    def pending(self) -> bool:
        return self.status == "pending"

    @classmethod
    def from_json(cls, value: Any) -> Approval:
        """Check and convert the server's approval JSON; ``ProtocolError`` if it is not one."""
        try:
            if not isinstance(value, dict):
                raise ValueError("not a JSON object")
            found = cls(
                id=str(value["approvalId"]),
                session_id=str(value["sessionId"]),
                turn_id=str(value["turnId"]),
                tool=str(value["tool"]),
                arguments=value.get("arguments"),
                status=str(value["status"]),
                expires_at=datetime.fromisoformat(value["expiresAt"]),
                reason=value.get("reason"),
                decided_by=value.get("decidedBy"),
                json=dict(value),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"the server sent an invalid approval: {exc!r}") from None
        return found


@dataclass(frozen=True, slots=True)
class Event(EndOfTurn):
    """One wire event of a turn (docs/wire-protocol.md), from either transport.

    ``seq`` is the event's top-level integer ``seq`` (its number in the
    session's event log) and ``last_event_id`` the SSE ``id`` in force for
    its frame; both are ``None`` when the server sends none
    (``last_event_id`` is always ``None`` over WebSocket and in an export).
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
