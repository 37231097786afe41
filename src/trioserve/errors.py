"""The exceptions trioserve raises inside, each with a stable ``reason``.

Transports (HTTP, WebSocket) turn these into the error envelope; the code
that raises them knows nothing about status codes.  ``reason`` is the
machine-readable word a client can branch on.
"""

from __future__ import annotations

from typing import Final


class TrioserveError(Exception):
    """Base of every error trioserve raises on purpose."""

    reason: str = "internal"
    #: An idempotency key's remembered refusal, answered again (``Idempotent-Replayed``).
    replayed: bool = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequest(TrioserveError):
    """The request is malformed: bad JSON, a wrong field, a missing input."""

    reason = "invalid_request"


class NotFound(TrioserveError):
    """No such session (or it is in a terminal state, where the call needs an active one)."""

    reason = "not_found"


class SessionBusy(TrioserveError):
    """Another turn of the same session is in flight (per-session single-flight)."""

    reason = "session_busy"


class QueueFull(TrioserveError):
    """The session holds ``--max-queued-turns`` waiting turns already (``multitask: enqueue``)."""

    reason = "queue_full"


class TurnCapReached(TrioserveError):
    """The global concurrent-turn cap is reached."""

    reason = "turn_cap"


class SessionCapReached(TrioserveError):
    """The active-session cap is reached."""

    reason = "session_cap"


class TenantTurnCapReached(TurnCapReached):
    """The tenant runs ``--max-turns-per-tenant`` turns already."""

    reason = "tenant_turn_cap"


class TenantSessionCapReached(SessionCapReached):
    """The tenant has ``--max-sessions-per-tenant`` active sessions already."""

    reason = "tenant_session_cap"


class TenantStreamCapReached(TrioserveError):
    """The tenant holds ``--max-streams-per-tenant`` streams open already."""

    reason = "tenant_stream_cap"


class Draining(TrioserveError):
    """The server is shutting down and takes no new sessions or turns."""

    reason = "draining"


class NoTurn(TrioserveError):
    """The session has no turn running (nothing to cancel)."""

    reason = "no_turn"


class TurnEnded(TrioserveError):
    """The turn has ended already (nothing to cancel)."""

    reason = "turn_ended"


class ApprovalNotFound(NotFound):
    """No such approval in the session (or the session is another tenant's)."""

    reason = "not_found"


class ApprovalDecided(TrioserveError):
    """The approval was decided already (a second decision)."""

    reason = "approval_decided"


class IdempotencyKeyReused(TrioserveError):
    """An ``Idempotency-Key`` sent again with a different request (another body, route or
    session) within the idempotency window."""

    reason = "idempotency_key_reused"


class CursorExpired(TrioserveError):
    """Events after the requested cursor were dropped by the retention."""

    reason = "cursor_expired"

    def __init__(self, message: str, *, earliest_seq: int) -> None:
        super().__init__(message)
        self.earliest_seq = earliest_seq


# --- store errors -----------------------------------------------------------


class StoreError(TrioserveError):
    """A session store refused an operation."""


class StoreUnavailable(StoreError):
    """The session store refuses writes for now (down, full, read-only); try again later."""

    reason = "store_unavailable"


class SessionNotFound(StoreError, NotFound):
    """The store has no session with that id."""

    reason = "not_found"


class DuplicateSession(StoreError):
    """A session with that id already exists."""


class TurnNotFound(StoreError, NotFound):
    """The store has no such turn for that session."""

    reason = "not_found"


class DuplicateTurn(StoreError):
    """A turn with that id already exists."""


class LogConflict(StoreError):
    """Events that do not continue a session's log (a seq out of order or reused),
    or events for a turn that has already ended."""


class SessionExpired(StoreError):
    """The session is ``expired``; a store never moves it to another status."""


class CronNotFound(StoreError, NotFound):
    """The store has no cron with that id (or it is another tenant's)."""

    reason = "not_found"


class CronCapReached(TrioserveError):
    """The tenant has ``--max-crons-per-tenant`` crons already."""

    reason = "cron_cap"


#: The refusals an idempotency key remembers, by ``reason``: a repeat of the request
#: gets the same refusal, so a client never sees one request both refused and run.
REMEMBERED_REFUSALS: Final[dict[str, type[TrioserveError]]] = {
    cls.reason: cls
    for cls in (
        SessionBusy,
        TurnCapReached,
        TenantTurnCapReached,
        SessionCapReached,
        TenantSessionCapReached,
    )
}


# --- spec errors ------------------------------------------------------------


class SpecError(TrioserveError):
    """An agent spec failed to load, validate or compile.

    ``problems`` lists every problem found, each as ``"<field path>: <what was
    expected>"``; the message joins them.
    """

    reason = "invalid_spec"

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        count = len(problems)
        noun = "problem" if count == 1 else "problems"
        super().__init__(f"{source}: {count} {noun}: " + "; ".join(problems))
