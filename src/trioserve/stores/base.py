"""The session store contract (CONTRACT §4) shared by every backend.

A store is the durable truth about sessions, their turns and the event
log of each session.  All methods are async and
safe to call from many Trio tasks at once; blocking backends run their
calls in a worker thread through ``trio.to_thread.run_sync`` with a
limiter.  Times are timezone-aware UTC ``datetime`` objects.
"""

from __future__ import annotations

import abc
import builtins
import enum
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple


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


def utcnow() -> datetime:
    return datetime.now(UTC)


def check_max_bytes(max_bytes: int | None) -> None:
    """``read_events``'s ``max_bytes`` must be positive (or ``None``)."""
    if max_bytes is not None and max_bytes < 1:
        raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")


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


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """One turn of a session, as stored.

    ``first_seq``/``last_seq`` are the sequence numbers of the turn's first
    and last logged events (``None`` until it has one); ``reason`` says why
    a finished turn ended (``completed``, ``cancelled``, ``turn_timeout``,
    ``server_restart``, ...).
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


class LoggedEvent(NamedTuple):
    """One event of a session's log: ``raw`` is its JSON exactly as sent (with ``seq``).

    A named tuple: one is made per event on the streaming path, and a tuple
    is the cheapest immutable record Python makes.
    """

    seq: int
    turn_id: str
    type: str
    raw: bytes


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


def _ended_at_of_new(session: Session) -> datetime | None:
    """The ``ended_at`` ``create`` stores (``ValueError`` for one on a live session)."""
    if not SessionStatus(session.status).terminal:
        if session.ended_at is not None:
            raise ValueError(
                f"session {session.id!r}: a {session.status} session cannot have an ended_at"
            )
        return None
    return session.last_active_at if session.ended_at is None else session.ended_at


def _check_new_turn(turn: TurnRecord) -> TurnStatus:
    """What ``create_turn`` refuses (``ValueError``); returns the turn's status."""
    status = TurnStatus(turn.status)
    if turn.first_seq is not None or turn.last_seq is not None:
        raise ValueError(f"turn {turn.id!r}: first_seq/last_seq are kept by the store")
    if status.finished != (turn.ended_at is not None):
        raise ValueError(
            f"turn {turn.id!r}: a {status} turn must {'' if status.finished else 'not '}"
            "have an ended_at"
        )
    return status


def _check_batch(turn_id: str, events: Sequence[LoggedEvent], end: TurnEnd | None) -> None:
    """What ``append_events`` refuses before anything else (``ValueError``)."""
    if end is not None and not TurnStatus(end.status).finished:
        raise ValueError(f"turn {turn_id!r}: a turn cannot end as {end.status}")
    for event in events:
        if (
            event.turn_id != turn_id
            or type(event.seq) is not int
            or type(event.type) is not str
            or type(event.raw) is not bytes
        ):
            raise ValueError(
                f"turn {turn_id!r}: event {event.seq!r} must be of this turn, with an int seq, "
                f"a str type and bytes raw (got turn {event.turn_id!r}, type "
                f"{type(event.type).__name__}, raw {type(event.raw).__name__})"
            )


def _seq_conflict(session_id: str, last_seq: int, events: Sequence[LoggedEvent]) -> str | None:
    """Why ``events`` do not continue a log that ends at ``last_seq`` (``None``: they do)."""
    for expected, event in enumerate(events, last_seq + 1):
        if event.seq != expected:
            return (
                f"session {session_id!r}: expected event seq {expected}, got {event.seq} "
                f"(the log ends at {last_seq}; a batch's seqs must run on by one)"
            )
    return None


class _Unset(enum.Enum):
    UNSET = enum.auto()


UNSET: Final = _Unset.UNSET


class Store(abc.ABC):
    """The contract every session store keeps.

    - ``create`` raises ``DuplicateSession`` for an id that exists.
    - ``get`` and ``update`` raise ``SessionNotFound`` for an unknown id.
    - ``update`` changes only the mutable fields (status, last activity,
      adapter state); ``None`` (or ``UNSET`` for ``adapter_state``) keeps a
      field, ``adapter_state=None`` clears it.  Identity fields are kept.  It
      returns the updated session.  It raises ``SessionExpired`` when asked
      to move an ``expired`` session to any other status, and then changes
      nothing (the other fields of an expired row may still change).
    - ``delete`` is idempotent; deleting an unknown id is fine.
    - ``list`` filters by agent name, status and tenant, newest ``last_active_at``
      first (ties: id descending), up to ``limit`` (``None``: all; a
      negative limit is a ``ValueError``).  With ``before`` (a
      ``SessionKey``) it returns only the sessions after that key in this
      order: keyset paging, so a page never repeats or skips a session that
      did not change meanwhile, and new sessions never shift later pages.
    - ``ended_at`` is kept by the store: ``create`` stores a terminal session
      with the ``ended_at`` it carries, else its ``last_active_at``, and
      refuses one on a non-terminal session (``ValueError``); ``update`` sets
      it to the current time when the status becomes terminal (a terminal
      session that changes status keeps it) and clears it when the status
      becomes non-terminal; ``mark_expired`` sets it to the current time.
    - ``mark_expired`` moves every ``active`` session whose ``last_active_at``
      is strictly before ``cutoff`` (and whose id is not in ``exclude``) to
      ``expired`` in one step, leaving ``last_active_at`` as it was, and
      returns the ids it moved, sorted.  Idempotent.
    - ``count`` counts sessions with a status.
    - ``purge_sessions`` deletes every terminal session whose ``ended_at``
      is strictly before ``cutoff``, with its turns and its event log, and
      returns how many sessions it deleted.  A session with a turn still
      ``running`` is never purged, nor is a non-terminal one.  Like
      ``drop_events`` it may work in several atomic steps: other calls may
      run between them and see a purged session's log partly deleted;
      cancelled, it may have purged some sessions, and a later call purges
      the rest.

    Turns and the event log:

    - ``create`` refuses a session whose ``last_seq`` is not 0
      (``ValueError``): the store keeps it.
    - ``create_turn`` stores a new turn record of an existing session
      (``SessionNotFound`` otherwise, ``DuplicateTurn`` for an id that
      exists; turn ids are unique across sessions) and sets the session's
      ``last_active_at`` to the turn's ``created_at``.  The record must not
      carry ``first_seq``/``last_seq`` (the store keeps them), and must have
      an ``ended_at`` exactly when it is finished (else ``ValueError``).
    - ``get_turn`` returns one turn of one session (``TurnNotFound`` for an
      unknown id or a turn of another session); ``list_turns`` a session's
      turns oldest first (``created_at``, then id), optionally only one
      status, up to ``limit`` (``SessionNotFound`` for an unknown session);
      ``running_turns`` every turn of any session still ``running`` (what a
      crash left behind), oldest first.
    - ``append_events`` appends events to a session's log for one of its
      turns, in one atomic step: the events' ``seq`` must run on from the
      session's ``last_seq`` by one each (else ``LogConflict``, and nothing
      changes), so a seq is never reused, also across restarts.  It sets the
      turn's ``first_seq`` (once), ``last_seq``, ``started_at`` (once, if
      given) and, with ``end``, its status, reason and ``ended_at`` and the
      session's ``last_active_at``.  ``events`` may be empty.  A turn that is
      already finished takes no more events or ends (``LogConflict``).
      ``SessionNotFound``/``TurnNotFound`` as for ``get_turn``.  Each event
      must be of ``turn_id`` with an ``int`` seq and ``bytes`` raw, and
      ``end`` must have a finished status (else ``ValueError``, checked
      before anything else).
    - ``read_events`` returns a session's logged events with ``after < seq``
      (and ``seq < before``, and of one turn, when given), in seq order, up
      to ``limit`` events and, with ``max_bytes``, stopping once their
      ``raw`` add up to ``max_bytes`` or more (so at least one event, however
      large, when there is one).  ``log_bounds`` tells what the log retains.  Both raise
      ``SessionNotFound`` for an unknown session.
    - ``drop_events`` deletes the logged events of every turn that ended
      strictly before ``cutoff`` (turn records stay, with their seq range;
      a running turn's events are never dropped) and returns how many
      events it deleted.  It is the one call that may work in several
      atomic steps (so other calls may run between them and see a turn's
      events partly dropped); cancelled, it may have dropped some events,
      and a later call drops the rest.  Deleting a session deletes its turns
      and events.
    - A negative ``limit`` is a ``ValueError`` everywhere.
    - ``close`` is idempotent and finishes even when cancelled; other calls
      after it raise ``StoreError("store is closed")``.

    Values: ``Session`` objects handed out are the caller's own (changing
    their ``spec`` or ``inputs`` dicts never changes the store).  Datetimes
    must be timezone-aware (a naive one is a ``ValueError``) and come back in
    UTC, exact to the microsecond.  ``spec`` and ``inputs`` must be
    JSON-serialisable (else ``ValueError``) and come back as their JSON round
    trip.  Each call is atomic with respect to the others (``drop_events``:
    each of its steps).  Turn records and logged events are immutable
    values, safe to hand out as they are.
    """

    #: Told each operation's name and seconds, where a store measures them
    #: (the SQLite store; for metrics).
    on_operation: Callable[[str, float], None] | None = None

    #: A short description for the startup line, e.g. ``sqlite:/path/db``.
    description: str = "store"

    @abc.abstractmethod
    async def create(self, session: Session) -> None: ...

    @abc.abstractmethod
    async def get(self, session_id: str) -> Session: ...

    @abc.abstractmethod
    async def update(
        self,
        session_id: str,
        *,
        status: SessionStatus | None = None,
        last_active_at: datetime | None = None,
        adapter_state: str | _Unset | None = UNSET,
    ) -> Session: ...

    @abc.abstractmethod
    async def delete(self, session_id: str) -> None: ...

    @abc.abstractmethod
    async def list(
        self,
        *,
        agent_name: str | None = None,
        status: SessionStatus | None = None,
        limit: int | None = None,
        before: SessionKey | None = None,
        tenant: str | None = None,
    ) -> list[Session]: ...

    @abc.abstractmethod
    async def mark_expired(
        self, cutoff: datetime, *, exclude: Collection[str] = ()
    ) -> builtins.list[str]: ...  # `list` here is the method above

    @abc.abstractmethod
    async def count(self, *, status: SessionStatus) -> int: ...

    @abc.abstractmethod
    async def purge_sessions(self, cutoff: datetime) -> int: ...

    # -- turns and the event log --------------------------------------------

    @abc.abstractmethod
    async def create_turn(self, turn: TurnRecord) -> None: ...

    @abc.abstractmethod
    async def get_turn(self, session_id: str, turn_id: str) -> TurnRecord: ...

    @abc.abstractmethod
    async def list_turns(
        self, session_id: str, *, status: TurnStatus | None = None, limit: int | None = None
    ) -> builtins.list[TurnRecord]: ...

    @abc.abstractmethod
    async def running_turns(self) -> builtins.list[TurnRecord]: ...

    @abc.abstractmethod
    async def append_events(
        self,
        session_id: str,
        turn_id: str,
        events: Sequence[LoggedEvent],
        *,
        started_at: datetime | None = None,
        end: TurnEnd | None = None,
    ) -> None: ...

    @abc.abstractmethod
    async def read_events(
        self,
        session_id: str,
        *,
        after: int = 0,
        before: int | None = None,
        turn_id: str | None = None,
        limit: int | None = None,
        max_bytes: int | None = None,
    ) -> builtins.list[LoggedEvent]: ...

    @abc.abstractmethod
    async def log_bounds(self, session_id: str) -> LogBounds: ...

    @abc.abstractmethod
    async def drop_events(self, cutoff: datetime) -> int: ...

    @abc.abstractmethod
    async def close(self) -> None: ...
