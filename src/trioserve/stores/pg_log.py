"""The PostgreSQL store's turn and event-log statements.

Each runs in a worker thread on a pooled autocommit connection
(``PostgresStore._run``).  ``append_events`` locks the session's row
(``SELECT ... FOR UPDATE``) for its transaction, so appends to one session
from any number of processes are serialised and the seq check is exact;
it ``NOTIFY``s the store's channel with ``"<session id> <last seq>"``,
delivered when the transaction commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from psycopg import errors

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
from trioserve.stores.pg_schema import Conn
from trioserve.stores.pg_sessions import _require_session, cap_lock
from trioserve.stores.records import LogBounds, LoggedEvent, TurnRecord, TurnStatus

_INSERT_EVENT: Final = (
    "INSERT INTO events (session_id, seq, turn_id, type, raw) VALUES (%s, %s, %s, %s, %s)"
)


def _insert_turn(
    conn: Conn, row: tuple[Any, ...], max_running: int | None, tenant_cap: int | None = None
) -> None:
    """Insert a turn, its session's row locked (single flight) and, with a cap, under the
    caps' lock (see ``pg_sessions.cap_lock``)."""
    turn_id, session_id, status, created = row[0], row[1], row[3], row[4]
    try:
        with conn.transaction():
            _require_session(conn, session_id, lock=True)
            if conn.execute("SELECT 1 FROM turns WHERE id = %s", (turn_id,)).fetchone():
                raise DuplicateTurn(f"turn {turn_id!r} already exists")
            if status == TurnStatus.RUNNING:
                if max_running is not None or tenant_cap is not None:
                    cap_lock(conn, "trioserve_running:")
                found = conn.execute(
                    """
                    SELECT EXISTS (
                        SELECT 1 FROM turns WHERE session_id = %(s)s AND status = 'running'
                    ),
                           CASE WHEN %(cap)s::bigint IS NULL THEN 0
                                ELSE (SELECT count(*) FROM turns WHERE status = 'running') END,
                           (SELECT tenant FROM sessions WHERE id = %(s)s),
                           CASE WHEN %(tcap)s::bigint IS NULL THEN 0 ELSE (
                               SELECT count(*) FROM turns JOIN sessions ON sessions.id = session_id
                               WHERE turns.status = 'running' AND sessions.tenant = (
                                   SELECT tenant FROM sessions WHERE id = %(s)s)
                           ) END
                    """,
                    {"s": session_id, "cap": max_running, "tcap": tenant_cap},
                ).fetchone()
                assert found is not None
                tenant = None
                if tenant_cap is not None and found[2] is not None:
                    tenant = TenantCount(found[2], found[3], tenant_cap)
                check_running(session_id, found[0], found[1], max_running, tenant)
            conn.execute(
                f"INSERT INTO turns ({_TURN_COLUMNS}) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, NULL, NULL, %s, %s)",
                row,
            )
            conn.execute(
                "UPDATE sessions SET last_active_at = %s WHERE id = %s", (created, session_id)
            )
    except errors.UniqueViolation as exc:
        if exc.diag.constraint_name == "turns_pkey":
            raise DuplicateTurn(f"turn {turn_id!r} already exists") from None
        if exc.diag.constraint_name == "turns_one_running":
            raise SessionBusy(f"session {session_id} already has a turn in flight") from None
        raise


def _renew(conn: Conn, owner: str, until: int) -> int:
    return conn.execute(
        "UPDATE turns SET lease_expires_at = %s WHERE status = 'running' AND owner = %s",
        (until, owner),
    ).rowcount


def _select_turn(conn: Conn, session_id: str, turn_id: str) -> TurnRecord:
    row = conn.execute(
        f"SELECT {_TURN_COLUMNS} FROM turns WHERE id = %s AND session_id = %s",
        (turn_id, session_id),
    ).fetchone()
    return found_turn(row, session_id, turn_id)


def _list_turns(
    conn: Conn, session_id: str, status: str | None, limit: int | None
) -> list[TurnRecord]:
    with conn.transaction():
        _require_session(conn, session_id)
        rows = conn.execute(
            f"""
            SELECT {_TURN_COLUMNS} FROM turns
            WHERE session_id = %(sid)s AND (%(status)s::text IS NULL OR status = %(status)s)
            {_TURN_ORDER} LIMIT %(limit)s
            """,
            {"sid": session_id, "status": status, "limit": limit},
        ).fetchall()
    return [_turn(row) for row in rows]


def _running_turns(conn: Conn) -> list[TurnRecord]:
    rows = conn.execute(
        f"SELECT {_TURN_COLUMNS} FROM turns WHERE status = 'running' {_TURN_ORDER}"
    ).fetchall()
    return [_turn(row) for row in rows]


def _append(
    conn: Conn,
    session_id: str,
    turn_id: str,
    batch: Sequence[LoggedEvent],
    started: int | None,
    end: tuple[str, str, int] | None,
    channel: str | None,
) -> None:
    with conn.transaction():
        last_seq = _require_session(conn, session_id, lock=True)
        turn = conn.execute(
            "SELECT session_id, status FROM turns WHERE id = %s FOR UPDATE", (turn_id,)
        ).fetchone()
        check_append(session_id, turn_id, turn, last_seq, batch)
        if batch:
            with conn.cursor() as cursor:
                cursor.executemany(
                    _INSERT_EVENT, [(session_id, e.seq, turn_id, e.type, e.raw) for e in batch]
                )
        params = append_params(session_id, turn_id, batch, started, end)
        conn.execute(
            """
            UPDATE turns SET
                first_seq = coalesce(first_seq, %(first)s),
                last_seq = coalesce(%(last)s, last_seq),
                started_at = coalesce(started_at, %(started)s),
                status = coalesce(%(status)s, status),
                reason = CASE WHEN %(status)s::text IS NULL THEN reason ELSE %(reason)s END,
                ended_at = coalesce(%(ended)s, ended_at)
            WHERE id = %(turn)s
            """,
            params,
        )
        if batch or end is not None:
            conn.execute(
                """
                UPDATE sessions SET
                    last_seq = coalesce(%(last)s, last_seq),
                    last_active_at = coalesce(%(ended)s, last_active_at)
                WHERE id = %(session)s
                """,
                params,
            )
        if batch and channel is not None:  # delivered on commit, to every LISTENer
            payload = f"{session_id} {batch[-1].seq}"
            conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


def _read(
    conn: Conn,
    session_id: str,
    after: int,
    before: int,
    turn_id: str | None,
    limit: int | None,
    max_bytes: int | None,
) -> list[LoggedEvent]:
    query = """
        SELECT seq, turn_id, type, raw FROM events
        WHERE session_id = %(sid)s AND seq > %(after)s AND seq < %(before)s
          AND (%(turn)s::text IS NULL OR turn_id = %(turn)s)
        ORDER BY seq LIMIT %(limit)s
    """
    params = {"sid": session_id, "after": after, "before": before, "turn": turn_id}
    with conn.transaction():
        _require_session(conn, session_id)
        if max_bytes is None:
            return events_upto(conn.execute(query, {**params, "limit": limit}), None)
        # a server-side cursor: only what is needed to reach max_bytes leaves the server
        with conn.cursor(name="read_events") as cursor:
            cursor.itersize = 256
            cursor.execute(query, {**params, "limit": limit})
            return events_upto(cursor, max_bytes)


def _bounds(conn: Conn, session_id: str) -> LogBounds:
    row = conn.execute(
        """
        SELECT last_seq, (SELECT min(seq) FROM events WHERE session_id = %(sid)s)
        FROM sessions WHERE id = %(sid)s
        """,
        {"sid": session_id},
    ).fetchone()
    return log_bounds(row, session_id)


def _drop_chunk(conn: Conn, cutoff: int, size: int) -> tuple[int, bool]:
    """Delete up to ``size`` events of turns that ended before ``cutoff`` (as SQLite's)."""
    with conn.transaction():
        deleted = conn.execute(
            """
            DELETE FROM events WHERE ctid IN (
                SELECT e.ctid FROM turns AS t JOIN events AS e ON e.turn_id = t.id
                WHERE NOT t.events_dropped AND t.ended_at < %s
                LIMIT %s
            )
            """,
            (cutoff, size),
        ).rowcount
        done = deleted < size
        if done:
            conn.execute(
                "UPDATE turns SET events_dropped = true WHERE NOT events_dropped AND ended_at < %s",
                (cutoff,),
            )
    return deleted, done
