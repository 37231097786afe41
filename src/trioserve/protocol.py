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
import re
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
#: A turn waits for a person's decision on a tool call; the decision (docs/api.md).
APPROVAL_REQUESTED: Final = "approval.requested"
APPROVAL_RESOLVED: Final = "approval.resolved"
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
    #: Accepted with ``multitask: enqueue`` behind the session's running turn; not started.
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    #: Left ``running`` by a process that died; closed at the next start.
    INTERRUPTED = "interrupted"
    #: Paused on a tool call until a person decides (an approval): no adapter, no slot.
    WAITING = "waiting"

    @property
    def finished(self) -> bool:
        return self not in (TurnStatus.RUNNING, TurnStatus.QUEUED, TurnStatus.WAITING)


#: What happens to a turn when its client goes away (``--on-disconnect``).
OnDisconnect = Literal["cancel", "continue"]
ON_DISCONNECT_CHOICES: Final[tuple[OnDisconnect, ...]] = ("cancel", "continue")

#: What a turn does when its session is busy (``--multitask`` sets the default):
#: ``reject`` it (409 ``session_busy``), ``enqueue`` it behind the turns before it,
#: or ``interrupt`` the running turn and start at once.
Multitask = Literal["reject", "enqueue", "interrupt"]
MULTITASK_CHOICES: Final[tuple[Multitask, ...]] = ("reject", "enqueue", "interrupt")
#: Which of the server's faces started a turn (the turn metrics' ``protocol`` label): the
#: v0.8 API (REST, SSE, WebSocket), MCP, AG-UI or A2A.
TurnProtocol = Literal["api", "mcp", "ag-ui", "a2a"]
TURN_PROTOCOLS: Final[tuple[TurnProtocol, ...]] = ("api", "mcp", "ag-ui", "a2a")
#: Why ``multitask: rollback`` (LangGraph's) is refused.
ROLLBACK_REFUSED: Final = (
    "rollback is not supported: the adapter keeps its own memory of the session, "
    "which the server cannot roll back; use interrupt"
)


def _check_multitask(value: Any) -> Any:
    if value == "rollback":
        raise ValueError(ROLLBACK_REFUSED)
    return value


# -- HTTP ----------------------------------------------------------------------------

#: The id of the turn a ``POST .../turns`` started.
TURN_ID_HEADER: Final = "Trioserve-Turn-Id"
#: The token of the next page of ``GET /v1/sessions`` (also in ``Link: rel="next"``).
NEXT_PAGE_HEADER: Final = "Trioserve-Next-Page"
#: A client's key for ``POST /v1/sessions`` or ``POST .../turns`` (the WebSocket turn's
#: ``idempotencyKey``): a repeat with the same key answers what the first one did.
IDEMPOTENCY_KEY_HEADER: Final = "Idempotency-Key"
#: ``true`` on an answer repeated from an idempotency key (nothing ran for it).
IDEMPOTENT_REPLAYED_HEADER: Final = "Idempotent-Replayed"
_IDEMPOTENCY_KEY: Final = re.compile(r"[\x20-\x7e]{1,255}")


def check_idempotency_key(key: str) -> str:
    """``key`` if it is 1 to 255 printable ASCII characters (space included), else
    ``ValueError`` saying so."""
    if not _IDEMPOTENCY_KEY.fullmatch(key):
        shown = repr(key if len(key) <= 40 else key[:40] + "...")
        raise ValueError(
            f"expected 1 to 255 printable ASCII characters (space included), got {shown}"
        )
    return key


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
    #: What happens when the session is busy (default: the server's ``--multitask``).
    multitask: Multitask | None = None
    #: A URL the turn's end is POSTed to, signed (its host must be in ``--webhook-allow``).
    webhook: str | None = None

    @field_validator("multitask", mode="before")
    @classmethod
    def _no_rollback(cls, value: Any) -> Any:
        return _check_multitask(value)


class ApprovalDecisionBody(RequestBody):
    """``POST /v1/sessions/{id}/approvals/{approvalId}``: a person's decision.

    ``arguments`` (approve only) replace the call's arguments; ``message`` is
    given to the model with a denial (and recorded either way).
    """

    decision: Literal["approve", "deny"]
    arguments: dict[str, Any] | None = None
    message: str | None = Field(default=None, max_length=4096)


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


#: What a cron's fire does when its session is busy: start no turn, or queue one.
CronMultitask = Literal["skip", "enqueue"]
#: What a cron does with fires missed while no server process was up.
CatchUp = Literal["skip", "once"]


class CronBody(RequestBody):
    """``POST /v1/crons``: a schedule of turns (docs/api.md, "Crons").

    ``sessionId``: each fire is a turn on that session; else each fire is a
    turn on a new session with ``inputs``.  ``endAt``: an RFC 3339 time.
    """

    schedule: str
    timezone: str = "UTC"
    input: str = ""
    sessionId: str | None = None
    inputs: dict[str, str] | None = None
    multitask: CronMultitask = "skip"
    webhook: str | None = None
    enabled: bool = True
    endAt: str | None = None
    catchUp: CatchUp = "skip"


class CronPatchBody(RequestBody):
    """``PATCH /v1/crons/{id}``: the fields to change (absent or ``null``: kept; ``""``
    clears ``endAt`` and ``webhook``)."""

    schedule: str | None = None
    timezone: str | None = None
    input: str | None = None
    multitask: CronMultitask | None = None
    webhook: str | None = None
    enabled: bool | None = None
    endAt: str | None = None
    catchUp: CatchUp | None = None


class CronRunOut(BaseModel):
    """One fire of a cron: its slot, when its turn started and how late, what became of it."""

    scheduledAt: str
    firedAt: str | None
    status: str  # claimed | started | queued | skipped | failed
    reason: str | None
    sessionId: str | None
    turnId: str | None
    turnStatus: str | None
    latenessSeconds: float | None
    missed: int


class CronOut(BaseModel):
    """A cron as the API shows it (``lastRuns``: ``GET /v1/crons/{id}`` only)."""

    id: str
    schedule: str
    timezone: str
    input: str
    sessionId: str | None
    inputs: dict[str, str] | None
    multitask: str
    webhook: str | None
    enabled: bool
    endAt: str | None
    catchUp: str
    createdAt: str
    updatedAt: str
    nextRunAt: str | None
    lastRuns: list[CronRunOut] | None = None


class TurnWebhook(BaseModel):
    """The body a turn's webhook POSTs when the turn ends (Standard Webhooks' shape)."""

    #: The event: ``turn.ended`` (other events may come: branch on it).
    type: str
    #: When the body was made (RFC 3339, UTC).
    timestamp: str
    sessionId: str
    #: The turn record, exactly as ``GET .../turns/{turnId}`` shows it.
    data: TurnOut


class TurnWaitingWebhook(TurnWebhook):
    """``turn.waiting``: the turn waits for a person's decision on a tool call."""

    #: The approval as ``GET .../approvals`` shows it (pending).
    approval: dict[str, Any]


class SessionOut(BaseModel):
    """A session as the API shows it (the reference's fields plus ``lastActiveAt``)."""

    id: str
    agentName: str
    runtimeType: str
    status: str
    createdAt: str
    lastActiveAt: str


class AgentModelOut(BaseModel):
    """``model`` of ``GET /v1/agent``: the spec's provider and model name."""

    provider: str
    name: str


class AgentOut(BaseModel):
    """``GET /v1/agent``: the served spec's public fields (never its env, paths or options)."""

    name: str
    description: str | None
    runtimeType: str
    model: AgentModelOut
    task: str
    #: The ``${inputs.NAME}`` names of ``task``, in order of first use: a create's ``inputs``.
    inputs: list[str]


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
    #: As ``POST .../turns``' ``multitask``.
    multitask: Multitask | None = None
    #: As ``POST .../turns``' ``webhook``.
    webhook: str | None = None
    #: As ``POST .../turns``' ``Idempotency-Key`` header.
    idempotencyKey: str | None = None

    @field_validator("multitask", mode="before")
    @classmethod
    def _no_rollback(cls, value: Any) -> Any:
        return _check_multitask(value)

    @field_validator("idempotencyKey")
    @classmethod
    def _key_is_printable_ascii(cls, value: str | None) -> str | None:
        return None if value is None else check_idempotency_key(value)


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
#: The first event of an enqueued turn's stream (not logged, no ``seq``):
#: ``data.position`` (1 = next) and ``data.turnId``.
TURN_QUEUED: Final = "trioserve.queued"
#: The answer to ``{"type":"ping"}``.
PONG: Final = "trioserve.pong"

#: Close codes the server sends (1009, a message over the size limit, is
#: hypercorn's), and the HTTP status and error reason each stands for.
CLOSE_SHUTDOWN: Final = 1001
CLOSE_TOO_BIG: Final = 1009
CLOSE_INTERNAL: Final = 1011
CLOSE_KEY_REVOKED: Final = 4401
CLOSE_NOT_FOUND: Final = 4404
CLOSE_DRAINING: Final = 4503
CLOSE_CODES: Final[dict[int, tuple[int, str]]] = {
    CLOSE_KEY_REVOKED: (401, "unauthorized"),
    CLOSE_NOT_FOUND: (404, "not_found"),
    CLOSE_DRAINING: (503, "draining"),
    CLOSE_SHUTDOWN: (503, "draining"),
    CLOSE_TOO_BIG: (413, "payload_too_large"),
    CLOSE_INTERNAL: (500, "internal"),
}
