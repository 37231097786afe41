"""The PostgreSQL store's queued-turn statements (``stores.turn_queue``'s contract).

Each runs in one transaction that holds the session's row (``FOR UPDATE``),
so starting a session's queued turns is serialised across processes: the
oldest first, one running at a time (and the schema's ``turns_one_running``
index besides).
"""

from __future__ import annotations

from psycopg import errors

from trioserve.errors import SessionBusy
from trioserve.stores.checks import turn_order
from trioserve.stores.codec import _TURN_COLUMNS, _TURN_ORDER, _turn, found_turn
from trioserve.stores.pg_log import check_can_run
from trioserve.stores.pg_schema import Conn
from trioserve.stores.pg_sessions import _require_session
from trioserve.stores.records import TurnRecord, TurnStatus


def _begin(
    conn: Conn,
    session_id: str,
    turn_id: str,
    owner: str | None,
    lease: int | None,
    max_running: int | None,
    tenant_cap: int | None,
) -> TurnRecord | None:
    try:
        with conn.transaction():
            _require_session(conn, session_id, lock=True)
            row = conn.execute(
                f"SELECT {_TURN_COLUMNS} FROM turns WHERE id = %s AND session_id = %s",
                (turn_id, session_id),
            ).fetchone()
            turn = found_turn(row, session_id, turn_id)
            if turn.status is not TurnStatus.QUEUED:
                return None
            older = conn.execute(
                """
                SELECT EXISTS (
                    SELECT 1 FROM turns WHERE session_id = %(s)s AND status = 'queued'
                    AND (created_at, id) < (SELECT created_at, id FROM turns WHERE id = %(t)s))
                """,
                {"s": session_id, "t": turn_id},
            ).fetchone()
            if older is not None and older[0]:
                raise SessionBusy(f"session {session_id}: an earlier turn is queued")
            check_can_run(conn, session_id, max_running, tenant_cap)
            started = conn.execute(
                f"""
                UPDATE turns SET status = 'running', owner = %s, lease_expires_at = %s
                WHERE id = %s RETURNING {_TURN_COLUMNS}
                """,
                (owner, lease, turn_id),
            ).fetchone()
    except errors.UniqueViolation as exc:
        if exc.diag.constraint_name == "turns_one_running":
            raise SessionBusy(f"session {session_id} already has a turn in flight") from None
        raise
    assert started is not None
    return _turn(started)


def _end_queued(
    conn: Conn, session_id: str, turn_id: str, status: str, reason: str, ended: int
) -> bool:
    with conn.transaction():
        _require_session(conn, session_id, lock=True)
        changed = conn.execute(
            """
            UPDATE turns SET status = %s, reason = %s, ended_at = %s
            WHERE id = %s AND session_id = %s AND status = 'queued'
            """,
            (status, reason.encode(), ended, turn_id, session_id),  # bytea (schema 6)
        ).rowcount
        if not changed:  # unknown (TurnNotFound), or not queued any more
            row = conn.execute(
                f"SELECT {_TURN_COLUMNS} FROM turns WHERE id = %s AND session_id = %s",
                (turn_id, session_id),
            ).fetchone()
            found_turn(row, session_id, turn_id)
    return bool(changed)


def _queued_turns(conn: Conn) -> list[TurnRecord]:
    rows = conn.execute(
        f"SELECT {_TURN_COLUMNS} FROM turns WHERE status = 'queued' {_TURN_ORDER}"
    ).fetchall()
    return [_turn(row) for row in rows]


def _claim_queued(conn: Conn, owner: str, until: int, now: int) -> list[TurnRecord]:
    rows = conn.execute(
        f"""
        UPDATE turns SET owner = %s, lease_expires_at = %s
        WHERE status = 'queued' AND (lease_expires_at IS NULL OR lease_expires_at < %s)
        RETURNING {_TURN_COLUMNS}
        """,
        (owner, until, now),
    ).fetchall()
    return sorted((_turn(row) for row in rows), key=turn_order)
