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
from typing import Final, TypeVar, TypeVarTuple

import psycopg
import psycopg_pool
import trio

from trioserve.errors import StoreError
from trioserve.stores import pg_log, pg_queue, pg_sessions
from trioserve.stores.checks import has_nul
from trioserve.stores.pg_cancel import _cancel_requests, _request_cancel
from trioserve.stores.pg_listen import Listener
from trioserve.stores.pg_schema import Conn, PgTarget, configure, migrate, parse_url
from trioserve.stores.sql import DROP_CHUNK_ROWS, PURGE_CHUNK_SESSIONS, Queries, SQLStore
from trioserve.stores.sql_outbox import OutboxDialect

__all__ = ["DROP_CHUNK_ROWS", "POOL_SIZE", "PURGE_CHUNK_SESSIONS", "QUERIES", "PostgresStore"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

#: Connections in the pool, and calls that may run at once.
POOL_SIZE: Final = 4
#: How long opening waits for the database.
CONNECT_TIMEOUT_SECONDS: Final = 10.0

#: The statements, in PostgreSQL's dialect (``%s``; excluded ids as one ``text[]``).
QUERIES: Final = Queries(
    placeholder="%s",
    id_array=list,
    keys=pg_sessions.KEYS,
    insert=pg_sessions._insert,
    select=pg_sessions._select,
    update=pg_sessions._update,
    delete=pg_sessions._delete,
    list=pg_sessions._list,
    expire=pg_sessions._expire,
    count=pg_sessions._count,
    purge_chunk=pg_sessions._purge_chunk,
    insert_turn=pg_log._insert_turn,
    renew=pg_log._renew,
    select_turn=pg_log._select_turn,
    list_turns=pg_log._list_turns,
    running_turns=pg_log._running_turns,
    begin=pg_queue._begin,
    end_queued=pg_queue._end_queued,
    queued_turns=pg_queue._queued_turns,
    claim_queued=pg_queue._claim_queued,
    append=pg_log._append,
    read=pg_log._read,
    bounds=pg_log._bounds,
    drop_chunk=pg_log._drop_chunk,
)


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


class PostgresStore(SQLStore):
    """Sessions in PostgreSQL.  Make one with ``await PostgresStore.open(url)``."""

    _q = QUERIES
    _outbox = OutboxDialect("%s", lambda conn: conn.transaction(), "FOR UPDATE SKIP LOCKED")

    def __init__(self, pool: psycopg_pool.ConnectionPool[Conn], target: PgTarget) -> None:
        """Wrap an open pool; use ``open`` instead."""
        super().__init__()
        self._pool = pool
        self._target = target
        self._limiter = trio.CapacityLimiter(POOL_SIZE)
        self._inflight = 0
        self._idle = trio.Event()  # set when closing and no call is in flight
        self._listener = Listener(target.conninfo, target.channel)
        self._channel = target.channel
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
        self._check_open()
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

    async def request_cancel(self, session_id: str, turn_id: str) -> bool:
        if has_nul(session_id, turn_id):  # no such turn (``checks.has_nul``)
            return False
        return await self._run(_request_cancel, session_id, turn_id)

    async def cancel_requests(self, owner: str) -> builtins.list[tuple[str, str]]:
        if has_nul(owner):
            return []
        return await self._run(_cancel_requests, owner)

    async def wait_appended(self, session_id: str, after_seq: int) -> None:
        """As ``Store.wait_appended``, woken by ``NOTIFY`` instead of polling."""
        self._check_open()
        await self._listener.ready()
        while True:
            event = self._listener.register(session_id, after_seq)
            try:
                if (await self.log_bounds(session_id)).last > after_seq:
                    return
                await event.wait()
            finally:
                self._listener.unregister(session_id, event)

    async def _shutdown(self) -> None:
        """Wait for in-flight calls (30 s at most), close the pool, stop the listener."""
        with trio.move_on_after(30):
            if self._inflight:
                await self._idle.wait()
        with contextlib.suppress(psycopg.Error):
            await trio.to_thread.run_sync(self._pool.close, 5.0)
        await self._listener.stop()
