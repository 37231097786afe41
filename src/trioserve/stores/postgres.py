"""``PostgresStore``: the session store in a PostgreSQL database, shared by many processes.

Guarantees, beyond the ``Store`` contract:

- **Threads and a pool.**  psycopg 3's sync connections from a
  ``psycopg_pool.ConnectionPool`` of up to ``POOL_SIZE``, used only from
  Trio's worker threads (``trio.to_thread.run_sync``) through a
  ``CapacityLimiter(POOL_SIZE)``.  Connections are in autocommit; a call
  is one statement or one explicit transaction (rolled back on any
  error), so each call is atomic.  ``drop_events`` and ``purge_sessions``
  work in chunks, each its own transaction, as in the SQLite store.
- **Many processes.**  ``append_events`` and ``create_turn`` lock the
  session's row (``SELECT ... FOR UPDATE``) for their transaction, so
  appends to one session are serialised across processes and the seq
  check is exact: two writers can never both append seq ``n``.
- **Wake-ups.**  Each append ``NOTIFY``s a channel of the store's schema;
  ``wait_appended`` waits on a ``LISTEN`` connection in a thread of its
  own (``stores.pg_listen``), so a reader in another process learns of new
  events without polling.
- **Cancellation.**  As the SQLite store: a call cancelled while it waits
  for a thread does nothing; once started it runs to completion, and Trio
  delivers the cancellation at the caller's next checkpoint.  ``close``
  is shielded: it waits for in-flight calls, then closes the pool and
  stops the listener.
- **Versioned**, in a ``trioserve_schema`` table (``stores.pg_schema``);
  times are ``bigint`` microseconds, exact and ordered as in SQLite.
- **Clear errors.**  A failure of PostgreSQL is a ``StoreError`` naming
  the store (its URL without a password).
"""

from __future__ import annotations

import builtins
import contextlib
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, Final, TypeVar, TypeVarTuple

import psycopg
import psycopg_pool
import trio

from trioserve.errors import StoreError
from trioserve.stores.base import Store
from trioserve.stores.checks import Append, EventQuery, SessionChange, SessionQuery
from trioserve.stores.codec import (
    _opt_micros,
    _to_micros,
    end_params,
    session_row,
    turn_row,
    update_params,
)
from trioserve.stores.pg_cancel import _cancel_requests, _request_cancel
from trioserve.stores.pg_listen import Listener
from trioserve.stores.pg_log import (
    _append,
    _bounds,
    _drop_chunk,
    _expire_leases,
    _insert_turn,
    _list_turns,
    _read,
    _renew,
    _running_turns,
    _select_turn,
)
from trioserve.stores.pg_schema import Conn, PgTarget, configure, migrate, parse_url
from trioserve.stores.pg_sessions import (
    _count,
    _delete,
    _expire,
    _insert,
    _list,
    _purge_chunk,
    _select,
    _update,
)
from trioserve.stores.records import (
    LogBounds,
    LoggedEvent,
    Session,
    SessionStatus,
    TurnRecord,
    TurnStatus,
)

__all__ = ["POOL_SIZE", "PostgresStore"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

#: Connections in the pool, and calls that may run at once.
POOL_SIZE: Final = 4
#: How long opening waits for the database.
CONNECT_TIMEOUT_SECONDS: Final = 10.0
#: As the SQLite store's chunks (``DROP_CHUNK_ROWS``, ``PURGE_CHUNK_SESSIONS``).
DROP_CHUNK_ROWS: Final = 5000
PURGE_CHUNK_SESSIONS: Final = 500
_SEQ_MIN: Final = -(2**63)  # bigint's range, to clamp seq bounds into
_SEQ_MAX: Final = 2**63 - 1


def _connect(target: PgTarget) -> psycopg_pool.ConnectionPool[Conn]:
    """In a worker thread: migrate the database, then open the pool."""
    try:
        with psycopg.connect(
            target.conninfo, autocommit=True, connect_timeout=int(CONNECT_TIMEOUT_SECONDS)
        ) as conn:
            migrate(conn, target)
        pool: psycopg_pool.ConnectionPool[Conn] = psycopg_pool.ConnectionPool(
            target.conninfo,
            kwargs={"autocommit": True},
            min_size=1,
            max_size=POOL_SIZE,
            configure=lambda conn: configure(conn, target),
            open=False,
            name=target.description,
        )
        pool.open(wait=True, timeout=CONNECT_TIMEOUT_SECONDS)
    except psycopg.Error as exc:
        raise StoreError(f"cannot open session store {target.description}: {exc}") from exc
    return pool


class PostgresStore(Store):
    """Sessions in PostgreSQL.  Make one with ``await PostgresStore.open(url)``."""

    def __init__(self, pool: psycopg_pool.ConnectionPool[Conn], target: PgTarget) -> None:
        """Wrap an open pool; use ``open`` instead."""
        self._pool = pool
        self._target = target
        self._limiter = trio.CapacityLimiter(POOL_SIZE)
        self._inflight = 0
        self._idle = trio.Event()  # set when closing and no call is in flight
        self._closing = False
        self._closed = trio.Event()
        self._listener = Listener(target.conninfo, target.channel)
        self.description = target.description

    @classmethod
    async def open(cls, url: str) -> PostgresStore:
        """Open (creating and migrating if needed) the store at ``url``.

        ``ValueError`` for a malformed URL; ``StoreError`` naming the store if
        PostgreSQL can't be reached or has a newer schema version.
        """
        target = parse_url(url)
        pool = await trio.to_thread.run_sync(_connect, target)
        return cls(pool, target)

    async def _run(self, fn: Callable[[Conn, *Ts], T], *args: *Ts) -> T:
        if self._closing:
            raise StoreError("store is closed")
        self._inflight += 1
        started = time.perf_counter()
        try:
            return await trio.to_thread.run_sync(self._call, fn, *args, limiter=self._limiter)
        finally:
            self._inflight -= 1
            if self._closing and not self._inflight:
                self._idle.set()
            if self.on_operation is not None:
                self.on_operation(fn.__name__.lstrip("_"), time.perf_counter() - started)

    def _call(self, fn: Callable[[Conn, *Ts], T], *args: *Ts) -> T:
        """In a worker thread, holding the limiter: run ``fn`` on a pooled connection."""
        try:
            with self._pool.connection() as conn:
                return fn(conn, *args)
        except psycopg.Error as exc:
            raise StoreError(f"session store {self.description}: {exc}") from exc

    async def _create(
        self,
        session: Session,
        spec_json: str,
        inputs_json: str,
        max_active: int | None,
        tenant_cap: int | None = None,
    ) -> None:
        row = session_row(session, spec_json, inputs_json)
        await self._run(_insert, row, max_active, tenant_cap)

    async def get(self, session_id: str) -> Session:
        return await self._run(_select, session_id)

    async def _update(self, session_id: str, change: SessionChange) -> Session:
        return await self._run(_update, update_params(session_id, change))

    async def delete(self, session_id: str) -> None:
        await self._run(_delete, session_id)

    async def _list(self, query: SessionQuery) -> builtins.list[Session]:
        agent_name, status, limit, before, tenant = query
        clauses: list[str] = []
        params: list[Any] = []
        for column, value in (("tenant", tenant), ("agent_name", agent_name)):
            if value is not None:
                clauses.append(f"{column} = %s")
                params.append(value)
        if status is not None:
            clauses.append("status = %s")
            params.append(status.value)
        if before is not None:
            clauses.append("(last_active_at, id) < (%s, %s)")
            params += [_to_micros(before[0], "before"), before[1]]
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        params.append(limit)
        return await self._run(_list, where, params)

    async def _mark_expired(
        self, cutoff: datetime, exclude: frozenset[str], now: datetime
    ) -> builtins.list[str]:
        micros = _to_micros(cutoff, "cutoff")
        return await self._run(_expire, micros, sorted(exclude), _to_micros(now, "now"))

    async def _count(self, status: SessionStatus) -> int:
        return await self._run(_count, status.value)

    async def _purge_sessions(self, cutoff: datetime) -> int:
        micros = _to_micros(cutoff, "cutoff")
        total = 0
        while True:
            purged, done = await self._run(
                _purge_chunk, micros, DROP_CHUNK_ROWS, PURGE_CHUNK_SESSIONS
            )
            total += purged
            if done:
                return total

    # -- turns and the event log ------------------------------------------------

    async def _create_turn(
        self, turn: TurnRecord, max_running: int | None, tenant_cap: int | None = None
    ) -> None:
        await self._run(_insert_turn, turn_row(turn), max_running, tenant_cap)

    async def _renew_leases(self, owner: str, until: datetime) -> int:
        return await self._run(_renew, owner, _to_micros(until, "until"))

    async def _expire_leases(self, now: datetime) -> builtins.list[TurnRecord]:
        return await self._run(_expire_leases, _to_micros(now, "now"))

    async def request_cancel(self, session_id: str, turn_id: str) -> bool:
        return await self._run(_request_cancel, session_id, turn_id)

    async def cancel_requests(self, owner: str) -> builtins.list[tuple[str, str]]:
        return await self._run(_cancel_requests, owner)

    async def get_turn(self, session_id: str, turn_id: str) -> TurnRecord:
        return await self._run(_select_turn, session_id, turn_id)

    async def _list_turns(
        self, session_id: str, status: TurnStatus | None, limit: int | None
    ) -> builtins.list[TurnRecord]:
        wanted = None if status is None else status.value
        return await self._run(_list_turns, session_id, wanted, limit)

    async def running_turns(self) -> builtins.list[TurnRecord]:
        return await self._run(_running_turns)

    async def _append_events(self, session_id: str, append: Append) -> None:
        turn_id, batch, started_at, end = append
        ending = end_params(end)
        started = _opt_micros(started_at, "started_at")
        channel = self._target.channel
        await self._run(_append, channel, session_id, turn_id, batch, started, ending)

    async def _read_events(self, session_id: str, query: EventQuery) -> builtins.list[LoggedEvent]:
        after, before, turn_id, limit, max_bytes = query
        low = min(max(after, _SEQ_MIN), _SEQ_MAX)
        high = _SEQ_MAX if before is None else min(max(before, _SEQ_MIN), _SEQ_MAX)
        return await self._run(_read, session_id, low, high, turn_id, limit, max_bytes)

    async def log_bounds(self, session_id: str) -> LogBounds:
        return await self._run(_bounds, session_id)

    async def _drop_events(self, cutoff: datetime) -> int:
        micros = _to_micros(cutoff, "cutoff")
        total = 0
        while True:
            deleted, done = await self._run(_drop_chunk, micros, DROP_CHUNK_ROWS)
            total += deleted
            if done:
                return total

    async def wait_appended(self, session_id: str, after_seq: int) -> None:
        """As ``Store.wait_appended``, woken by ``NOTIFY`` instead of polling."""
        if self._closing:
            raise StoreError("store is closed")
        await self._listener.ready()
        while True:
            event = self._listener.register(session_id, after_seq)
            try:
                if (await self.log_bounds(session_id)).last > after_seq:
                    return
                await event.wait()
            finally:
                self._listener.unregister(session_id, event)

    async def close(self) -> None:
        """Wait for in-flight calls, close the pool, stop the listener.  Idempotent, shielded."""
        with trio.CancelScope(shield=True):
            if self._closing:
                await self._closed.wait()
                return
            self._closing = True
            try:
                with trio.move_on_after(30):
                    if self._inflight:
                        await self._idle.wait()
                with contextlib.suppress(psycopg.Error):
                    await trio.to_thread.run_sync(self._pool.close, 5.0)
                await self._listener.stop()
            finally:
                self._closed.set()
