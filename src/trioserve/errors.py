"""The exceptions trioserve raises inside, each with a stable ``reason``.

Transports (HTTP, WebSocket) turn these into the error envelope; the code
that raises them knows nothing about status codes.  ``reason`` is the
machine-readable word a client can branch on.
"""

from __future__ import annotations


class TrioserveError(Exception):
    """Base of every error trioserve raises on purpose."""

    reason: str = "internal"

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


class Draining(TrioserveError):
    """The server is shutting down and takes no new sessions or turns."""

    reason = "draining"


class NoTurn(TrioserveError):
    """The session has no turn running (nothing to cancel)."""

    reason = "no_turn"


class CursorExpired(TrioserveError):
    """Events after the requested cursor were dropped by the retention."""

    reason = "cursor_expired"

    def __init__(self, message: str, *, earliest_seq: int) -> None:
        super().__init__(message)
        self.earliest_seq = earliest_seq


# --- store errors -----------------------------------------------------------


class StoreError(TrioserveError):
    """A session store refused an operation."""


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
