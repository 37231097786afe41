"""The SQLite store's turn and event-log statements.

Each runs in a worker thread on the store's one connection, holding its
limiter (``SQLiteStore._run``, through ``sql.SQLStore``'s hooks); the
encoding is in ``stores.codec``, the session statements in
``stores.sqlite_sessions``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, Final

from trioserve.errors import DuplicateTurn, SessionBusy
from trioserve.stores.checks import TenantCount, check_append, check_running
from trioserve.stores.codec import (
    _TURN_COLUMNS,
    _TURN_ORDER,
    _turn,
    append_params,
    events_upto,
    found_turn,
    log_bounds,
)
from trioserve.stores.records import LogBounds, LoggedEvent, TurnRecord, TurnStatus
from trioserve.stores.sql_keys import claim_key, keep_key
from trioserve.stores.sqlite_schema import KEYS, _transaction
from trioserve.stores.sqlite_sessions import _require_session, sql_limit


def _insert_turn(
    conn: sqlite3.Connection,
    row: tuple[Any, ...],
    max_running: int | None,
    tenant_cap: int | None = None,
    key: tuple[Any, ...] | None = None,
) -> None:
    """Insert a turn in one ``BEGIN IMMEDIATE``: single flight and the cap are exact (an
    idempotency key is claimed first and kept with the turn)."""
    turn_id, session_id, status, created = row[0], row[1], row[3], row[4]
    with _transaction(conn):
        if key is not None:
            claim_key(conn, KEYS, key)
        _require_session(conn, session_id)
        if conn.execute("SELECT 1 FROM turns WHERE id = ?", (turn_id,)).fetchone():
            raise DuplicateTurn(f"turn {turn_id!r} already exists")
        if status == TurnStatus.RUNNING:
            check_can_run(conn, session_id, max_running, tenant_cap)
        try:
            conn.execute(
                f"INSERT INTO turns ({_TURN_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, ?, ?)",
                row,
            )
        except sqlite3.IntegrityError as exc:
            if "turns.session_id" in str(exc):  # turns_one_running: the schema's own guard
                raise SessionBusy(f"session {session_id} already has a turn in flight") from None
            raise
        conn.execute("UPDATE sessions SET last_active_at = ? WHERE id = ?", (created, session_id))
        if key is not None:
            keep_key(conn, KEYS, key)


def check_can_run(
    conn: sqlite3.Connection, session_id: str, max_running: int | None, tenant_cap: int | None
) -> None:
    """Refuse a new running turn of the session (``checks.check_running``: one of it runs or
    waits for an approval, a cap), in the caller's transaction."""
    busy, running, name, mine = conn.execute(
        """
        SELECT EXISTS (
                   SELECT 1 FROM turns
                   WHERE session_id = :session AND status IN ('running', 'waiting')
               ),
               CASE WHEN :max_running IS NULL THEN 0
                    ELSE (SELECT count(*) FROM turns WHERE status = 'running') END,
               (SELECT tenant FROM sessions WHERE id = :session),
               CASE WHEN :tenant_cap IS NULL THEN 0 ELSE (
                   SELECT count(*) FROM turns JOIN sessions ON sessions.id = session_id
                   WHERE turns.status = 'running'
                     AND sessions.tenant = (SELECT tenant FROM sessions WHERE id = :session)
               ) END
        """,
        {"session": session_id, "max_running": max_running, "tenant_cap": tenant_cap},
    ).fetchone()
    tenant = None
    if tenant_cap is not None and name is not None:
        tenant = TenantCount(name, mine, tenant_cap)
    check_running(session_id, busy, running, max_running, tenant)


def _renew(conn: sqlite3.Connection, owner: str, until: int) -> int:
    return conn.execute(
        "UPDATE turns SET lease_expires_at = ? WHERE status IN ('running', 'queued') AND owner = ?",
        (until, owner),
    ).rowcount


def _select_turn(conn: sqlite3.Connection, session_id: str, turn_id: str) -> TurnRecord:
    row = conn.execute(
        f"SELECT {_TURN_COLUMNS} FROM turns WHERE id = ? AND session_id = ?",
        (turn_id, session_id),
    ).fetchone()
    return found_turn(row, session_id, turn_id)


def _list_turns(
    conn: sqlite3.Connection, session_id: str, status: str | None, limit: int | None
) -> list[TurnRecord]:
    _require_session(conn, session_id)
    rows = conn.execute(
        f"""
        SELECT {_TURN_COLUMNS} FROM turns
        WHERE session_id = :session AND (:status IS NULL OR status = :status)
        {_TURN_ORDER} LIMIT :limit
        """,
        {"session": session_id, "status": status, "limit": sql_limit(limit)},
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
    channel: str | None = None,
) -> None:
    """Append a batch in one ``BEGIN IMMEDIATE`` (``channel``: unused, SQLite has no
    ``NOTIFY``; a reader in another process polls, ``Store.wait_appended``)."""
    values = [v for e in batch for v in (session_id, e.seq, turn_id, e.type, e.raw)]
    many = 5 * _EVENTS_PER_INSERT
    whole = len(values) - len(values) % many
    with _transaction(conn):
        last_seq = _require_session(conn, session_id)
        turn = conn.execute(
            "SELECT session_id, status FROM turns WHERE id = ?", (turn_id,)
        ).fetchone()
        check_append(session_id, turn_id, turn, last_seq, batch)
        conn.executemany(_INSERT_EVENTS, (values[i : i + many] for i in range(0, whole, many)))
        conn.executemany(
            _INSERT_EVENT + "(?, ?, ?, ?, ?)",
            (values[i : i + 5] for i in range(whole, len(values), 5)),
        )
        params = append_params(session_id, turn_id, batch, started, end)
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
    limit: int | None,
    max_bytes: int | None,
) -> list[LoggedEvent]:
    _require_session(conn, session_id)
    limit = sql_limit(limit)
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
    try:
        return events_upto(cursor, max_bytes)
    finally:
        cursor.close()


def _bounds(conn: sqlite3.Connection, session_id: str) -> LogBounds:
    row = conn.execute(
        """
        SELECT last_seq, (SELECT min(seq) FROM events WHERE session_id = :session)
        FROM sessions WHERE id = :session
        """,
        {"session": session_id},
    ).fetchone()
    return log_bounds(row, session_id)


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
                WHERE t.events_dropped = 0 AND t.ended_at < :cutoff
                LIMIT :size
            )
            """,
            {"cutoff": cutoff, "size": size},
        ).rowcount
        done = deleted < size
        if done:
            conn.execute(
                "UPDATE turns SET events_dropped = 1 WHERE events_dropped = 0 AND ended_at < ?",
                (cutoff,),
            )
    return deleted, done
