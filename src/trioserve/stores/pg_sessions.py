"""The PostgreSQL store's session statements.

Each runs in a worker thread on a pooled autocommit connection
(``PostgresStore._run``); several statements run in one explicit
transaction.  Values are encoded as ``stores.codec`` says.
``stores.pg_log`` has the turn and event-log statements.
"""

from __future__ import annotations

from typing import Any, Final

from psycopg import errors

from trioserve.errors import (
    DuplicateSession,
    SessionCapReached,
    SessionExpired,
    SessionNotFound,
)
from trioserve.stores.checks import TenantCount, check_tenant_sessions
from trioserve.stores.codec import _COLUMNS, _ORDER, _TERMINAL, _session
from trioserve.stores.pg_schema import Conn
from trioserve.stores.records import Session
from trioserve.stores.sql import purge_found
from trioserve.stores.sql_keys import KeyDialect, claim_key, keep_key


def _require_session(conn: Conn, session_id: str, *, lock: bool = False) -> int:
    """The session's ``last_seq`` (its row locked, with ``lock``); ``SessionNotFound``."""
    row = conn.execute(
        "SELECT last_seq FROM sessions WHERE id = %s" + (" FOR UPDATE" if lock else ""),
        (session_id,),
    ).fetchone()
    if row is None:
        raise SessionNotFound(f"session {session_id} not found")
    return int(row[0])


def cap_lock(conn: Conn, what: str) -> None:
    """Hold, until the transaction ends, the lock of one cap of this schema's store.

    Every process counting and inserting under that cap takes it first, so
    the count it reads stays true until its insert commits.
    """
    conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s || current_schema()))", (what,))


#: The idempotency keys' statements in PostgreSQL: a claim holds its key's lock.
KEYS: Final = KeyDialect("%s", "ctid", lambda conn: conn.transaction(), cap_lock)


def _insert(
    conn: Conn,
    row: tuple[Any, ...],
    max_active: int | None,
    tenant_cap: int | None = None,
    key: tuple[Any, ...] | None = None,
) -> None:
    """Insert a session; with a cap, under the caps' lock, count then insert (an
    idempotency key is claimed first and kept with it)."""
    try:
        with conn.transaction():
            if key is not None:
                claim_key(conn, KEYS, key)
            tenant = row[11]
            if max_active is not None or tenant_cap is not None:
                cap_lock(conn, "trioserve_active:")
            if tenant_cap is not None and tenant is not None:
                found = conn.execute(
                    """
                    SELECT count(*), EXISTS (SELECT 1 FROM sessions WHERE id = %s)
                    FROM sessions WHERE status = 'active' AND tenant = %s
                    """,
                    (row[0], tenant),
                ).fetchone()
                assert found is not None
                if not found[1]:  # a duplicate id: DuplicateSession below
                    check_tenant_sessions(TenantCount(tenant, found[0], tenant_cap))
            if max_active is not None:
                active = conn.execute(
                    """
                    SELECT count(*), EXISTS (SELECT 1 FROM sessions WHERE id = %s)
                    FROM sessions WHERE status = 'active'
                    """,
                    (row[0],),
                ).fetchone()
                if active is not None and active[0] >= max_active and not active[1]:
                    raise SessionCapReached(f"too many active sessions (max {max_active})")
            conn.execute(
                f"INSERT INTO sessions ({_COLUMNS}) VALUES "
                "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                row,
            )
            if key is not None:
                keep_key(conn, KEYS, key)
    except errors.UniqueViolation as exc:
        if exc.diag.constraint_name == "sessions_pkey":
            raise DuplicateSession(f"session {row[0]!r} already exists") from None
        raise


def _select(conn: Conn, session_id: str) -> Session:
    row = conn.execute(f"SELECT {_COLUMNS} FROM sessions WHERE id = %s", (session_id,)).fetchone()
    if row is None:
        raise SessionNotFound(f"session {session_id} not found")
    return _session(row)


def _update(conn: Conn, params: dict[str, Any]) -> Session:
    row = conn.execute(
        f"""
        UPDATE sessions SET
            status = coalesce(%(status)s, status),
            last_active_at = coalesce(%(last_active_at)s, last_active_at),
            adapter_state = CASE WHEN %(set_state)s THEN %(adapter_state)s::text
                                 ELSE adapter_state END,
            ended_at = CASE WHEN coalesce(%(status)s, status) IN ({_TERMINAL})
                            THEN coalesce(ended_at, %(now)s) END
        WHERE id = %(id)s
          AND (status <> 'expired' OR coalesce(%(status)s, 'expired') = 'expired')
        RETURNING {_COLUMNS}
        """,
        params,
    ).fetchone()
    if row is not None:
        return _session(row)
    found = conn.execute("SELECT 1 FROM sessions WHERE id = %s", (params["id"],)).fetchone()
    if found is None:
        raise SessionNotFound(f"session {params['id']} not found")
    raise SessionExpired(
        f"session {params['id']!r} is expired; it cannot become {params['status']}"
    )


def _delete(conn: Conn, session_id: str) -> None:
    with conn.transaction():
        conn.execute("DELETE FROM events WHERE session_id = %s", (session_id,))
        conn.execute("DELETE FROM approvals WHERE session_id = %s", (session_id,))
        conn.execute("DELETE FROM turns WHERE session_id = %s", (session_id,))
        conn.execute("DELETE FROM sessions WHERE id = %s", (session_id,))


def _list(conn: Conn, where: str, params: list[Any], limit: int | None) -> list[Session]:
    sql = f"SELECT {_COLUMNS} FROM sessions {where} {_ORDER} LIMIT %s"
    return [_session(row) for row in conn.execute(sql.encode(), [*params, limit]).fetchall()]


def _expire(conn: Conn, cutoff: int, exclude: list[str], now: int) -> list[str]:
    rows = conn.execute(
        """
        UPDATE sessions SET status = 'expired', ended_at = %s
        WHERE status = 'active' AND last_active_at < %s AND NOT (id = ANY(%s::text[]))
        RETURNING id
        """,
        (now, cutoff, exclude),
    ).fetchall()
    return sorted(sid for (sid,) in rows)


def _purge_chunk(conn: Conn, cutoff: int, rows: int, sessions: int) -> tuple[int, bool]:
    """One step of ``purge_sessions`` (as the SQLite store's ``_purge_chunk``)."""
    with conn.transaction():
        found = conn.execute(
            f"""
            SELECT id FROM sessions AS s
            WHERE ended_at < %s AND status IN ({_TERMINAL}) AND NOT EXISTS (
                SELECT 1 FROM turns WHERE session_id = s.id AND status = 'running'
            )
            ORDER BY ended_at LIMIT %s FOR UPDATE
            """,
            (cutoff, sessions),
        ).fetchall()
        doomed = [sid for (sid,) in found]

        def delete_rows(table: str) -> int:
            return conn.execute(
                f"""
                DELETE FROM {table} WHERE ctid IN (
                    SELECT ctid FROM {table} WHERE session_id = ANY(%s::text[]) LIMIT %s
                )
                """.encode(),
                (doomed, rows),
            ).rowcount

        def delete_sessions() -> None:
            conn.execute("DELETE FROM approvals WHERE session_id = ANY(%s::text[])", (doomed,))
            conn.execute("DELETE FROM sessions WHERE id = ANY(%s::text[])", (doomed,))

        return purge_found(len(found), rows, sessions, delete_rows, delete_sessions)


def _count(conn: Conn, status: str) -> int:
    row = conn.execute("SELECT count(*) FROM sessions WHERE status = %s", (status,)).fetchone()
    assert row is not None
    return int(row[0])
