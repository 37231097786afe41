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
- **Versioned.**  ``PRAGMA user_version`` holds the schema version (5:
  sessions with their tenant, ``ended_at`` and the paging indexes, turns
  with their leases and one running per session, and the event log; 4 had
  no leases, 3 no tenant, 2 no ``ended_at``, 1 sessions only);
  opening runs the pending migrations in one transaction and refuses a file
  made by a newer version.
- **Clear errors.**  A failure of SQLite or the file system is raised as
  ``StoreError`` naming the database path.

The schema, its migrations and opening the file are in ``sqlite_schema``;
the statements in ``sqlite_sessions`` (and the encoding) and ``sqlite_log``.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, Final, TypeVar, TypeVarTuple

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
from trioserve.stores.records import (
    LogBounds,
    LoggedEvent,
    Session,
    SessionStatus,
    TurnRecord,
    TurnStatus,
)
from trioserve.stores.sqlite_log import (
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
from trioserve.stores.sqlite_schema import BUSY_TIMEOUT_MS, SCHEMA_VERSION, connect
from trioserve.stores.sqlite_sessions import (
    _count,
    _delete,
    _expire,
    _insert,
    _list,
    _purge_chunk,
    _select,
    _update,
)

__all__ = [
    "BUSY_TIMEOUT_MS",
    "DROP_CHUNK_ROWS",
    "PURGE_CHUNK_SESSIONS",
    "SCHEMA_VERSION",
    "SQLiteStore",
]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

#: How many events one ``drop_events`` step deletes (one transaction, one thread call),
#: and how many events or turns one ``purge_sessions`` step deletes.
DROP_CHUNK_ROWS: Final = 5000
#: How many sessions one ``purge_sessions`` step deletes at most.
PURGE_CHUNK_SESSIONS: Final = 500

_SEQ_MIN: Final = -(2**63)  # SQLite's INTEGER range, to clamp seq bounds into
_SEQ_MAX: Final = 2**63 - 1


# --- the store --------------------------------------------------------------


class SQLiteStore(Store):
    """Sessions in one SQLite file.  Make one with ``await SQLiteStore.open(path)``."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        """Wrap an open, configured connection; use ``open`` instead."""
        self._conn: sqlite3.Connection | None = conn  # None once closed
        self._path = path
        self._limiter = trio.CapacityLimiter(1)
        self._closing = False
        self._closed = trio.Event()
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
        if self._closing:
            raise StoreError("store is closed")
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
        if tenant is not None:
            clauses.append("tenant = ?")
            params.append(tenant)
        if before is not None:
            clauses.append("(last_active_at, id) < (?, ?)")
            params += [_to_micros(before[0], "before"), before[1]]
        if agent_name is not None:
            clauses.append("agent_name = ?")
            params.append(agent_name)
        if status is not None:
            clauses.append("status = ?")
            params.append(status.value)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        params.append(-1 if limit is None else limit)
        return await self._run(_list, where, params)

    async def _mark_expired(
        self, cutoff: datetime, exclude: frozenset[str], now: datetime
    ) -> builtins.list[str]:
        excluded = json.dumps(sorted(exclude))  # one bound JSON array, however many ids
        micros = _to_micros(now, "now")
        return await self._run(_expire, _to_micros(cutoff, "cutoff"), excluded, micros)

    async def _count(self, status: SessionStatus) -> int:
        return await self._run(_count, status.value)

    async def _purge_sessions(self, cutoff: datetime) -> int:
        """Purge in chunks (see ``_purge_chunk``), each its own transaction and thread call."""
        micros = _to_micros(cutoff, "cutoff")
        total = 0
        while True:
            purged, done = await self._run(
                _purge_chunk, micros, DROP_CHUNK_ROWS, PURGE_CHUNK_SESSIONS
            )
            total += purged
            if done:
                return total

    # -- turns and the event log --------------------------------------------

    async def _create_turn(
        self, turn: TurnRecord, max_running: int | None, tenant_cap: int | None = None
    ) -> None:
        await self._run(_insert_turn, turn_row(turn), max_running, tenant_cap)

    async def _renew_leases(self, owner: str, until: datetime) -> int:
        return await self._run(_renew, owner, _to_micros(until, "until"))

    async def _expire_leases(self, now: datetime) -> builtins.list[TurnRecord]:
        return await self._run(_expire_leases, _to_micros(now, "now"))

    async def get_turn(self, session_id: str, turn_id: str) -> TurnRecord:
        return await self._run(_select_turn, session_id, turn_id)

    async def _list_turns(
        self, session_id: str, status: TurnStatus | None, limit: int | None
    ) -> builtins.list[TurnRecord]:
        wanted = None if status is None else status.value
        return await self._run(_list_turns, session_id, wanted, -1 if limit is None else limit)

    async def running_turns(self) -> builtins.list[TurnRecord]:
        return await self._run(_running_turns)

    async def _append_events(self, session_id: str, append: Append) -> None:
        turn_id, batch, started_at, end = append
        ending = end_params(end)
        started = _opt_micros(started_at, "started_at")
        await self._run(_append, session_id, turn_id, batch, started, ending)

    async def _read_events(self, session_id: str, query: EventQuery) -> builtins.list[LoggedEvent]:
        after, before, turn_id, limit, max_bytes = query
        sql_limit = -1 if limit is None else limit
        low = min(max(after, _SEQ_MIN), _SEQ_MAX)
        high = _SEQ_MAX if before is None else min(max(before, _SEQ_MIN), _SEQ_MAX)
        return await self._run(_read, session_id, low, high, turn_id, sql_limit, max_bytes)

    async def log_bounds(self, session_id: str) -> LogBounds:
        return await self._run(_bounds, session_id)

    async def _drop_events(self, cutoff: datetime) -> int:
        """Drop in chunks of ``DROP_CHUNK_ROWS``, each its own transaction and thread call."""
        micros = _to_micros(cutoff, "cutoff")
        total = 0
        while True:
            deleted, done = await self._run(_drop_chunk, micros, DROP_CHUNK_ROWS)
            total += deleted
            if done:
                return total

    async def close(self) -> None:
        """Close the connection once in-flight calls are done.  Idempotent and shielded."""
        with trio.CancelScope(shield=True):
            if self._closing:
                await self._closed.wait()
                return
            self._closing = True
            try:
                await trio.to_thread.run_sync(self._close_connection, limiter=self._limiter)
            finally:
                self._closed.set()

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
