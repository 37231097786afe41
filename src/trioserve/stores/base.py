"""The session store contract (CONTRACT §4) shared by every backend.

A store is the durable truth about sessions, turns, each session's event log, approvals
(``stores.approvals``), crons (``stores.crons``) and webhooks (``stores.outbox``).  The
public methods are the contract: each checks its arguments once (``stores.checks``), then
calls the backend's hook (``_create``, ...), which only stores and fetches.  Records:
``stores.records`` (re-exported here).  Every guarantee is written here, on its method.
"""

from __future__ import annotations

import abc
import builtins
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from datetime import datetime

import trio

from trioserve.errors import StoreError
from trioserve.stores.approvals import Approvals
from trioserve.stores.checks import (
    Append,
    EventQuery,
    SessionChange,
    SessionQuery,
    check_batch,
    check_cap,
    check_limit,
    check_max_bytes,
    ended_at_of_new,
    new_turn,
    no_nul,
    no_nul_in,
    opt_utc,
    to_json,
    utc,
)
from trioserve.stores.crons import CronTable
from trioserve.stores.idempotency import IdempotencyKeys, binding
from trioserve.stores.outbox import Outbox
from trioserve.stores.records import (
    TERMINAL_STATUSES,
    UNSET,
    IdempotencyClaim,
    IdempotencyRecord,
    LogBounds,
    LoggedEvent,
    Session,
    SessionKey,
    SessionStatus,
    TurnEnd,
    TurnRecord,
    TurnStatus,
    _Unset,
    utcnow,
)
from trioserve.stores.turn_queue import QueuedTurns

__all__ = [
    "TERMINAL_STATUSES",
    "UNSET",
    "LogBounds",
    "LoggedEvent",
    "Session",
    "SessionKey",
    "SessionStatus",
    "Store",
    "TurnEnd",
    "TurnRecord",
    "TurnStatus",
    "check_max_bytes",
    "utcnow",
]


class Store(QueuedTurns, Approvals, IdempotencyKeys, CronTable, Outbox, abc.ABC):
    """The contract every session store keeps (each method's docstring says its part; keys:
    ``stores.idempotency``; queued turns: ``turn_queue``; webhooks: ``outbox``; approvals).

    All methods are async and safe to call from many Trio tasks at once; blocking backends
    run their calls in a worker thread through ``trio.to_thread.run_sync`` with a limiter.
    Each call is atomic with respect to the others (``drop_events`` and ``purge_sessions``:
    each of their steps).

    Values: ``Session`` objects handed out are the caller's own (changing
    their ``spec`` or ``inputs`` dicts never changes the store).  Datetimes
    must be timezone-aware (a naive one is a ``ValueError``) and come back in
    UTC, exact to the microsecond.  ``spec`` and ``inputs`` must be
    JSON-serialisable (else ``ValueError``) and come back as their JSON round
    trip.  Turn records and logged events are immutable values, safe to hand
    out as they are.  A negative ``limit`` is a ``ValueError`` everywhere.
    Argument errors (``ValueError``/``TypeError``) are raised before the
    store is touched, so such a call changes nothing.  A failure of the
    backend itself is a ``StoreError``.
    """

    #: Told each operation's name and seconds where a store measures them (SQL: metrics).
    on_operation: Callable[[str, float], None] | None = None

    #: A short description for the startup line, e.g. ``sqlite:/path/db``.
    description: str = "store"

    # -- sessions -------------------------------------------------------------

    async def create(
        self,
        session: Session,
        *,
        max_active: int | None = None,
        max_active_per_tenant: int | None = None,
        idempotency: IdempotencyClaim | None = None,
    ) -> None:
        """Store a new session (with ``idempotency``'s key bound to it, in the same step).

        Raises ``DuplicateSession`` for an id that exists.  Refuses
        (``ValueError``) a session whose ``last_seq`` is not 0 (the store
        keeps it) and a non-terminal one with an ``ended_at``; a terminal
        one is stored with the ``ended_at`` it carries, else its
        ``last_active_at``.

        With ``max_active`` (an int >= 1, else ``ValueError``), an ``active``
        session is refused with ``SessionCapReached`` when the store holds
        ``max_active`` active sessions already.  The count and the insert
        are one atomic step, exact across processes sharing the store
        (SQLite: one ``BEGIN IMMEDIATE`` transaction; PostgreSQL: under a
        transaction-level advisory lock), so N racing creates against a cap
        of C leave exactly min(N, C) more.  Only ``create`` checks the cap.
        With ``max_active_per_tenant`` likewise, in the same step, an active
        session of a tenant (``session.tenant`` not ``None``) is refused with
        ``TenantSessionCapReached`` when its tenant has that many active
        sessions (checked before ``max_active``).  A key bound already is
        checked first: ``IdempotencyKeyBound``, and nothing stored.
        """
        check_cap("max_active", max_active)
        check_cap("max_active_per_tenant", max_active_per_tenant)
        if session.last_seq != 0:
            raise ValueError(f"session {session.id!r}: last_seq is kept by the store")
        ended_at = ended_at_of_new(session)
        what = f"session {session.id!r}"
        no_nul_in(what, session, ("id", "agent_name", "runtime_type", "tenant", "adapter_state"))
        spec, inputs = (
            to_json(session.spec, f"{what}: spec"),
            to_json(session.inputs, f"{what}: inputs"),
        )
        record = replace(
            session,
            status=SessionStatus(session.status),
            created_at=utc(session.created_at, "created_at"),
            last_active_at=utc(session.last_active_at, "last_active_at"),
            ended_at=opt_utc(ended_at, "ended_at"),
        )
        active = record.status is SessionStatus.ACTIVE
        cap = max_active if active else None
        tenant_cap = max_active_per_tenant if active and record.tenant is not None else None
        key = binding(idempotency, record.id)
        await self._create(record, spec, inputs, cap, tenant_cap, key)

    @abc.abstractmethod
    async def _create(
        self,
        session: Session,
        spec_json: str,
        inputs_json: str,
        max_active: int | None,
        tenant_cap: int | None = None,
        key: IdempotencyRecord | None = None,
    ) -> None:
        """Insert ``session`` (checked, UTC) with ``spec``/``inputs`` as the JSON given,
        under the cap on active sessions when ``max_active`` is given, and its
        tenant's (``session.tenant`` is then set) when ``tenant_cap`` is; and ``key``
        unless its key is bound (as ``_bind_key``), checked first."""

    @abc.abstractmethod
    async def get(self, session_id: str) -> Session:
        """The session ``session_id`` (``SessionNotFound`` for an unknown id)."""

    async def update(
        self,
        session_id: str,
        *,
        status: SessionStatus | None = None,
        last_active_at: datetime | None = None,
        adapter_state: str | _Unset | None = UNSET,
    ) -> Session:
        """Change a session's mutable fields and return it as updated.

        ``None`` (or ``UNSET`` for ``adapter_state``) keeps a field;
        ``adapter_state=None`` clears it; identity fields are kept.  When
        the status becomes terminal ``ended_at`` is set to now (a terminal
        session that changes status keeps it); when it becomes non-terminal
        it is cleared.  Raises ``SessionNotFound`` for an unknown id, and
        ``SessionExpired`` when asked to move an ``expired`` session to any
        other status (then nothing changes; the other fields of an expired
        session may still change).
        """
        no_nul(f"session {session_id!r}: adapter_state", adapter_state)
        change = SessionChange(
            None if status is None else SessionStatus(status),
            opt_utc(last_active_at, "last_active_at"),
            adapter_state,
            utcnow(),
        )
        return await self._update(session_id, change)

    @abc.abstractmethod
    async def _update(self, session_id: str, change: SessionChange) -> Session:
        """``update``'s change, returning the session as updated."""

    @abc.abstractmethod
    async def delete(self, session_id: str) -> None:
        """Delete a session with its turns and its event log.  Idempotent (unknown id: fine)."""

    async def list(
        self,
        *,
        agent_name: str | None = None,
        status: SessionStatus | None = None,
        limit: int | None = None,
        before: SessionKey | None = None,
        tenant: str | None = None,
    ) -> builtins.list[Session]:
        """Sessions filtered by agent name, status and tenant, newest ``last_active_at`` first.

        Ties go by id, descending; up to ``limit`` (``None``: all).  With
        ``before`` (a ``SessionKey``) only the sessions after that key in
        this order: keyset paging, so a page never repeats or skips a
        session that did not change meanwhile, and new sessions never shift
        later pages.
        """
        check_limit(limit)
        key = None if before is None else SessionKey(utc(before[0], "before"), before[1])
        no_nul("before: the session id", None if key is None else key.id)
        wanted = None if status is None else SessionStatus(status)
        return await self._list(SessionQuery(agent_name, wanted, limit, key, tenant))

    @abc.abstractmethod
    async def _list(self, query: SessionQuery) -> builtins.list[Session]:
        """``list`` with checked arguments."""

    async def mark_expired(
        self, cutoff: datetime, *, exclude: Collection[str] = ()
    ) -> builtins.list[str]:
        """Expire every ``active`` session idle since strictly before ``cutoff``.

        In one step; sessions whose id is in ``exclude`` are spared, and
        ``last_active_at`` is left as it was while ``ended_at`` becomes now.
        Returns the ids it moved, sorted.  Idempotent.  ``exclude`` must be
        a collection of ids, not one ``str`` (``TypeError``).
        """
        if isinstance(exclude, str):
            raise TypeError("exclude must be a collection of ids, not one str")
        return await self._mark_expired(utc(cutoff, "cutoff"), frozenset(exclude), utcnow())

    @abc.abstractmethod
    async def _mark_expired(
        self, cutoff: datetime, exclude: frozenset[str], now: datetime
    ) -> builtins.list[str]:
        """``mark_expired`` with checked arguments (``now``: the ``ended_at`` to set)."""

    async def count(self, *, status: SessionStatus) -> int:
        """How many sessions have ``status``."""
        return await self._count(SessionStatus(status))

    @abc.abstractmethod
    async def _count(self, status: SessionStatus) -> int:
        """``count`` with a checked status."""

    async def purge_sessions(self, cutoff: datetime) -> int:
        """Delete every terminal session that ended strictly before ``cutoff``; return how many.

        Each goes with its turns and its event log.  A session with a turn
        still ``running`` is never purged, nor is a non-terminal one.  May
        work in several atomic steps: other calls may run between them and
        see a purged session's log partly deleted; cancelled, it may have
        purged some sessions, and a later call purges the rest.
        """
        return await self._purge_sessions(utc(cutoff, "cutoff"))

    @abc.abstractmethod
    async def _purge_sessions(self, cutoff: datetime) -> int:
        """``purge_sessions`` with a UTC cutoff."""

    # -- turns and the event log ------------------------------------------------

    async def create_turn(
        self,
        turn: TurnRecord,
        *,
        max_running: int | None = None,
        max_running_per_tenant: int | None = None,
        idempotency: IdempotencyClaim | None = None,
    ) -> None:
        """Store a new turn of an existing session; its ``created_at`` becomes the session's
        ``last_active_at``.

        Raises ``SessionNotFound`` for an unknown session and ``DuplicateTurn``
        for a turn id that exists (turn ids are unique across sessions).  The
        record must not carry ``first_seq``/``last_seq`` (the store keeps
        them) and must have an ``ended_at`` exactly when it is finished
        (else ``ValueError``).  ``owner`` and ``lease_expires_at`` are stored
        as given.

        Single flight: a session has at most one ``running`` turn, in the
        store itself (a partial unique index in SQL): a second running turn
        is refused with ``SessionBusy``, also when another process made the
        first.  With ``max_running`` (an int >= 1, else ``ValueError``), a
        running turn is refused with ``TurnCapReached`` when ``max_running``
        turns of any session run already; the count and the insert are one
        atomic step, exact across processes (as ``create``'s ``max_active``).
        With ``max_running_per_tenant`` likewise, in the same step, a running
        turn of a session that has a tenant is refused with
        ``TenantTurnCapReached`` when turns of that many of the tenant's
        sessions run (checked after single flight, before ``max_running``).
        Nothing is stored when it is refused.  With ``idempotency``, its key is
        bound to the turn in the same step, checked first, as ``create`` does.
        """
        check_cap("max_running", max_running)
        check_cap("max_running_per_tenant", max_running_per_tenant)
        record = new_turn(turn)
        key = binding(idempotency, record.session_id, record.id)
        running = record.status is TurnStatus.RUNNING
        cap = max_running if running else None
        await self._create_turn(record, cap, max_running_per_tenant if running else None, key)

    @abc.abstractmethod
    async def _create_turn(
        self,
        turn: TurnRecord,
        max_running: int | None,
        tenant_cap: int | None = None,
        key: IdempotencyRecord | None = None,
    ) -> None:
        """Insert a checked turn record (UTC times) and touch its session, single-flight
        and under the cap on running turns when ``max_running`` is given, and the
        session's tenant's (if it has one) when ``tenant_cap`` is; ``key`` as ``_create``."""

    async def renew_leases(self, owner: str, until: datetime) -> int:
        """Extend the lease of every running or queued turn of ``owner`` to ``until``; how many.

        One atomic step.  A process running turns calls it periodically, well
        before its leases lapse; finished turns and other owners' are untouched.
        """
        return await self._renew_leases(owner, utc(until, "until"))

    @abc.abstractmethod
    async def _renew_leases(self, owner: str, until: datetime) -> int:
        """``renew_leases`` with a UTC ``until``."""

    @abc.abstractmethod
    async def get_turn(self, session_id: str, turn_id: str) -> TurnRecord:
        """One turn of one session (``TurnNotFound`` for an unknown id or another session's)."""

    async def list_turns(
        self, session_id: str, *, status: TurnStatus | None = None, limit: int | None = None
    ) -> builtins.list[TurnRecord]:
        """A session's turns oldest first (``created_at``, then id), optionally of one status.

        Up to ``limit``; ``SessionNotFound`` for an unknown session.
        """
        check_limit(limit)
        return await self._list_turns(
            session_id, None if status is None else TurnStatus(status), limit
        )

    @abc.abstractmethod
    async def _list_turns(
        self, session_id: str, status: TurnStatus | None, limit: int | None
    ) -> builtins.list[TurnRecord]:
        """``list_turns`` with checked arguments."""

    @abc.abstractmethod
    async def running_turns(self) -> builtins.list[TurnRecord]:
        """Every turn of any session still ``running`` (what a crash left behind), oldest first."""

    async def append_events(
        self,
        session_id: str,
        turn_id: str,
        events: Sequence[LoggedEvent],
        *,
        started_at: datetime | None = None,
        end: TurnEnd | None = None,
    ) -> None:
        """Append events to a session's log for one of its running turns, in one atomic step.

        The events' ``seq`` must run on from the session's ``last_seq`` by
        one each (else ``LogConflict``, and nothing changes), so a seq is
        never reused, also across restarts.  Sets the turn's ``first_seq``
        (once), ``last_seq``, ``started_at`` (once, if given) and, with
        ``end``, its status, reason and ``ended_at`` and the session's
        ``last_active_at``.  ``events`` may be empty.  A finished turn takes
        no more events or ends (``LogConflict``).  ``SessionNotFound`` /
        ``TurnNotFound`` as for ``get_turn``.  Each event must be of
        ``turn_id`` with an ``int`` seq, a ``str`` type and ``bytes`` raw,
        and ``end`` must have a finished status (else ``ValueError``,
        checked before anything else).
        """
        batch = check_batch(turn_id, events, end)  # ours: the caller may reuse theirs
        started = opt_utc(started_at, "started_at")
        ending = (
            None
            if end is None
            else TurnEnd(TurnStatus(end.status), end.reason, utc(end.ended_at, "ended_at"))
        )
        await self._append_events(session_id, Append(turn_id, batch, started, ending))

    @abc.abstractmethod
    async def _append_events(self, session_id: str, append: Append) -> None:
        """``append_events`` with a checked batch (the seq check against the log is the hook's)."""

    async def read_events(
        self,
        session_id: str,
        *,
        after: int = 0,
        before: int | None = None,
        turn_id: str | None = None,
        limit: int | None = None,
        max_bytes: int | None = None,
    ) -> builtins.list[LoggedEvent]:
        """A session's logged events with ``after < seq`` (and ``seq < before``), in seq order.

        Only ``turn_id``'s when given; up to ``limit`` events and, with
        ``max_bytes`` (>= 1), stopping once their ``raw`` add up to
        ``max_bytes`` or more (so at least one event, however large, when
        there is one).  ``SessionNotFound`` for an unknown session.
        """
        check_limit(limit)
        check_max_bytes(max_bytes)
        query = EventQuery(after, before, turn_id, limit, max_bytes)
        return await self._read_events(session_id, query)

    @abc.abstractmethod
    async def _read_events(self, session_id: str, query: EventQuery) -> builtins.list[LoggedEvent]:
        """``read_events`` with checked arguments."""

    @abc.abstractmethod
    async def log_bounds(self, session_id: str) -> LogBounds:
        """What the session's log retains (``SessionNotFound`` for an unknown session)."""

    async def drop_events(self, cutoff: datetime) -> int:
        """Delete the logged events of every turn that ended strictly before ``cutoff``.

        Returns how many events it deleted.  Turn records stay, with their
        seq range; a running turn's events are never dropped.  May work in
        several atomic steps (other calls may run between them and see a
        turn's events partly dropped); cancelled, it may have dropped some
        events, and a later call drops the rest.
        """
        return await self._drop_events(utc(cutoff, "cutoff"))

    @abc.abstractmethod
    async def _drop_events(self, cutoff: datetime) -> int:
        """``drop_events`` with a UTC cutoff."""

    async def request_cancel(self, session_id: str, turn_id: str) -> bool:
        """Ask the process running ``turn_id`` (another one, on a shared store) to cancel it.

        Returns ``False`` when the turn is not running (then nothing changes).
        The owner learns of it from ``cancel_requests``.  Only a store shared
        by processes takes requests (the PostgreSQL store); this default
        raises ``StoreError``: in one process the manager stops a turn itself.
        """
        raise StoreError(f"{self.description}: no cancel requests across processes")

    async def cancel_requests(self, owner: str) -> builtins.list[tuple[str, str]]:
        """(session id, turn id) of ``owner``'s running turns whose cancel was requested.

        Oldest first; a request stays until its turn finishes.  This default
        (a store of one process) has none.
        """
        return []

    #: How often the default ``wait_appended`` re-reads the log, in seconds.
    wait_poll_seconds: float = 0.1

    async def wait_appended(self, session_id: str, after_seq: int) -> None:
        """Return once the session's log ends past ``after_seq`` (its ``last_seq`` is higher).

        A wake-up hook for a reader that did not write the events itself
        (another process, on a shared database): it returns at once when the
        log already ends past ``after_seq``, and never misses an append made
        after it was called; then read the events.  Bound it with a Trio
        cancel scope (``trio.move_on_after``); it is cancellable like any
        wait.  Raises ``SessionNotFound`` for an unknown session (also one
        deleted while waiting, when the wait re-reads the log).  This default
        re-reads ``log_bounds`` every ``wait_poll_seconds``; the PostgreSQL
        store is woken by ``NOTIFY`` instead.
        """
        while (await self.log_bounds(session_id)).last <= after_seq:  # noqa: ASYNC110  (polls)
            await trio.sleep(self.wait_poll_seconds)

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the store.  Idempotent, and finishes even when cancelled.

        Other calls after it raise ``StoreError("store is closed")``.
        """
