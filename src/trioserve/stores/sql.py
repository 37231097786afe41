"""``SQLStore``: what the SQLite and PostgreSQL stores do alike, written once.

Both keep the same tables with the same columns (``stores.codec``), so
every hook of the ``Store`` contract is the same step in both: encode the
checked arguments, run one statement function in a worker thread, decode
its rows.  ``SQLStore`` implements those hooks once over ``Queries``, the
backend's statement functions (its dialect: placeholders, locking,
``executemany``, JSON arrays or ``text[]``), and leaves to each backend
only what really differs: ``_run`` (its threads, limiter, connection or
pool, and error wrapping), opening, ``close`` and its extras (PostgreSQL's
``NOTIFY`` wake-ups and cancel requests).  ``pending_statements`` drives
both schemas' migrations (version check, then the pending steps).
"""

from __future__ import annotations

import abc
import builtins
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Final, TypeVar, TypeVarTuple

import trio

from trioserve.errors import SessionNotFound, StoreError, TurnNotFound
from trioserve.stores.base import Store
from trioserve.stores.checks import (
    Append,
    EventQuery,
    SessionChange,
    SessionQuery,
    has_nul,
)
from trioserve.stores.codec import (
    _opt_micros,
    _to_micros,
    end_params,
    session_row,
    turn_row,
    update_params,
)
from trioserve.stores.records import (
    IdempotencyRecord,
    LogBounds,
    LoggedEvent,
    Session,
    SessionStatus,
    TurnEnd,
    TurnRecord,
    TurnStatus,
)
from trioserve.stores.sql_approvals import SQLApprovals
from trioserve.stores.sql_crons import SQLCrons
from trioserve.stores.sql_keys import KeyDialect, bind_key, find_key, key_row, purge_keys_chunk
from trioserve.stores.sql_outbox import SQLOutbox

__all__ = [
    "DROP_CHUNK_ROWS",
    "LEASE_INDEXES",
    "PURGE_CHUNK_SESSIONS",
    "QUEUED_ENDED_CHECK",
    "QUEUED_INDEX",
    "QUEUED_STATUS_CHECK",
    "SINGLE_FLIGHT",
    "Queries",
    "SQLStore",
    "pending_statements",
    "purge_found",
]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

#: How many events one ``drop_events`` step deletes (one transaction, one thread call),
#: and how many events or turns one ``purge_sessions`` step deletes.
DROP_CHUNK_ROWS: Final = 5000
#: How many sessions one ``purge_sessions`` step deletes at most.
PURGE_CHUNK_SESSIONS: Final = 500

_SEQ_MIN: Final = -(2**63)  # both INTEGER/bigint ranges, to clamp seq bounds into
_SEQ_MAX: Final = 2**63 - 1

Ending = tuple[str, str, int]  # ``codec.end_params``
KeyRow = tuple[Any, ...]  # ``sql_keys.key_row``


@dataclass(frozen=True, slots=True)
class Queries:
    """A backend's statement functions, each run as ``fn(conn, *args)`` in a worker thread.

    Times are microseconds and records are rows as ``stores.codec`` says;
    ``limit`` ``None`` is no limit.  The function names (not these field
    names) are the operation names ``Store.on_operation`` is told.
    """

    #: The dialect's positional placeholder (``?`` or ``%s``), for ``list``'s WHERE clause.
    placeholder: str
    #: ``mark_expired``'s excluded ids as one bound parameter (a JSON array, a ``text[]``).
    id_array: Callable[[builtins.list[str]], Any]
    #: The idempotency keys' statements' dialect (``stores.sql_keys``).
    keys: KeyDialect
    #: ``insert`` and ``insert_turn`` take the idempotency key's row last (or ``None``).
    insert: Callable[[Any, tuple[Any, ...], int | None, int | None, KeyRow | None], None]
    select: Callable[[Any, str], Session]
    update: Callable[[Any, dict[str, Any]], Session]
    delete: Callable[[Any, str], None]
    list: Callable[[Any, str, builtins.list[Any], int | None], builtins.list[Session]]
    expire: Callable[[Any, int, Any, int], builtins.list[str]]
    count: Callable[[Any, str], int]
    purge_chunk: Callable[[Any, int, int, int], tuple[int, bool]]
    insert_turn: Callable[[Any, tuple[Any, ...], int | None, int | None, KeyRow | None], None]
    renew: Callable[[Any, str, int], int]
    select_turn: Callable[[Any, str, str], TurnRecord]
    list_turns: Callable[[Any, str, str | None, int | None], builtins.list[TurnRecord]]
    running_turns: Callable[[Any], builtins.list[TurnRecord]]
    #: Queued turns (``stores.turn_queue``): ``(conn, session_id, turn_id, owner, lease,
    #: max_running, tenant_cap)``, ``(conn, session_id, turn_id, status, reason, ended)``.
    begin: Callable[
        [Any, str, str, str | None, int | None, int | None, int | None], TurnRecord | None
    ]
    end_queued: Callable[[Any, str, str, str, str, int], bool]
    queued_turns: Callable[[Any], builtins.list[TurnRecord]]
    #: ``(conn, owner, until, now)``.
    claim_queued: Callable[[Any, str, int, int], builtins.list[TurnRecord]]
    #: ``(conn, session_id, turn_id, batch, started, end, channel)``: ``channel`` is
    #: where to ``NOTIFY`` the append (``None``: the backend has no notifications).
    append: Callable[
        [Any, str, str, Sequence[LoggedEvent], int | None, Ending | None, str | None], None
    ]
    read: Callable[
        [Any, str, int, int, str | None, int | None, int | None], builtins.list[LoggedEvent]
    ]
    bounds: Callable[[Any, str], LogBounds]
    drop_chunk: Callable[[Any, int, int], tuple[int, bool]]


#: Migration statements both schemas run, word for word, in one of their released
#: steps (SQLite 4 -> 5, PostgreSQL 1 -> 2); never edit them, append a new step.
#: Single flight in the store: at most one running turn per session.  A session
#: with several (made by no trioserve, but possible in a database) keeps its
#: newest running; the others are interrupted, as at a restart.
SINGLE_FLIGHT: Final = (
    """
        UPDATE turns SET status = 'interrupted', reason = 'server_restart', ended_at = created_at
        WHERE status = 'running' AND EXISTS (
            SELECT 1 FROM turns AS newer
            WHERE newer.session_id = turns.session_id AND newer.status = 'running'
              AND (newer.created_at, newer.id) > (turns.created_at, turns.id)
        )
        """,
    "CREATE UNIQUE INDEX turns_one_running ON turns (session_id) WHERE status = 'running'",
)
#: Leases (who runs a turn, until when its claim holds): the indexes, once the
#: ``owner`` and ``lease_expires_at`` columns are added (with each dialect's types).
LEASE_INDEXES: Final = (
    """
        CREATE INDEX turns_by_lease ON turns (lease_expires_at)
        WHERE status = 'running' AND lease_expires_at IS NOT NULL
        """,
    "CREATE INDEX turns_by_owner ON turns (owner) WHERE status = 'running'",
)

#: Queued turns (SQLite 6 -> 7, PostgreSQL 4 -> 5): the turns' checks as they are
#: since, and the index of the queued turns (oldest first).
QUEUED_STATUS_CHECK: Final = (
    "(status IN ('queued', 'running', 'completed', 'failed', 'cancelled', 'interrupted'))"
)
QUEUED_ENDED_CHECK: Final = "((status IN ('queued', 'running')) = (ended_at IS NULL))"
QUEUED_INDEX: Final = (
    "CREATE INDEX turns_queued ON turns (session_id, created_at, id) WHERE status = 'queued'"
)


def pending_statements(
    version: int, migrations: Sequence[tuple[str, ...]], where: object
) -> Iterator[str]:
    """The statements that take a schema at ``version`` to ``len(migrations)``, in order.

    ``migrations[n]`` takes version ``n`` to ``n + 1``.  A ``version`` past
    them is a ``StoreError`` naming the store (``where``): made by a newer
    trioserve.
    """
    latest = len(migrations)
    if version > latest:
        raise StoreError(
            f"session store {where} has schema version {version}, newer than this "
            f"trioserve supports ({latest}); upgrade trioserve"
        )
    for step in migrations[version:]:
        yield from step


def purge_found(
    found: int,
    rows: int,
    sessions: int,
    delete_rows: Callable[[str], int],
    delete_sessions: Callable[[], object],
) -> tuple[int, bool]:
    """The rest of one ``purge_sessions`` step (``Queries.purge_chunk``), in its transaction.

    It found ``found`` sessions to purge (at most ``sessions``, the oldest
    first); it deletes up to ``rows`` of their events (``delete_rows("events")``
    returns how many it deleted), else up to ``rows`` of their turns, else
    the sessions themselves (``delete_sessions()``).  Returns how many
    sessions it deleted and whether that was the last of them.
    """
    if not found:
        return 0, True
    for table in ("events", "turns"):
        if delete_rows(table) == rows:
            return 0, False  # maybe more: the next step takes the same sessions on
    delete_sessions()
    return found, found < sessions


class SQLStore(SQLApprovals, SQLCrons, SQLOutbox, Store):
    """The ``Store`` hooks over a backend's ``Queries``; a backend adds ``_run`` and ``close``
    (crons: ``stores.sql_crons``, in the idempotency keys' dialect; webhooks: ``SQLOutbox``)."""

    #: The backend's statements (a class attribute of each backend).
    _q: Queries
    #: Where appends are ``NOTIFY``d (``Queries.append``'s ``channel``).
    _channel: str | None = None
    #: ``drop_events``/``purge_sessions`` chunks (``DROP_CHUNK_ROWS``, ``PURGE_CHUNK_SESSIONS``).
    _chunk_rows: ClassVar[int] = DROP_CHUNK_ROWS
    _chunk_sessions: ClassVar[int] = PURGE_CHUNK_SESSIONS

    def __init__(self) -> None:
        self._closing = False  # set by close: calls from now on are refused
        self._closed = trio.Event()  # set when close has finished

    @abc.abstractmethod
    async def _run(self, fn: Callable[[Any, *Ts], T], *args: *Ts) -> T:
        """Run ``fn(conn, *args)`` in a worker thread under the store's limiter.

        ``StoreError`` when the store is closed (``_check_open``) or the database fails.
        """

    def _dialect(self) -> KeyDialect:
        return self._q.keys

    def _check_open(self) -> None:
        if self._closing:
            raise StoreError("store is closed")

    async def close(self) -> None:
        """Release the store (the backend's ``_shutdown``).  Idempotent, shielded: a second
        call waits for the first to finish."""
        with trio.CancelScope(shield=True):
            if self._closing:
                await self._closed.wait()
                return
            self._closing = True
            try:
                await self._shutdown()
            finally:
                self._closed.set()

    @abc.abstractmethod
    async def _shutdown(self) -> None:
        """``close``'s work, run once and shielded, after new calls are refused."""

    async def _create(
        self,
        session: Session,
        spec_json: str,
        inputs_json: str,
        max_active: int | None,
        tenant_cap: int | None = None,
        key: IdempotencyRecord | None = None,
    ) -> None:
        row = session_row(session, spec_json, inputs_json)
        await self._run(self._q.insert, row, max_active, tenant_cap, _opt_key_row(key))

    async def get(self, session_id: str) -> Session:
        _known_session(session_id)
        return await self._run(self._q.select, session_id)

    async def _update(self, session_id: str, change: SessionChange) -> Session:
        _known_session(session_id)
        return await self._run(self._q.update, update_params(session_id, change))

    async def delete(self, session_id: str) -> None:
        if not has_nul(session_id):
            await self._run(self._q.delete, session_id)

    async def _list(self, query: SessionQuery) -> builtins.list[Session]:
        agent_name, status, limit, before, tenant = query
        if has_nul(agent_name, tenant):
            return []
        p = self._q.placeholder
        clauses: builtins.list[str] = []
        params: builtins.list[Any] = []
        for column, value in (
            ("tenant", tenant),
            ("agent_name", agent_name),
            ("status", None if status is None else status.value),
        ):
            if value is not None:
                clauses.append(f"{column} = {p}")
                params.append(value)
        if before is not None:
            clauses.append(f"(last_active_at, id) < ({p}, {p})")
            params += [_to_micros(before[0], "before"), before[1]]
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        return await self._run(self._q.list, where, params, limit)

    async def _mark_expired(
        self, cutoff: datetime, exclude: frozenset[str], now: datetime
    ) -> builtins.list[str]:
        excluded = self._q.id_array(sorted(exclude))  # one bound parameter, however many ids
        micros = _to_micros(now, "now")
        return await self._run(self._q.expire, _to_micros(cutoff, "cutoff"), excluded, micros)

    async def _count(self, status: SessionStatus) -> int:
        return await self._run(self._q.count, status.value)

    async def _purge_sessions(self, cutoff: datetime) -> int:
        """Purge in chunks (``Queries.purge_chunk``), each its own transaction and thread call."""
        micros = _to_micros(cutoff, "cutoff")
        total = 0
        while True:
            purged, done = await self._run(
                self._q.purge_chunk, micros, self._chunk_rows, self._chunk_sessions
            )
            total += purged
            if done:
                return total

    # -- turns and the event log --------------------------------------------

    async def _create_turn(
        self,
        turn: TurnRecord,
        max_running: int | None,
        tenant_cap: int | None = None,
        key: IdempotencyRecord | None = None,
    ) -> None:
        _known_session(turn.session_id)
        row = turn_row(turn)
        await self._run(self._q.insert_turn, row, max_running, tenant_cap, _opt_key_row(key))

    async def _renew_leases(self, owner: str, until: datetime) -> int:
        if has_nul(owner):
            return 0
        return await self._run(self._q.renew, owner, _to_micros(until, "until"))

    async def get_turn(self, session_id: str, turn_id: str) -> TurnRecord:
        _known_turn(session_id, turn_id)
        return await self._run(self._q.select_turn, session_id, turn_id)

    async def _list_turns(
        self, session_id: str, status: TurnStatus | None, limit: int | None
    ) -> builtins.list[TurnRecord]:
        _known_session(session_id)
        wanted = None if status is None else status.value
        return await self._run(self._q.list_turns, session_id, wanted, limit)

    async def running_turns(self) -> builtins.list[TurnRecord]:
        return await self._run(self._q.running_turns)

    async def queued_turns(self) -> builtins.list[TurnRecord]:
        return await self._run(self._q.queued_turns)

    async def _begin_turn(
        self,
        session_id: str,
        turn_id: str,
        owner: str | None,
        lease_expires_at: datetime | None,
        max_running: int | None,
        tenant_cap: int | None,
    ) -> TurnRecord | None:
        lease = _opt_micros(lease_expires_at, "lease_expires_at")
        return await self._run(
            self._q.begin, session_id, turn_id, owner, lease, max_running, tenant_cap
        )

    async def _claim_queued(
        self, owner: str, until: datetime, now: datetime
    ) -> builtins.list[TurnRecord]:
        until_micros, now_micros = _to_micros(until, "until"), _to_micros(now, "now")
        return await self._run(self._q.claim_queued, owner, until_micros, now_micros)

    async def _end_queued(self, session_id: str, turn_id: str, end: TurnEnd) -> bool:
        ended = _to_micros(end.ended_at, "ended_at")
        return await self._run(
            self._q.end_queued, session_id, turn_id, end.status.value, end.reason, ended
        )

    async def _append_events(self, session_id: str, append: Append) -> None:
        turn_id, batch, started_at, end = append
        _known_session(session_id)
        _known_turn(session_id, turn_id)
        ending = end_params(end)
        started = _opt_micros(started_at, "started_at")
        channel = self._channel
        await self._run(self._q.append, session_id, turn_id, batch, started, ending, channel)

    async def _read_events(self, session_id: str, query: EventQuery) -> builtins.list[LoggedEvent]:
        after, before, turn_id, limit, max_bytes = query
        _known_session(session_id)
        if has_nul(turn_id):
            return []
        low = min(max(after, _SEQ_MIN), _SEQ_MAX)
        high = _SEQ_MAX if before is None else min(max(before, _SEQ_MIN), _SEQ_MAX)
        return await self._run(self._q.read, session_id, low, high, turn_id, limit, max_bytes)

    async def log_bounds(self, session_id: str) -> LogBounds:
        _known_session(session_id)
        return await self._run(self._q.bounds, session_id)

    async def _drop_events(self, cutoff: datetime) -> int:
        """Drop in chunks of ``DROP_CHUNK_ROWS``, each its own transaction and thread call."""
        micros = _to_micros(cutoff, "cutoff")
        total = 0
        while True:
            deleted, done = await self._run(self._q.drop_chunk, micros, self._chunk_rows)
            total += deleted
            if done:
                return total

    # -- idempotency keys (``stores.sql_keys``) -------------------------------

    async def _find_key(
        self, tenant: str | None, key: str, now: datetime
    ) -> IdempotencyRecord | None:
        return await self._run(find_key, self._q.keys, tenant, key, _to_micros(now, "now"))

    async def _bind_key(self, record: IdempotencyRecord) -> None:
        await self._run(bind_key, self._q.keys, key_row(record))

    async def _purge_keys(self, cutoff: datetime) -> int:
        """Purge in chunks of ``DROP_CHUNK_ROWS``, as ``_drop_events``."""
        micros = _to_micros(cutoff, "cutoff")
        total = 0
        while True:
            deleted, done = await self._run(
                purge_keys_chunk, self._q.keys, micros, self._chunk_rows
            )
            total += deleted
            if done:
                return total


def _known_session(session_id: str) -> None:
    """``SessionNotFound`` for an id with a NUL, without asking the database (``has_nul``)."""
    if has_nul(session_id):
        raise SessionNotFound(f"session {session_id} not found")


def _known_turn(session_id: str, turn_id: str) -> None:
    """``TurnNotFound`` for ids with a NUL, without asking the database (``has_nul``)."""
    if has_nul(session_id, turn_id):
        raise TurnNotFound(f"turn {turn_id} of session {session_id} not found")


def _opt_key_row(key: IdempotencyRecord | None) -> KeyRow | None:
    return None if key is None else key_row(key)
