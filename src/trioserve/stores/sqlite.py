"""``SQLiteStore``: the durable session store, one SQLite file (stdlib ``sqlite3``).

Guarantees, beyond the ``Store`` contract:

- **Serialised.**  One connection, used only from Trio's worker threads
  (``trio.to_thread.run_sync``) and one at a time (a ``CapacityLimiter(1)``).
  Each call is one thread call running one statement or one transaction
  (``BEGIN IMMEDIATE`` ... ``COMMIT``, rolled back on any error), so each
  call is atomic.  The exceptions are ``drop_events`` and ``purge_sessions``:
  they delete in chunks of at most ``DROP_CHUNK_ROWS`` events (and
  ``PURGE_CHUNK_SESSIONS`` sessions), each chunk its own transaction and
  thread call, so other calls interleave and no call holds the connection
  long.
- **Cancellation.**  A call cancelled while it waits for the connection
  does nothing.  Once its statement has started it runs to completion and
  the call returns normally; Trio delivers the cancellation at the caller's
  next checkpoint (``drop_events`` and ``purge_sessions``: before the next
  chunk; the chunks done stay done).  ``close`` is shielded and always finishes.
- **Private files.**  Directories it creates are 0700 (existing ones are
  left alone); the database file is created 0600 (an existing one we own is
  tightened to 0600), and SQLite gives its ``-wal``/``-shm`` files the
  database file's mode, whatever the umask.
- **Durable and crash-safe.**  WAL journal, ``synchronous=NORMAL`` (a power
  loss may drop the last commits, never corrupt the file), a busy timeout
  for other processes holding the file.
- **Exact.**  Times are stored as integer microseconds since the Unix epoch
  (UTC), so ordering is exact and values round-trip to the microsecond;
  ``spec`` and ``inputs`` are stored as JSON text; an event's ``raw`` is a
  BLOB, byte for byte.
- **The event log.**  ``events`` is a rowid table (rows may be megabytes, so
  not ``WITHOUT ROWID``) keyed by a unique ``(session_id, seq)`` index, with
  an index by ``(turn_id, seq)``.  ``append_events`` is one transaction that
  checks the seqs run on from ``sessions.last_seq``, inserts the batch with
  ``executemany`` and updates the turn and the session; ``last_seq`` lives in
  the sessions row, so a seq is never reused, even after its events are
  dropped or the process restarts.  A turn's ``events_dropped`` flag keeps
  ``drop_events`` from revisiting turns it has emptied.  Deleting a session
  deletes its turns and events in the same transaction; ``purge_sessions``
  deletes those of the sessions it purges in chunks (events first, then
  turns, then the session rows), finding them by the partial index on
  ``sessions.ended_at``.
- **Paging.**  ``list`` orders by ``(last_active_at DESC, id DESC)``, which
  the indexes ``(last_active_at, id)``, ``(status, last_active_at, id)`` and
  ``(agent_name, last_active_at, id)`` serve without sorting; ``before`` is
  a row-value comparison on the same columns, so a deep page costs what the
  first one does.
- **Expired is final**, in the store and in the schema itself: a trigger
  aborts any statement that moves an ``expired`` row to another status.
- **Single flight and caps.**  A partial unique index allows one running
  turn per session; ``create_turn`` and ``create`` count and insert in one
  ``BEGIN IMMEDIATE`` transaction, so their caps hold across processes
  sharing the file.
- **Versioned.**  ``PRAGMA user_version`` holds the schema version (8:
  sessions with their tenant, ``ended_at`` and the paging indexes, turns
  with their leases, queued turns and one running per session, the event
  log, idempotency keys, and crons with their runs; 7 had no crons, 6 no
  queued turns, 5 no keys, 4 no leases, 3 no tenant, 2 no ``ended_at``,
  1 sessions only);
  opening runs the pending migrations in one transaction and refuses a file
  made by a newer version.
- **Clear errors.**  A failure of SQLite or the file system is raised as
  ``StoreError`` naming the database path.

The schema, its migrations and opening the file are in ``sqlite_schema``;
the statements in ``sqlite_sessions`` and ``sqlite_log`` (the encoding in
``codec``); the hooks that run them, shared with the PostgreSQL store, in
``sql`` (``SQLStore``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, TypeVar, TypeVarTuple

import trio

from trioserve.errors import StoreError
from trioserve.stores import sqlite_log, sqlite_queue, sqlite_sessions
from trioserve.stores.sql import DROP_CHUNK_ROWS, PURGE_CHUNK_SESSIONS, Queries, SQLStore
from trioserve.stores.sql_outbox import OutboxDialect
from trioserve.stores.sqlite_schema import (
    BUSY_TIMEOUT_MS,
    KEYS,
    SCHEMA_VERSION,
    _transaction,
    connect,
)

__all__ = [
    "BUSY_TIMEOUT_MS",
    "DROP_CHUNK_ROWS",
    "PURGE_CHUNK_SESSIONS",
    "QUERIES",
    "SCHEMA_VERSION",
    "SQLiteStore",
]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

#: The statements, in SQLite's dialect (``?``; excluded ids as one JSON array).
QUERIES: Final = Queries(
    placeholder="?",
    id_array=json.dumps,
    keys=KEYS,
    insert=sqlite_sessions._insert,
    select=sqlite_sessions._select,
    update=sqlite_sessions._update,
    delete=sqlite_sessions._delete,
    list=sqlite_sessions._list,
    expire=sqlite_sessions._expire,
    count=sqlite_sessions._count,
    purge_chunk=sqlite_sessions._purge_chunk,
    insert_turn=sqlite_log._insert_turn,
    renew=sqlite_log._renew,
    select_turn=sqlite_log._select_turn,
    list_turns=sqlite_log._list_turns,
    running_turns=sqlite_log._running_turns,
    begin=sqlite_queue._begin,
    end_queued=sqlite_queue._end_queued,
    queued_turns=sqlite_queue._queued_turns,
    claim_queued=sqlite_queue._claim_queued,
    append=sqlite_log._append,
    read=sqlite_log._read,
    bounds=sqlite_log._bounds,
    drop_chunk=sqlite_log._drop_chunk,
)


class SQLiteStore(SQLStore):
    """Sessions in one SQLite file.  Make one with ``await SQLiteStore.open(path)``."""

    _q = QUERIES
    _outbox = OutboxDialect("?", _transaction)

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        """Wrap an open, configured connection; use ``open`` instead."""
        super().__init__()
        self._conn: sqlite3.Connection | None = conn  # None once closed
        self._path = path
        self._limiter = trio.CapacityLimiter(1)
        self.description = f"sqlite:{path}"

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    @classmethod
    async def open(cls, path: str | os.PathLike[str]) -> SQLiteStore:
        """Open (creating and migrating if needed) the store at ``path``.

        Raises ``StoreError`` naming the path if it can't be created, isn't a
        SQLite database, or was written by a newer schema version.
        """
        conn, full = await trio.to_thread.run_sync(connect, path)
        return cls(conn, full)

    async def _run(self, fn: Callable[[sqlite3.Connection, *Ts], T], *args: *Ts) -> T:
        self._check_open()
        observe = self.on_operation
        if observe is None:
            return await trio.to_thread.run_sync(self._call, fn, *args, limiter=self._limiter)
        started = time.perf_counter()
        try:
            return await trio.to_thread.run_sync(self._call, fn, *args, limiter=self._limiter)
        finally:
            observe(fn.__name__.lstrip("_"), time.perf_counter() - started)

    def _call(self, fn: Callable[[sqlite3.Connection, *Ts], T], *args: *Ts) -> T:
        """In the worker thread, holding the limiter: run ``fn`` on the connection."""
        if self._conn is None:  # closed while this call waited for the limiter
            raise StoreError("store is closed")
        try:
            return fn(self._conn, *args)
        except sqlite3.Error as exc:
            raise StoreError(f"session store {self._path}: {exc}") from exc

    async def _shutdown(self) -> None:
        """Close the connection once in-flight calls are done (``close``)."""
        await trio.to_thread.run_sync(self._close_connection, limiter=self._limiter)

    def _close_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        with contextlib.suppress(sqlite3.Error):
            conn.execute("PRAGMA optimize")
        try:
            conn.close()
        except sqlite3.Error as exc:
            raise StoreError(f"session store {self._path}: closing failed: {exc}") from exc
