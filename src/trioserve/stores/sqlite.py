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
- **Versioned.**  ``PRAGMA user_version`` holds the schema version (4:
  sessions with their tenant, ``ended_at`` and the paging indexes, turns and
  the event log; 3 had no tenant, 2 no ``ended_at``, 1 sessions only);
  opening runs the pending migrations in one transaction and refuses a file
  made by a newer version.
- **Clear errors.**  A failure of SQLite or the file system is raised as
  ``StoreError`` naming the database path.

The schema, its migrations and opening the file are in ``sqlite_schema``.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, TypeVar, TypeVarTuple

import trio
from pydantic_core import from_json

from trioserve.errors import (
    DuplicateSession,
    DuplicateTurn,
    LogConflict,
    SessionExpired,
    SessionNotFound,
    StoreError,
    TurnNotFound,
)
from trioserve.stores.base import (
    TERMINAL_STATUSES,
    UNSET,
    LogBounds,
    LoggedEvent,
    Session,
    SessionKey,
    SessionStatus,
    Store,
    TurnEnd,
    TurnRecord,
    TurnStatus,
    _check_batch,
    _check_new_turn,
    _ended_at_of_new,
    _seq_conflict,
    _Unset,
    check_max_bytes,
    utcnow,
)
from trioserve.stores.sqlite_schema import BUSY_TIMEOUT_MS, SCHEMA_VERSION, connect

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

_COLUMNS: Final = (
    "id, agent_name, runtime_type, status, created_at, last_active_at, spec, inputs, "
    "adapter_state, last_seq, ended_at, tenant"
)
#: In ``TurnRecord``'s field order.
_TURN_COLUMNS: Final = (
    "id, session_id, input, status, created_at, started_at, ended_at, reason, first_seq, last_seq"
)
_TURN_ORDER: Final = "ORDER BY created_at, id"
_SEQ_MIN: Final = -(2**63)  # SQLite's INTEGER range, to clamp seq bounds into
_SEQ_MAX: Final = 2**63 - 1
_ORDER: Final = "ORDER BY last_active_at DESC, id DESC"
_TERMINAL: Final = ", ".join(sorted(f"'{s.value}'" for s in TERMINAL_STATUSES))
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_STATUSES: Final = {status.value: status for status in SessionStatus}
_MICROSECOND: Final = timedelta(microseconds=1)


# --- encoding ---------------------------------------------------------------


def _to_micros(value: datetime, what: str) -> int:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be a timezone-aware datetime, got {value!r}")
    return (value - _EPOCH) // _MICROSECOND


def _from_micros(value: int) -> datetime:
    return _EPOCH + timedelta(0, 0, value)  # microseconds (positional: faster)


def _to_json(value: Any, what: str) -> str:
    try:
        return json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} is not JSON-serialisable: {exc}") from exc


def _opt_micros(value: datetime | None, what: str) -> int | None:
    return None if value is None else _to_micros(value, what)


def _opt_from_micros(value: int | None) -> datetime | None:
    return None if value is None else _from_micros(value)


def _check_limit(limit: int | None) -> int:
    """``limit`` as SQL's ``LIMIT`` (-1: none)."""
    if limit is None:
        return -1
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    return limit


def _session(row: tuple[Any, ...]) -> Session:
    sid, agent, runtime, status, created, last_active, spec, inputs, state, *rest = row
    last_seq, ended, tenant = rest
    return Session(
        id=sid,
        agent_name=agent,
        runtime_type=runtime,
        status=_STATUSES[status],
        created_at=_from_micros(created),
        last_active_at=_from_micros(last_active),
        spec=from_json(spec),  # what json.loads gives, at a quarter of its cost
        inputs=from_json(inputs),
        adapter_state=state,
        last_seq=last_seq,
        ended_at=_opt_from_micros(ended),
        tenant=tenant,
    )


def _turn(row: tuple[Any, ...]) -> TurnRecord:
    tid, sid, text, status, created, started, ended, reason, first_seq, last_seq = row
    return TurnRecord(
        id=tid,
        session_id=sid,
        input=text,
        status=TurnStatus(status),
        created_at=_from_micros(created),
        started_at=_opt_from_micros(started),
        ended_at=_opt_from_micros(ended),
        reason=reason,
        first_seq=first_seq,
        last_seq=last_seq,
    )


# --- statements (run in a worker thread, holding the limiter) ---------------


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``; ``ROLLBACK`` on any error (a failed commit too)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _require_session(conn: sqlite3.Connection, session_id: str) -> int:
    """The session's ``last_seq``; ``SessionNotFound`` if there is no such session."""
    row = conn.execute("SELECT last_seq FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if row is None:
        raise SessionNotFound(f"session {session_id} not found")
    return int(row[0])


def _insert(conn: sqlite3.Connection, row: tuple[Any, ...]) -> None:
    try:
        conn.execute(
            f"INSERT INTO sessions ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row
        )
    except sqlite3.IntegrityError as exc:
        if exc.sqlite_errorname == "SQLITE_CONSTRAINT_PRIMARYKEY":
            raise DuplicateSession(f"session {row[0]!r} already exists") from None
        raise


def _select(conn: sqlite3.Connection, session_id: str) -> Session:
    row = conn.execute(f"SELECT {_COLUMNS} FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if row is None:
        raise SessionNotFound(f"session {session_id} not found")
    return _session(row)


def _update(conn: sqlite3.Connection, params: dict[str, Any]) -> Session:
    rows = conn.execute(
        f"""
        UPDATE sessions SET
            status = coalesce(:status, status),
            last_active_at = coalesce(:last_active_at, last_active_at),
            adapter_state = CASE WHEN :set_state THEN :adapter_state ELSE adapter_state END,
            ended_at = CASE WHEN coalesce(:status, status) IN ({_TERMINAL})
                            THEN coalesce(ended_at, :now) END
        WHERE id = :id AND (status != 'expired' OR coalesce(:status, 'expired') = 'expired')
        RETURNING {_COLUMNS}
        """,
        params,
    ).fetchall()
    if rows:
        return _session(rows[0])
    found = conn.execute("SELECT 1 FROM sessions WHERE id = ?", (params["id"],)).fetchone()
    if found is None:
        raise SessionNotFound(f"session {params['id']} not found")
    raise SessionExpired(
        f"session {params['id']!r} is expired; it cannot become {params['status']}"
    )


def _delete(conn: sqlite3.Connection, session_id: str) -> None:
    with _transaction(conn):
        conn.execute("DELETE FROM events WHERE session_id = ?", (session_id,))
        conn.execute("DELETE FROM turns WHERE session_id = ?", (session_id,))
        conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,))


def _list(conn: sqlite3.Connection, where: str, params: list[Any]) -> list[Session]:
    sql = f"SELECT {_COLUMNS} FROM sessions {where} {_ORDER} LIMIT ?"
    return [_session(row) for row in conn.execute(sql, params).fetchall()]


def _expire(conn: sqlite3.Connection, cutoff: int, exclude: str, now: int) -> list[str]:
    rows = conn.execute(
        """
        UPDATE sessions SET status = 'expired', ended_at = ?3
        WHERE status = 'active' AND last_active_at < ?1
          AND id NOT IN (SELECT value FROM json_each(?2))
        RETURNING id
        """,
        (cutoff, exclude, now),
    ).fetchall()
    return sorted(sid for (sid,) in rows)


def _purge_chunk(
    conn: sqlite3.Connection, cutoff: int, rows: int, sessions: int
) -> tuple[int, bool]:
    """One step of ``purge_sessions``: the oldest ``sessions`` sessions it may purge.

    Deletes up to ``rows`` of their events, else up to ``rows`` of their
    turns, else the sessions themselves.  Returns how many sessions it
    deleted and whether that was the last of them.
    """
    with _transaction(conn):
        found = conn.execute(
            f"""
            SELECT id FROM sessions AS s INDEXED BY sessions_to_purge
            WHERE ended_at < ?1 AND status IN ({_TERMINAL}) AND NOT EXISTS (
                SELECT 1 FROM turns WHERE session_id = s.id AND status = 'running'
            )
            ORDER BY ended_at LIMIT ?2
            """,
            (cutoff, sessions),
        ).fetchall()
        if not found:
            return 0, True
        doomed = json.dumps([sid for (sid,) in found])  # one bound JSON array
        for table in ("events", "turns"):
            deleted = conn.execute(
                f"""
                DELETE FROM {table} WHERE rowid IN (
                    SELECT rowid FROM {table}
                    WHERE session_id IN (SELECT value FROM json_each(?1)) LIMIT ?2
                )
                """,
                (doomed, rows),
            ).rowcount
            if deleted == rows:
                return 0, False  # maybe more: the next step takes the same sessions on
        conn.execute("DELETE FROM sessions WHERE id IN (SELECT value FROM json_each(?))", (doomed,))
    return len(found), len(found) < sessions


def _count(conn: sqlite3.Connection, status: str) -> int:
    (n,) = conn.execute("SELECT count(*) FROM sessions WHERE status = ?", (status,)).fetchone()
    return int(n)


def _insert_turn(conn: sqlite3.Connection, row: tuple[Any, ...]) -> None:
    turn_id, session_id, created = row[0], row[1], row[4]
    with _transaction(conn):
        _require_session(conn, session_id)
        try:
            conn.execute(
                f"INSERT INTO turns ({_TURN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL)",
                row,
            )
        except sqlite3.IntegrityError as exc:
            if exc.sqlite_errorname == "SQLITE_CONSTRAINT_PRIMARYKEY":
                raise DuplicateTurn(f"turn {turn_id!r} already exists") from None
            raise
        conn.execute("UPDATE sessions SET last_active_at = ? WHERE id = ?", (created, session_id))


def _select_turn(conn: sqlite3.Connection, session_id: str, turn_id: str) -> TurnRecord:
    row = conn.execute(
        f"SELECT {_TURN_COLUMNS} FROM turns WHERE id = ? AND session_id = ?",
        (turn_id, session_id),
    ).fetchone()
    if row is None:
        raise TurnNotFound(f"turn {turn_id} of session {session_id} not found")
    return _turn(row)


def _list_turns(
    conn: sqlite3.Connection, session_id: str, status: str | None, limit: int
) -> list[TurnRecord]:
    _require_session(conn, session_id)
    rows = conn.execute(
        f"""
        SELECT {_TURN_COLUMNS} FROM turns
        WHERE session_id = ?1 AND (?2 IS NULL OR status = ?2)
        {_TURN_ORDER} LIMIT ?3
        """,
        (session_id, status, limit),
    ).fetchall()
    return [_turn(row) for row in rows]


def _running_turns(conn: sqlite3.Connection) -> list[TurnRecord]:
    rows = conn.execute(
        f"SELECT {_TURN_COLUMNS} FROM turns WHERE status = 'running' {_TURN_ORDER}"
    ).fetchall()
    return [_turn(row) for row in rows]


#: Events per ``INSERT`` statement of ``append_events``: one statement of many
#: rows costs SQLite and the ``sqlite3`` module less per row than one per row.
_EVENTS_PER_INSERT: Final = 200
_INSERT_EVENT: Final = "INSERT INTO events (session_id, seq, turn_id, type, raw) VALUES "
_INSERT_EVENTS: Final = _INSERT_EVENT + ", ".join(["(?, ?, ?, ?, ?)"] * _EVENTS_PER_INSERT)


def _append(
    conn: sqlite3.Connection,
    session_id: str,
    turn_id: str,
    batch: Sequence[LoggedEvent],
    started: int | None,
    end: tuple[str, str, int] | None,
) -> None:
    values = [v for e in batch for v in (session_id, e.seq, turn_id, e.type, e.raw)]
    many = 5 * _EVENTS_PER_INSERT
    whole = len(values) - len(values) % many
    with _transaction(conn):
        last_seq = _require_session(conn, session_id)
        turn = conn.execute(
            "SELECT session_id, status FROM turns WHERE id = ?", (turn_id,)
        ).fetchone()
        if turn is None or turn[0] != session_id:
            raise TurnNotFound(f"turn {turn_id} of session {session_id} not found")
        if turn[1] != TurnStatus.RUNNING:
            raise LogConflict(
                f"turn {turn_id!r} of session {session_id!r} has already ended ({turn[1]})"
            )
        conflict = _seq_conflict(session_id, last_seq, batch)
        if conflict is not None:
            raise LogConflict(conflict)
        conn.executemany(_INSERT_EVENTS, (values[i : i + many] for i in range(0, whole, many)))
        conn.executemany(
            _INSERT_EVENT + "(?, ?, ?, ?, ?)",
            (values[i : i + 5] for i in range(whole, len(values), 5)),
        )
        params = {
            "turn": turn_id,
            "session": session_id,
            "first": batch[0].seq if batch else None,
            "last": batch[-1].seq if batch else None,
            "started": started,
            "status": None if end is None else end[0],
            "reason": None if end is None else end[1],
            "ended": None if end is None else end[2],
        }
        conn.execute(
            """
            UPDATE turns SET
                first_seq = coalesce(first_seq, :first),
                last_seq = coalesce(:last, last_seq),
                started_at = coalesce(started_at, :started),
                status = coalesce(:status, status),
                reason = CASE WHEN :status IS NULL THEN reason ELSE :reason END,
                ended_at = coalesce(:ended, ended_at)
            WHERE id = :turn
            """,
            params,
        )
        if batch or end is not None:
            conn.execute(
                """
                UPDATE sessions SET
                    last_seq = coalesce(:last, last_seq),
                    last_active_at = coalesce(:ended, last_active_at)
                WHERE id = :session
                """,
                params,
            )


def _read(
    conn: sqlite3.Connection,
    session_id: str,
    after: int,
    before: int,
    turn_id: str | None,
    limit: int,
    max_bytes: int | None,
) -> list[LoggedEvent]:
    _require_session(conn, session_id)
    if turn_id is None:
        cursor = conn.execute(
            """
            SELECT seq, turn_id, type, raw FROM events
            WHERE session_id = ? AND seq > ? AND seq < ? ORDER BY seq LIMIT ?
            """,
            (session_id, after, before, limit),
        )
    else:
        cursor = conn.execute(
            """
            SELECT seq, turn_id, type, raw FROM events INDEXED BY events_by_turn
            WHERE turn_id = ? AND seq > ? AND seq < ? AND session_id = ? ORDER BY seq LIMIT ?
            """,
            (turn_id, after, before, session_id, limit),
        )
    if max_bytes is None:
        return [LoggedEvent(seq, tid, kind, raw) for seq, tid, kind, raw in cursor.fetchall()]
    events: list[LoggedEvent] = []
    size = 0
    while size < max_bytes and (rows := cursor.fetchmany(256)):
        for seq, tid, kind, raw in rows:
            events.append(LoggedEvent(seq, tid, kind, raw))
            size += len(raw)
            if size >= max_bytes:
                break
    cursor.close()
    return events


def _bounds(conn: sqlite3.Connection, session_id: str) -> LogBounds:
    row = conn.execute(
        """
        SELECT last_seq, (SELECT min(seq) FROM events WHERE session_id = ?1)
        FROM sessions WHERE id = ?1
        """,
        (session_id,),
    ).fetchone()
    if row is None:
        raise SessionNotFound(f"session {session_id} not found")
    last, earliest = row
    return LogBounds(earliest=last + 1 if earliest is None else earliest, last=last)


def _drop_chunk(conn: sqlite3.Connection, cutoff: int, size: int) -> tuple[int, bool]:
    """Delete up to ``size`` events of turns that ended before ``cutoff``.

    Returns how many it deleted and whether that was the last of them; then
    it also flags those turns as emptied, so later calls skip them.
    """
    with _transaction(conn):
        deleted = conn.execute(
            """
            DELETE FROM events WHERE rowid IN (
                SELECT e.rowid FROM turns AS t CROSS JOIN events AS e ON e.turn_id = t.id
                WHERE t.events_dropped = 0 AND t.ended_at < ?1
                LIMIT ?2
            )
            """,
            (cutoff, size),
        ).rowcount
        done = deleted < size
        if done:
            conn.execute(
                "UPDATE turns SET events_dropped = 1 WHERE events_dropped = 0 AND ended_at < ?",
                (cutoff,),
            )
    return deleted, done


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

    async def create(self, session: Session) -> None:
        if session.last_seq != 0:
            raise ValueError(f"session {session.id!r}: last_seq is kept by the store")
        ended_at = _ended_at_of_new(session)
        row = (
            session.id,
            session.agent_name,
            session.runtime_type,
            SessionStatus(session.status).value,
            _to_micros(session.created_at, "created_at"),
            _to_micros(session.last_active_at, "last_active_at"),
            _to_json(session.spec, f"session {session.id!r}: spec"),
            _to_json(session.inputs, f"session {session.id!r}: inputs"),
            session.adapter_state,
            0,
            _opt_micros(ended_at, "ended_at"),
            session.tenant,
        )
        await self._run(_insert, row)

    async def get(self, session_id: str) -> Session:
        return await self._run(_select, session_id)

    async def update(
        self,
        session_id: str,
        *,
        status: SessionStatus | None = None,
        last_active_at: datetime | None = None,
        adapter_state: str | _Unset | None = UNSET,
    ) -> Session:
        params = {
            "id": session_id,
            "status": None if status is None else SessionStatus(status).value,
            "last_active_at": (
                None if last_active_at is None else _to_micros(last_active_at, "last_active_at")
            ),
            "set_state": adapter_state is not UNSET,
            "adapter_state": None if adapter_state is UNSET else adapter_state,
            "now": _to_micros(utcnow(), "now"),
        }
        return await self._run(_update, params)

    async def delete(self, session_id: str) -> None:
        await self._run(_delete, session_id)

    async def list(
        self,
        *,
        agent_name: str | None = None,
        status: SessionStatus | None = None,
        limit: int | None = None,
        before: SessionKey | None = None,
        tenant: str | None = None,
    ) -> list[Session]:
        sql_limit = _check_limit(limit)
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
            params.append(SessionStatus(status).value)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        params.append(sql_limit)
        return await self._run(_list, where, params)

    async def mark_expired(
        self, cutoff: datetime, *, exclude: Collection[str] = ()
    ) -> builtins.list[str]:
        if isinstance(exclude, str):
            raise TypeError("exclude must be a collection of ids, not one str")
        excluded = json.dumps(list(exclude))  # one bound JSON array, however many ids
        now = _to_micros(utcnow(), "now")
        return await self._run(_expire, _to_micros(cutoff, "cutoff"), excluded, now)

    async def count(self, *, status: SessionStatus) -> int:
        return await self._run(_count, SessionStatus(status).value)

    async def purge_sessions(self, cutoff: datetime) -> int:
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

    async def create_turn(self, turn: TurnRecord) -> None:
        status = _check_new_turn(turn)
        row = (
            turn.id,
            turn.session_id,
            turn.input,
            status.value,
            _to_micros(turn.created_at, "created_at"),
            _opt_micros(turn.started_at, "started_at"),
            _opt_micros(turn.ended_at, "ended_at"),
            turn.reason,
        )
        await self._run(_insert_turn, row)

    async def get_turn(self, session_id: str, turn_id: str) -> TurnRecord:
        return await self._run(_select_turn, session_id, turn_id)

    async def list_turns(
        self, session_id: str, *, status: TurnStatus | None = None, limit: int | None = None
    ) -> builtins.list[TurnRecord]:
        sql_limit = _check_limit(limit)
        wanted = None if status is None else TurnStatus(status).value
        return await self._run(_list_turns, session_id, wanted, sql_limit)

    async def running_turns(self) -> builtins.list[TurnRecord]:
        return await self._run(_running_turns)

    async def append_events(
        self,
        session_id: str,
        turn_id: str,
        events: Sequence[LoggedEvent],
        *,
        started_at: datetime | None = None,
        end: TurnEnd | None = None,
    ) -> None:
        batch = tuple(events)  # ours: the caller may reuse theirs while the thread runs
        _check_batch(turn_id, batch, end)
        ending = (
            None
            if end is None
            else (TurnStatus(end.status).value, end.reason, _to_micros(end.ended_at, "ended_at"))
        )
        started = _opt_micros(started_at, "started_at")
        await self._run(_append, session_id, turn_id, batch, started, ending)

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
        sql_limit = _check_limit(limit)
        check_max_bytes(max_bytes)
        low = min(max(after, _SEQ_MIN), _SEQ_MAX)
        high = _SEQ_MAX if before is None else min(max(before, _SEQ_MIN), _SEQ_MAX)
        return await self._run(_read, session_id, low, high, turn_id, sql_limit, max_bytes)

    async def log_bounds(self, session_id: str) -> LogBounds:
        return await self._run(_bounds, session_id)

    async def drop_events(self, cutoff: datetime) -> int:
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
