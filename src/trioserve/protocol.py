"""The vocabulary server and client share: one place for every name on the wire.

What an adapter prints (wire events, protocol v1), what the HTTP API takes
and answers (request bodies, session and turn bodies, the error envelope,
headers), and what the WebSocket carries (client messages, control
messages, close codes).  The server (``trioserve.http``,
``trioserve.sessions``) and the client (``trioserve.client``) both import
it; it imports nothing of trioserve, so either side can be read alone.

Docs: docs/wire-protocol.md (events), docs/api.md (HTTP and WebSocket).
"""

from __future__ import annotations

import enum
from typing import Any, Final, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

# -- wire events (what adapters print) -----------------------------------------

PROTOCOL_VERSION: Final = 1
EVENTS_API_VERSION: Final = "agent-controller.dev/events/v1alpha1"

#: Event types of protocol v1.  Others are passed through (forward compatible).
KNOWN_TYPES: Final = frozenset(
    {
        "session.started",
        "session.ended",
        "session.resumed",
        "session.paused",
        "session.expired",
        "message",
        "model.request",
        "model.response",
        "tool.call",
        "tool.result",
        "tool.started",
        "tool.completed",
        "tool.failed",
        "artifact.created",
        "audit.event",
        "warning",
        "error",
    }
)

#: The last event of every turn; ``data.reason`` is an ``EndReason``.
SESSION_ENDED: Final = "session.ended"
ERROR: Final = "error"
EndReason = Literal["completed", "error", "cancelled"]

#: The largest ``seq`` (and ``after`` cursor) accepted: a signed 64-bit integer.
MAX_SEQ: Final = 2**63 - 1


class WireEvent(BaseModel):
    """The typed shape of a v1 wire event (extra fields are kept)."""

    model_config = ConfigDict(extra="allow")

    v: Literal[1]
    apiVersion: str | None = None
    type: str
    ts: str | None = None
    sessionId: str | None = None
    traceparent: str | None = None
    data: dict[str, Any] = {}


class _TypeAndData(Protocol):
    @property
    def type(self) -> str: ...

    @property
    def data(self) -> dict[str, Any]: ...


class EndOfTurn:
    """``is_end`` and ``end_reason`` of an event: one rule for the server's and the client's.

    A base of ``trioserve.runtime._wire.Event`` (a named tuple) and of
    ``trioserve.client.Event`` (a dataclass); each has ``type`` and ``data``.
    """

    __slots__ = ()

    @property
    def is_end(self: _TypeAndData) -> bool:
        """True for ``session.ended``: the turn's last event."""
        return self.type == SESSION_ENDED

    @property
    def end_reason(self: _TypeAndData) -> str | None:
        """``data.reason`` of ``session.ended`` (``completed``, ``error``, ``cancelled``), if a
        string; else ``None``."""
        reason = self.data.get("reason") if self.type == SESSION_ENDED else None
        return reason if isinstance(reason, str) else None


# -- sessions and turns -----------------------------------------------------------


class SessionStatus(enum.StrEnum):
    ACTIVE = "active"
    ENDED = "ended"
    PAUSED = "paused"
    EXPIRED = "expired"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES: Final = frozenset(
    {SessionStatus.ENDED, SessionStatus.EXPIRED, SessionStatus.FAILED}
)


class TurnStatus(enum.StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    #: Left ``running`` by a process that died; closed at the next start.
    INTERRUPTED = "interrupted"

    @property
    def finished(self) -> bool:
        return self is not TurnStatus.RUNNING


#: What happens to a turn when its client goes away (``--on-disconnect``).
OnDisconnect = Literal["cancel", "continue"]
ON_DISCONNECT_CHOICES: Final[tuple[OnDisconnect, ...]] = ("cancel", "continue")

# -- HTTP ----------------------------------------------------------------------------

#: The id of the turn a ``POST .../turns`` started.
TURN_ID_HEADER: Final = "Trioserve-Turn-Id"
#: The token of the next page of ``GET /v1/sessions`` (also in ``Link: rel="next"``).
NEXT_PAGE_HEADER: Final = "Trioserve-Next-Page"


class RequestBody(BaseModel):
    """Base of every request body and client message: strict types, no unknown fields
    (``http._models.parse_body`` reads them as Go does)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class CreateSessionBody(RequestBody):
    """``POST /v1/sessions``: optional values for ``${inputs.<key>}`` in the task."""

    inputs: dict[str, str] = Field(default_factory=dict)

    @field_validator("inputs", mode="before")
    @classmethod
    def _null_values_are_empty(cls, value: Any) -> Any:
        # Go decodes a null map value as the zero string.
        if isinstance(value, dict):
            return {k: "" if v is None else v for k, v in value.items()}
        return value


class TurnBody(RequestBody):
    """``POST /v1/sessions/{id}/turns``: the turn's input (empty: the session's task).

    ``onDisconnect`` says what happens to the turn when its client leaves
    (default: the server's ``--on-disconnect``); ``detach`` answers ``202``
    at once and runs the turn with no client attached.
    """

    input: str = ""
    onDisconnect: OnDisconnect | None = None
    detach: bool = False


class TurnOut(BaseModel):
    """A turn record as the API shows it."""

    id: str
    sessionId: str
    input: str
    status: str
    reason: str | None
    createdAt: str
    startedAt: str | None
    endedAt: str | None
    firstSeq: int | None
    lastSeq: int | None


class SessionOut(BaseModel):
    """A session as the API shows it (the reference's fields plus ``lastActiveAt``)."""

    id: str
    agentName: str
    runtimeType: str
    status: str
    createdAt: str
    lastActiveAt: str


class ErrorDetail(BaseModel):
    """``error`` in the envelope; ``earliestSeq`` only for ``cursor_expired``."""

    code: int
    reason: str
    message: str
    earliestSeq: int | None = None


class ErrorEnvelope(BaseModel):
    """Every refusal: ``{"error": {"code", "reason", "message"}}``."""

    error: ErrorDetail


# -- WebSocket -------------------------------------------------------------------------

WS_PATH: Final = "/v1/sessions/<session_id>/ws"


class WSTurn(RequestBody):
    """WebSocket ``{"type":"turn"}``: start a turn, as ``POST .../turns`` (no ``detach``)."""

    type: Literal["turn"]
    input: str = ""
    onDisconnect: OnDisconnect | None = None


class WSCancel(RequestBody):
    """WebSocket ``{"type":"cancel"}``: cancel the session's running turn."""

    type: Literal["cancel"]


class WSPing(RequestBody):
    """WebSocket ``{"type":"ping"}``: answered with ``trioserve.pong``."""

    type: Literal["ping"]


class WSResume(RequestBody):
    """WebSocket ``{"type":"resume"}``: as ``GET .../events?after=N[&turn=ID]``."""

    type: Literal["resume"]
    after: int = Field(default=0, ge=0, le=MAX_SEQ)
    turn: str | None = None


WSMessage = WSTurn | WSCancel | WSPing | WSResume
WS_MESSAGES: Final[dict[str, type[WSMessage]]] = {
    "turn": WSTurn,
    "cancel": WSCancel,
    "ping": WSPing,
    "resume": WSResume,
}

#: Server messages that are not wire events all have a type with this prefix.
CONTROL_PREFIX: Final = "trioserve."
#: ``{"type": CONTROL_ERROR, "error": {...}}``: the error envelope, as a message.
CONTROL_ERROR: Final = "trioserve.error"
#: After a turn's events: ``turnId``, ``status``, ``reason``, ``lastSeq``.
TURN_END: Final = "trioserve.turn.end"
#: After a resume's events: ``lastSeq``.
RESUME_END: Final = "trioserve.resume.end"
#: The answer to ``{"type":"ping"}``.
PONG: Final = "trioserve.pong"

#: Close codes the server sends (1009, a message over the size limit, is
#: hypercorn's), and the HTTP status and error reason each stands for.
CLOSE_SHUTDOWN: Final = 1001
CLOSE_TOO_BIG: Final = 1009
CLOSE_INTERNAL: Final = 1011
CLOSE_NOT_FOUND: Final = 4404
CLOSE_DRAINING: Final = 4503
CLOSE_CODES: Final[dict[int, tuple[int, str]]] = {
    CLOSE_NOT_FOUND: (404, "not_found"),
    CLOSE_DRAINING: (503, "draining"),
    CLOSE_SHUTDOWN: (503, "draining"),
    CLOSE_TOO_BIG: (413, "payload_too_large"),
    CLOSE_INTERNAL: (500, "internal"),
}
