"""The SQLite store's queued-turn statements (``stores.turn_queue``'s contract).

Each runs in a worker thread on the store's one connection; ``begin`` and
``end_queued`` are one ``BEGIN IMMEDIATE`` each, so the order and single
flight hold against every process writing the file.
"""

from __future__ import annotations

import sqlite3

from trioserve.errors import SessionBusy
from trioserve.stores.checks import turn_order
from trioserve.stores.codec import _TURN_COLUMNS, _TURN_ORDER, _turn, found_turn
from trioserve.stores.records import TurnRecord, TurnStatus
from trioserve.stores.sqlite_log import check_can_run
from trioserve.stores.sqlite_schema import _transaction
from trioserve.stores.sqlite_sessions import _require_session


def _begin(
    conn: sqlite3.Connection,
    session_id: str,
    turn_id: str,
    owner: str | None,
    lease: int | None,
    max_running: int | None,
    tenant_cap: int | None,
) -> TurnRecord | None:
    with _transaction(conn):
        _require_session(conn, session_id)
        row = conn.execute(
            f"SELECT {_TURN_COLUMNS} FROM turns WHERE id = ? AND session_id = ?",
            (turn_id, session_id),
        ).fetchone()
        turn = found_turn(row, session_id, turn_id)
        if turn.status is not TurnStatus.QUEUED:
            return None
        (older,) = conn.execute(
            """
            SELECT EXISTS (
                SELECT 1 FROM turns WHERE session_id = :session AND status = 'queued'
                AND (created_at, id) < (SELECT created_at, id FROM turns WHERE id = :turn))
            """,
            {"session": session_id, "turn": turn_id},
        ).fetchone()
        if older:
            raise SessionBusy(f"session {session_id}: an earlier turn is queued")
        check_can_run(conn, session_id, max_running, tenant_cap)
        started = conn.execute(
            f"""
            UPDATE turns SET status = 'running', owner = ?, lease_expires_at = ?
            WHERE id = ? RETURNING {_TURN_COLUMNS}
            """,
            (owner, lease, turn_id),
        ).fetchone()
    return _turn(started)


def _end_queued(
    conn: sqlite3.Connection, session_id: str, turn_id: str, status: str, reason: str, ended: int
) -> bool:
    with _transaction(conn):
        _require_session(conn, session_id)
        changed = conn.execute(
            """
            UPDATE turns SET status = ?, reason = ?, ended_at = ?
            WHERE id = ? AND session_id = ? AND status = 'queued'
            """,
            (status, reason, ended, turn_id, session_id),
        ).rowcount
        if not changed:  # unknown (TurnNotFound), or not queued any more
            row = conn.execute(
                f"SELECT {_TURN_COLUMNS} FROM turns WHERE id = ? AND session_id = ?",
                (turn_id, session_id),
            ).fetchone()
            found_turn(row, session_id, turn_id)
    return bool(changed)


def _queued_turns(conn: sqlite3.Connection) -> list[TurnRecord]:
    rows = conn.execute(
        f"SELECT {_TURN_COLUMNS} FROM turns WHERE status = 'queued' {_TURN_ORDER}"
    ).fetchall()
    return [_turn(row) for row in rows]


def _claim_queued(conn: sqlite3.Connection, owner: str, until: int, now: int) -> list[TurnRecord]:
    with _transaction(conn):
        rows = conn.execute(
            f"""
            UPDATE turns SET owner = ?, lease_expires_at = ?
            WHERE status = 'queued' AND (lease_expires_at IS NULL OR lease_expires_at < ?)
            RETURNING {_TURN_COLUMNS}
            """,
            (owner, until, now),
        ).fetchall()
    return sorted((_turn(row) for row in rows), key=turn_order)
