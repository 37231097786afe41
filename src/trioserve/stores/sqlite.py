"""``SQLiteStore``: the durable session store, one SQLite file (stdlib ``sqlite3``).

Guarantees, beyond the ``Store`` contract:

- **Serialised.**  One connection, used only from Trio's worker threads
  (``trio.to_thread.run_sync``) and one at a time (a ``CapacityLimiter(1)``).
  Each call is one short statement (``update`` may add a lookup to tell
  "not found" from "expired"), so each call is atomic.
- **Cancellation.**  A call cancelled while it waits for the connection
  does nothing.  Once its statement has started it runs to completion and
  the call returns normally; Trio delivers the cancellation at the caller's
  next checkpoint.  ``close`` is shielded and always finishes.
- **Private files.**  Directories it creates are 0700 (existing ones are
  left alone); the database file is created 0600 (an existing one we own is
  tightened to 0600), and SQLite gives its ``-wal``/``-shm`` files the
  database file's mode, whatever the umask.
- **Durable and crash-safe.**  WAL journal, ``synchronous=NORMAL`` (a power
  loss may drop the last commits, never corrupt the file), a busy timeout
  for other processes holding the file.
- **Exact.**  Times are stored as integer microseconds since the Unix epoch
  (UTC), so ordering is exact and values round-trip to the microsecond;
  ``spec`` and ``inputs`` are stored as JSON text.
- **Expired is final**, in the store and in the schema itself: a trigger
  aborts any statement that moves an ``expired`` row to another status.
- **Versioned.**  ``PRAGMA user_version`` holds the schema version; opening
  runs the pending migrations in one transaction and refuses a file made by
  a newer version.
- **Clear errors.**  A failure of SQLite or the file system is raised as
  ``StoreError`` naming the database path.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import sqlite3
from collections.abc import Callable, Collection
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, TypeVar, TypeVarTuple

import trio

from trioserve.errors import DuplicateSession, SessionExpired, SessionNotFound, StoreError
from trioserve.stores.base import UNSET, Session, SessionStatus, Store, _Unset

__all__ = ["BUSY_TIMEOUT_MS", "SCHEMA_VERSION", "SQLiteStore"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

#: How long a statement waits for another process's lock before failing.
BUSY_TIMEOUT_MS: Final = 5000

#: ``_MIGRATIONS[n]`` takes a database from schema version ``n`` to ``n + 1``.
#: Never edit a released step; append a new one.
_MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    (
        """
        CREATE TABLE sessions (
            id             TEXT PRIMARY KEY NOT NULL,
            agent_name     TEXT NOT NULL,
            runtime_type   TEXT NOT NULL,
            status         TEXT NOT NULL
                           CHECK (status IN ('active', 'ended', 'paused', 'expired', 'failed')),
            created_at     INTEGER NOT NULL,  -- microseconds since 1970-01-01T00:00Z
            last_active_at INTEGER NOT NULL,  -- microseconds since 1970-01-01T00:00Z
            spec           TEXT NOT NULL,     -- JSON object
            inputs         TEXT NOT NULL,     -- JSON object
            adapter_state  TEXT
        )
        """,
        "CREATE INDEX sessions_by_last_active ON sessions (last_active_at, created_at, id)",
        "CREATE INDEX sessions_by_status ON sessions (status, last_active_at, created_at, id)",
        "CREATE INDEX sessions_by_agent ON sessions (agent_name, last_active_at, created_at, id)",
        """
        CREATE TRIGGER sessions_expired_is_final
        BEFORE UPDATE OF status ON sessions
        WHEN OLD.status = 'expired' AND NEW.status != 'expired'
        BEGIN SELECT RAISE(ABORT, 'session is expired'); END
        """,
    ),
)

#: The schema version this code writes.
SCHEMA_VERSION: Final = len(_MIGRATIONS)

_COLUMNS: Final = (
    "id, agent_name, runtime_type, status, created_at, last_active_at, spec, inputs, adapter_state"
)
_ORDER: Final = "ORDER BY last_active_at DESC, created_at DESC, id DESC"
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND: Final = timedelta(microseconds=1)
_MIN_SQLITE: Final = (3, 35, 0)  # UPDATE ... RETURNING


# --- encoding ---------------------------------------------------------------


def _to_micros(value: datetime, what: str) -> int:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be a timezone-aware datetime, got {value!r}")
    return (value - _EPOCH) // _MICROSECOND


def _from_micros(value: int) -> datetime:
    return _EPOCH + timedelta(microseconds=value)


def _to_json(value: Any, what: str) -> str:
    try:
        return json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} is not JSON-serialisable: {exc}") from exc


def _session(row: tuple[Any, ...]) -> Session:
    sid, agent, runtime, status, created, last_active, spec, inputs, state = row
    return Session(
        id=sid,
        agent_name=agent,
        runtime_type=runtime,
        status=SessionStatus(status),
        created_at=_from_micros(created),
        last_active_at=_from_micros(last_active),
        spec=json.loads(spec),
        inputs=json.loads(inputs),
        adapter_state=state,
    )


# --- opening (runs in a worker thread) --------------------------------------


def _make_private_dirs(directory: Path) -> None:
    """Create ``directory`` and its missing parents, each 0700; leave existing ones alone."""
    missing: list[Path] = []
    probe = directory
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for path in reversed(missing):
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue  # made by someone else meanwhile: not ours to chmod
        except OSError as exc:
            raise StoreError(f"cannot create directory {path}: {exc.strerror}") from exc
        os.chmod(path, 0o700)  # mkdir's mode is filtered by the umask
    if not directory.is_dir():
        raise StoreError(f"cannot use {directory} as the store directory: not a directory")


def _make_private_file(path: Path) -> None:
    """Create ``path`` 0600 if missing; tighten an existing file we own to 0600."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise StoreError(f"cannot open session store {path}: {exc.strerror}") from exc
    try:
        with contextlib.suppress(PermissionError):  # someone else's file: their choice
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def _configure(conn: sqlite3.Connection, path: Path) -> None:
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
    if str(mode).lower() != "wal":
        raise StoreError(f"session store {path}: cannot use WAL journal mode (got {mode!r})")
    conn.execute("PRAGMA synchronous = NORMAL")


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"session store {path} has schema version {version}, newer than this "
                f"trioserve supports ({SCHEMA_VERSION}); upgrade trioserve"
            )
        for step in _MIGRATIONS[version:]:
            for statement in step:
                conn.execute(statement)
        if version != SCHEMA_VERSION:
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _connect(where: str | os.PathLike[str]) -> tuple[sqlite3.Connection, Path]:
    """Open, configure and migrate the database at ``where``; return it and its absolute path."""
    path = Path(os.path.abspath(os.path.expanduser(where)))
    if sqlite3.sqlite_version_info < _MIN_SQLITE:
        raise StoreError(f"SQLite {sqlite3.sqlite_version} is too old; trioserve needs >= 3.35")
    _make_private_dirs(path.parent)
    _make_private_file(path)
    try:
        conn = sqlite3.connect(
            path,
            timeout=BUSY_TIMEOUT_MS / 1000,
            isolation_level=None,  # autocommit; transactions are explicit
            check_same_thread=False,  # used from worker threads, one at a time
        )
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open session store {path}: {exc}") from exc
    try:
        _configure(conn, path)
        _migrate(conn, path)
    except sqlite3.Error as exc:
        conn.close()
        if exc.sqlite_errorcode in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT):
            raise StoreError(f"{path} is not a SQLite database or is corrupt ({exc})") from exc
        raise StoreError(f"cannot open session store {path}: {exc}") from exc
    except BaseException:
        conn.close()
        raise
    for suffix in ("-wal", "-shm"):  # SQLite copies the db file's mode; make sure
        with contextlib.suppress(FileNotFoundError, PermissionError):
            os.chmod(f"{path}{suffix}", 0o600)
    return conn, path


# --- statements (run in a worker thread, holding the limiter) ---------------


def _insert(conn: sqlite3.Connection, row: tuple[Any, ...]) -> None:
    try:
        conn.execute(f"INSERT INTO sessions ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
    except sqlite3.IntegrityError as exc:
        if exc.sqlite_errorname == "SQLITE_CONSTRAINT_PRIMARYKEY":
            raise DuplicateSession(f"session {row[0]!r} already exists") from None
        raise


def _select(conn: sqlite3.Connection, session_id: str) -> Session:
    row = conn.execute(f"SELECT {_COLUMNS} FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if row is None:
        raise SessionNotFound(f"no session {session_id!r}")
    return _session(row)


def _update(conn: sqlite3.Connection, params: dict[str, Any]) -> Session:
    rows = conn.execute(
        f"""
        UPDATE sessions SET
            status = coalesce(:status, status),
            last_active_at = coalesce(:last_active_at, last_active_at),
            adapter_state = CASE WHEN :set_state THEN :adapter_state ELSE adapter_state END
        WHERE id = :id AND (status != 'expired' OR coalesce(:status, 'expired') = 'expired')
        RETURNING {_COLUMNS}
        """,
        params,
    ).fetchall()
    if rows:
        return _session(rows[0])
    found = conn.execute("SELECT 1 FROM sessions WHERE id = ?", (params["id"],)).fetchone()
    if found is None:
        raise SessionNotFound(f"no session {params['id']!r}")
    raise SessionExpired(
        f"session {params['id']!r} is expired; it cannot become {params['status']}"
    )


def _delete(conn: sqlite3.Connection, session_id: str) -> None:
    conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,))


def _list(conn: sqlite3.Connection, where: str, params: list[Any]) -> list[Session]:
    sql = f"SELECT {_COLUMNS} FROM sessions {where} {_ORDER} LIMIT ?"
    return [_session(row) for row in conn.execute(sql, params).fetchall()]


def _expire(conn: sqlite3.Connection, cutoff: int, exclude: str) -> list[str]:
    rows = conn.execute(
        """
        UPDATE sessions SET status = 'expired'
        WHERE status = 'active' AND last_active_at < ?
          AND id NOT IN (SELECT value FROM json_each(?))
        RETURNING id
        """,
        (cutoff, exclude),
    ).fetchall()
    return sorted(sid for (sid,) in rows)


def _count(conn: sqlite3.Connection, status: str) -> int:
    (n,) = conn.execute("SELECT count(*) FROM sessions WHERE status = ?", (status,)).fetchone()
    return int(n)


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
        conn, full = await trio.to_thread.run_sync(_connect, path)
        return cls(conn, full)

    async def _run(self, fn: Callable[[sqlite3.Connection, *Ts], T], *args: *Ts) -> T:
        if self._closing:
            raise StoreError("store is closed")
        return await trio.to_thread.run_sync(self._call, fn, *args, limiter=self._limiter)

    def _call(self, fn: Callable[[sqlite3.Connection, *Ts], T], *args: *Ts) -> T:
        """In the worker thread, holding the limiter: run ``fn`` on the connection."""
        if self._conn is None:  # closed while this call waited for the limiter
            raise StoreError("store is closed")
        try:
            return fn(self._conn, *args)
        except sqlite3.Error as exc:
            raise StoreError(f"session store {self._path}: {exc}") from exc

    async def create(self, session: Session) -> None:
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
    ) -> list[Session]:
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        clauses: list[str] = []
        params: list[Any] = []
        if agent_name is not None:
            clauses.append("agent_name = ?")
            params.append(agent_name)
        if status is not None:
            clauses.append("status = ?")
            params.append(SessionStatus(status).value)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        params.append(-1 if limit is None else limit)  # LIMIT -1: no limit
        return await self._run(_list, where, params)

    async def mark_expired(
        self, cutoff: datetime, *, exclude: Collection[str] = ()
    ) -> builtins.list[str]:
        if isinstance(exclude, str):
            raise TypeError("exclude must be a collection of ids, not one str")
        excluded = json.dumps(list(exclude))  # one bound JSON array, however many ids
        return await self._run(_expire, _to_micros(cutoff, "cutoff"), excluded)

    async def count(self, *, status: SessionStatus) -> int:
        return await self._run(_count, SessionStatus(status).value)

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
