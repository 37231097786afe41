"""The SQLite store's file: its schema, its migrations, and opening it.

Opening (``connect``, run in a worker thread) makes the directory (0700)
and the file (0600) if needed, sets WAL and ``synchronous=NORMAL`` and a
busy timeout, and runs the pending migrations in one transaction; a file
written by a newer schema version is refused (``sql.pending_statements``).
``_transaction`` is the statements' ``BEGIN IMMEDIATE``; they are in
``stores.sqlite_sessions`` and ``stores.sqlite_log``, the store in
``stores.sqlite``.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from trioserve.errors import StoreError
from trioserve.stores.sql import (
    LEASE_INDEXES,
    QUEUED_ENDED_CHECK,
    QUEUED_INDEX,
    QUEUED_STATUS_CHECK,
    SINGLE_FLIGHT,
    pending_statements,
)
from trioserve.stores.sql_approvals import (
    APPROVALS_TABLE,
    WAITING_ENDED_CHECK,
    WAITING_SINGLE_FLIGHT,
    WAITING_STATUS_CHECK,
)
from trioserve.stores.sql_crons import CRONS_TABLES
from trioserve.stores.sql_keys import KEYS_TABLE, KeyDialect
from trioserve.stores.sql_outbox import OUTBOX_TABLE

__all__ = ["BUSY_TIMEOUT_MS", "KEYS", "SCHEMA_VERSION", "connect"]

#: How long a statement waits for another process's lock before failing.
BUSY_TIMEOUT_MS: Final = 5000


def _copy_turns(status_check: str, ended_check: str, single_flight: str) -> tuple[str, ...]:
    """The turns table copied with new checks (SQLite changes a CHECK only so), its
    indexes made again (``single_flight``: the unique index of one turn per session)."""
    return (
        f"""
        CREATE TABLE turns_new (
            id               TEXT PRIMARY KEY NOT NULL,
            session_id       TEXT NOT NULL,
            input            TEXT NOT NULL,
            status           TEXT NOT NULL CHECK {status_check},
            reason           TEXT,
            created_at       INTEGER NOT NULL,  -- microseconds since 1970-01-01T00:00Z
            started_at       INTEGER,           -- microseconds since 1970-01-01T00:00Z
            ended_at         INTEGER,           -- microseconds; NULL exactly while not finished
            first_seq        INTEGER,
            last_seq         INTEGER,
            events_dropped   INTEGER NOT NULL DEFAULT 0,  -- 1: drop_events emptied it
            owner            TEXT,
            lease_expires_at INTEGER,           -- microseconds
            CHECK {ended_check}
        )
        """,
        """
        INSERT INTO turns_new (id, session_id, input, status, reason, created_at, started_at,
                               ended_at, first_seq, last_seq, events_dropped, owner,
                               lease_expires_at)
        SELECT id, session_id, input, status, reason, created_at, started_at, ended_at,
               first_seq, last_seq, events_dropped, owner, lease_expires_at
        FROM turns
        """,
        "DROP TABLE turns",
        "ALTER TABLE turns_new RENAME TO turns",
        "CREATE INDEX turns_by_session ON turns (session_id, created_at, id)",
        "CREATE INDEX turns_running ON turns (created_at, id) WHERE status = 'running'",
        "CREATE INDEX turns_to_drop ON turns (ended_at) WHERE events_dropped = 0",
        single_flight,
    )


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
    (
        "ALTER TABLE sessions ADD COLUMN last_seq INTEGER NOT NULL DEFAULT 0",
        """
        CREATE TABLE turns (
            id             TEXT PRIMARY KEY NOT NULL,
            session_id     TEXT NOT NULL,
            input          TEXT NOT NULL,
            status         TEXT NOT NULL CHECK (status IN
                               ('running', 'completed', 'failed', 'cancelled', 'interrupted')),
            reason         TEXT,
            created_at     INTEGER NOT NULL,  -- microseconds since 1970-01-01T00:00Z
            started_at     INTEGER,           -- microseconds since 1970-01-01T00:00Z
            ended_at       INTEGER,           -- microseconds; NULL exactly while running
            first_seq      INTEGER,
            last_seq       INTEGER,
            events_dropped INTEGER NOT NULL DEFAULT 0,  -- 1: drop_events emptied it
            CHECK ((status = 'running') = (ended_at IS NULL))
        )
        """,
        "CREATE INDEX turns_by_session ON turns (session_id, created_at, id)",
        "CREATE INDEX turns_running ON turns (created_at, id) WHERE status = 'running'",
        "CREATE INDEX turns_to_drop ON turns (ended_at) WHERE events_dropped = 0",
        """
        CREATE TABLE events (
            session_id TEXT NOT NULL,
            seq        INTEGER NOT NULL,
            turn_id    TEXT NOT NULL,
            type       TEXT NOT NULL,
            raw        BLOB NOT NULL CHECK (typeof(raw) = 'blob')  -- the JSON as sent
        )
        """,
        "CREATE UNIQUE INDEX events_by_session ON events (session_id, seq)",
        "CREATE INDEX events_by_turn ON events (turn_id, seq)",
    ),
    (
        # When a session became terminal, for purge_sessions; NULL while it is not.
        "ALTER TABLE sessions ADD COLUMN ended_at INTEGER",  # microseconds
        """
        UPDATE sessions SET ended_at = last_active_at
        WHERE status IN ('ended', 'expired', 'failed')
        """,
        "CREATE INDEX sessions_to_purge ON sessions (ended_at) WHERE ended_at IS NOT NULL",
        # list's order is now (last_active_at DESC, id DESC), for keyset paging:
        # the same indexes without created_at serve it, with or without a filter.
        "DROP INDEX sessions_by_last_active",
        "DROP INDEX sessions_by_status",
        "DROP INDEX sessions_by_agent",
        "CREATE INDEX sessions_by_last_active ON sessions (last_active_at, id)",
        "CREATE INDEX sessions_by_status ON sessions (status, last_active_at, id)",
        "CREATE INDEX sessions_by_agent ON sessions (agent_name, last_active_at, id)",
    ),
    (
        # The tenant (API key owner) of a session; NULL: created without keys.
        "ALTER TABLE sessions ADD COLUMN tenant TEXT",
        "CREATE INDEX sessions_by_tenant ON sessions (tenant, last_active_at, id)",
    ),
    (
        # Single flight in the store (``sql.SINGLE_FLIGHT``), and leases: who runs
        # a turn, and until when its claim holds unless renewed.
        *SINGLE_FLIGHT,
        "ALTER TABLE turns ADD COLUMN owner TEXT",
        "ALTER TABLE turns ADD COLUMN lease_expires_at INTEGER",  # microseconds
        *LEASE_INDEXES,
    ),
    (
        # Idempotency keys (``stores.sql_keys``).
        *KEYS_TABLE,
    ),
    (
        # Queued turns (``stores.turn_queue``): a status of their own, no ``ended_at``.
        # SQLite changes a CHECK only by copying the table (its indexes made again).
        *_copy_turns(QUEUED_STATUS_CHECK, QUEUED_ENDED_CHECK, SINGLE_FLIGHT[1]),
        *LEASE_INDEXES,
        QUEUED_INDEX,
    ),
    (
        # Crons and their runs (``stores.sql_crons``).
        *CRONS_TABLES,
    ),
    (
        # The webhook outbox (``stores.sql_outbox``).
        *OUTBOX_TABLE,
    ),
    (
        # Approvals (``stores.sql_approvals``): a turn may wait for one, a status of
        # its own without ``ended_at``; the table copied again for the new checks.
        *_copy_turns(WAITING_STATUS_CHECK, WAITING_ENDED_CHECK, WAITING_SINGLE_FLIGHT),
        *LEASE_INDEXES,
        QUEUED_INDEX,
        *APPROVALS_TABLE,
    ),
)

#: The schema version this code writes.
SCHEMA_VERSION: Final = len(_MIGRATIONS)

_MIN_SQLITE: Final = (3, 35, 0)  # UPDATE ... RETURNING


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


#: The idempotency keys' statements in SQLite (``BEGIN IMMEDIATE`` serialises claims).
KEYS: Final = KeyDialect("?", "rowid", _transaction)


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    with _transaction(conn):
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        for statement in pending_statements(version, _MIGRATIONS, path):
            conn.execute(statement)
        if version != SCHEMA_VERSION:
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def connect(where: str | os.PathLike[str]) -> tuple[sqlite3.Connection, Path]:
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
