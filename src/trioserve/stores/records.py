"""The values a session store keeps: sessions, turns, logged events.

Plain immutable records, shared by the ``Store`` contract (``stores.base``),
every backend and the rest of trioserve.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple

import msgspec

from trioserve.errors import StoreError
from trioserve.protocol import TERMINAL_STATUSES, SessionStatus, TurnStatus

__all__ = [
    "TERMINAL_STATUSES",
    "UNSET",
    "IdempotencyClaim",
    "IdempotencyRecord",
    "LogBounds",
    "LoggedEvent",
    "Session",
    "SessionKey",
    "SessionStatus",
    "TurnBatch",
    "TurnEnd",
    "TurnRecord",
    "TurnStatus",
    "_Unset",
    "utcnow",
]


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class Session:
    """One stored session.

    ``spec`` is the CompiledSpec (as JSON-able dict) the session was created
    with, its task already interpolated with ``inputs``; it is kept whole so
    a session survives a change of the spec file.  ``adapter_state`` is an
    opaque string an adapter may use to resume its own state.
    """

    id: str
    agent_name: str
    runtime_type: str
    status: SessionStatus
    created_at: datetime
    last_active_at: datetime
    spec: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)
    adapter_state: str | None = None
    #: The highest event sequence number ever appended to the session's log
    #: (0: none).  Kept by the store (``append_events``), never by callers.
    last_seq: int = 0
    #: When the session became terminal (``None`` while it is not).  Kept by
    #: the store: set when a status change makes it terminal (``update``,
    #: ``mark_expired``), cleared when one makes it non-terminal again.
    ended_at: datetime | None = None
    #: The tenant (API key owner) the session belongs to; ``None`` when the
    #: server that created it ran without keys.  Set at creation, never changed.
    tenant: str | None = None

    @property
    def key(self) -> SessionKey:
        """Where the session stands in ``Store.list``'s order (a paging cursor)."""
        return SessionKey(self.last_active_at, self.id)


class SessionKey(NamedTuple):
    """A position in ``Store.list``'s order: newest ``last_active_at`` first, then id descending.

    ``list(before=key)`` returns the sessions that come after ``key`` in that
    order; the session ``key`` was made of need not exist any more.
    """

    last_active_at: datetime
    id: str


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """One turn of a session, as stored.

    ``first_seq``/``last_seq`` are the sequence numbers of the turn's first
    and last logged events (``None`` until it has one); ``reason`` says why
    a finished turn ended (``completed``, ``cancelled``, ``turn_timeout``,
    ``server_restart``, ``lease_expired``, ...).

    ``owner`` names the process running the turn and ``lease_expires_at``
    when its claim lapses unless renewed (``Store.renew_leases``); another
    process closes a running turn whose lease has passed (``sessions._leases``).
    Both are optional (``None``: no owner, a lease that never lapses) and
    kept as they are once the turn has finished.
    """

    id: str
    session_id: str
    input: str
    status: TurnStatus
    created_at: datetime
    started_at: datetime | None = None
    ended_at: datetime | None = None
    reason: str | None = None
    first_seq: int | None = None
    last_seq: int | None = None
    owner: str | None = None
    lease_expires_at: datetime | None = None


class LoggedEvent(msgspec.Struct, frozen=True, gc=False):
    """One event of a session's log: ``raw`` is its JSON exactly as sent (with ``seq``).

    One is made per event on the streaming path and a log keeps them all: a
    msgspec struct is made in a third of a named tuple's time, and the cyclic
    collector does not track it (``gc=False``: an int, two str and bytes make
    no cycle), where every older collection walked each tuple of the log.
    """

    seq: int
    turn_id: str
    type: str
    raw: bytes


class TurnBatch(list[LoggedEvent]):
    """Events a turn's log writer numbered itself (``sessions._turns.TurnLog``), in order:
    all of turn ``turn_id``, their seqs running on by one, each type a str with no NUL
    (an adapter's is printable ASCII) and each raw bytes.

    ``append_events`` takes such a batch of the turn it appends to without
    walking it, and checks only that its first seq continues the log: checking
    each event of a batch the server made cost a tenth of a streamed event's
    CPU.  Whoever makes one vouches for the above; any other sequence is
    checked event by event.
    """

    __slots__ = ("turn_id",)

    def __init__(self, turn_id: str, events: Iterable[LoggedEvent] = ()) -> None:
        super().__init__(events)
        self.turn_id = turn_id


@dataclass(frozen=True, slots=True)
class TurnEnd:
    """How a turn ended, written with its last events (``append_events``)."""

    status: TurnStatus
    reason: str
    ended_at: datetime


@dataclass(frozen=True, slots=True)
class LogBounds:
    """What a session's log holds: events ``earliest`` .. ``last``.

    ``last`` is the session's ``last_seq``; ``earliest`` is the lowest seq
    still retained, ``last + 1`` when none is (nothing logged, or all dropped).
    """

    earliest: int
    last: int


@dataclass(frozen=True, slots=True)
class IdempotencyClaim:
    """What a request sent with an idempotency key claims: ``tenant``'s ``key``, for the
    request ``fingerprint`` names (a digest of its route and body), from ``created_at``
    until ``expires_at``.  ``tenant`` is ``None`` for a server without API keys."""

    tenant: str | None
    key: str
    fingerprint: str
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class IdempotencyRecord:
    """A claimed idempotency key and what its request answered, exactly one of: the
    session it created (``session_id``), the turn it started (``turn_id``, of the session
    ``session_id``), or a refusal (``refusal``, the error's reason, and its ``message``)."""

    claim: IdempotencyClaim
    session_id: str | None = None
    turn_id: str | None = None
    refusal: str | None = None
    message: str | None = None


class IdempotencyKeyBound(StoreError):
    """The idempotency key is bound already (an earlier request claimed it and has not
    expired): nothing was stored; ``record`` is what the key answers."""

    def __init__(self, record: IdempotencyRecord) -> None:
        super().__init__(f"idempotency key {record.claim.key!r} is bound already")
        self.record = record


class _Unset(enum.Enum):
    UNSET = enum.auto()


UNSET: Final = _Unset.UNSET
