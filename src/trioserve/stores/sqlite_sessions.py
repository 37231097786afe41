"""The SQLite store's session statements.

Each statement runs in a worker thread on the store's one connection,
holding its limiter (``SQLiteStore._run``); values are encoded as
``stores.codec`` says.  ``stores.sqlite_log`` has the turn and event-log
statements.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from typing import Any

from trioserve.errors import (
    DuplicateSession,
    SessionCapReached,
    SessionExpired,
    SessionNotFound,
)
from trioserve.stores.checks import TenantCount, check_tenant_sessions
from trioserve.stores.codec import _COLUMNS, _ORDER, _TERMINAL, _session
from trioserve.stores.records import Session
from trioserve.stores.sql import purge_found
from trioserve.stores.sql_keys import claim_key, keep_key
from trioserve.stores.sqlite_schema import KEYS, _transaction

# --- statements (run in a worker thread, holding the limiter) ---------------


def sql_limit(limit: int | None) -> int:
    """A ``LIMIT`` value: SQLite's "no limit" is ``-1``."""
    return -1 if limit is None else limit


def _require_session(conn: sqlite3.Connection, session_id: str) -> int:
    """The session's ``last_seq``; ``SessionNotFound`` if there is no such session."""
    row = conn.execute("SELECT last_seq FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if row is None:
        raise SessionNotFound(f"session {session_id} not found")
    return int(row[0])


def _insert(
    conn: sqlite3.Connection,
    row: tuple[Any, ...],
    max_active: int | None,
    tenant_cap: int | None = None,
    key: tuple[Any, ...] | None = None,
) -> None:
    """Insert a session; with a cap or an idempotency key, in one ``BEGIN IMMEDIATE``
    (the key claimed first, kept last)."""
    whole = max_active is not None or tenant_cap is not None or key is not None
    with _transaction(conn) if whole else contextlib.nullcontext():
        if key is not None:
            claim_key(conn, KEYS, key)
        tenant = row[11]
        if tenant_cap is not None and tenant is not None:
            (count,) = conn.execute(
                "SELECT count(*) FROM sessions WHERE status = 'active' AND tenant = ?", (tenant,)
            ).fetchone()
            if not conn.execute("SELECT 1 FROM sessions WHERE id = ?", (row[0],)).fetchone():
                check_tenant_sessions(TenantCount(tenant, count, tenant_cap))
        if max_active is not None:
            (active,) = conn.execute(
                "SELECT count(*) FROM sessions WHERE status = 'active'"
            ).fetchone()
            if (
                active >= max_active
                and not conn.execute("SELECT 1 FROM sessions WHERE id = ?", (row[0],)).fetchone()
            ):
                raise SessionCapReached(f"too many active sessions (max {max_active})")
        try:
            conn.execute(
                f"INSERT INTO sessions ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                row,
            )
        except sqlite3.IntegrityError as exc:
            if exc.sqlite_errorname == "SQLITE_CONSTRAINT_PRIMARYKEY":
                raise DuplicateSession(f"session {row[0]!r} already exists") from None
            raise
        if key is not None:
            keep_key(conn, KEYS, key)


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
        conn.execute("DELETE FROM approvals WHERE session_id = ?", (session_id,))
        conn.execute("DELETE FROM turns WHERE session_id = ?", (session_id,))
        conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,))


def _list(
    conn: sqlite3.Connection, where: str, params: list[Any], limit: int | None
) -> list[Session]:
    sql = f"SELECT {_COLUMNS} FROM sessions {where} {_ORDER} LIMIT ?"
    return [_session(row) for row in conn.execute(sql, [*params, sql_limit(limit)]).fetchall()]


def _expire(conn: sqlite3.Connection, cutoff: int, exclude: str, now: int) -> list[str]:
    rows = conn.execute(
        """
        UPDATE sessions SET status = 'expired', ended_at = :now
        WHERE status = 'active' AND last_active_at < :cutoff
          AND id NOT IN (SELECT value FROM json_each(:exclude))
        RETURNING id
        """,
        {"cutoff": cutoff, "exclude": exclude, "now": now},
    ).fetchall()
    return sorted(sid for (sid,) in rows)


def _purge_chunk(
    conn: sqlite3.Connection, cutoff: int, rows: int, sessions: int
) -> tuple[int, bool]:
    """One step of ``purge_sessions``: the oldest ``sessions`` sessions it may purge.

    Deletes up to ``rows`` of their events, else up to ``rows`` of their
    turns, else the sessions themselves (``sql.purge_found``).  Returns how
    many sessions it deleted and whether that was the last of them.
    """
    with _transaction(conn):
        found = conn.execute(
            f"""
            SELECT id FROM sessions AS s INDEXED BY sessions_to_purge
            WHERE ended_at < :cutoff AND status IN ({_TERMINAL}) AND NOT EXISTS (
                SELECT 1 FROM turns WHERE session_id = s.id AND status = 'running'
            )
            ORDER BY ended_at LIMIT :sessions
            """,
            {"cutoff": cutoff, "sessions": sessions},
        ).fetchall()
        doomed = json.dumps([sid for (sid,) in found])  # one bound JSON array

        def delete_rows(table: str) -> int:
            return conn.execute(
                f"""
                DELETE FROM {table} WHERE rowid IN (
                    SELECT rowid FROM {table}
                    WHERE session_id IN (SELECT value FROM json_each(:doomed)) LIMIT :rows
                )
                """,
                {"doomed": doomed, "rows": rows},
            ).rowcount

        def delete_sessions() -> None:
            conn.execute(
                "DELETE FROM approvals WHERE session_id IN (SELECT value FROM json_each(?))",
                (doomed,),
            )
            conn.execute(
                "DELETE FROM sessions WHERE id IN (SELECT value FROM json_each(?))", (doomed,)
            )

        return purge_found(len(found), rows, sessions, delete_rows, delete_sessions)


def _count(conn: sqlite3.Connection, status: str) -> int:
    (n,) = conn.execute("SELECT count(*) FROM sessions WHERE status = ?", (status,)).fetchone()
    return int(n)
