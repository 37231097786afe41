"""The PostgreSQL store's turn and event-log statements.

Each runs in a worker thread on a pooled autocommit connection
(``PostgresStore._run``).  ``append_events`` locks the session's row
(``SELECT ... FOR UPDATE``) for its transaction, so appends to one session
from any number of processes are serialised and the seq check is exact;
it ``NOTIFY``s the store's channel with ``"<session id> <last seq>"``,
delivered when the transaction commits.

**Round trips** (issue 23).  A turn's own calls are one statement each, one
round trip: ``create_turn`` without caps or an idempotency key
(``_INSERT_TURN``) and every ``append_events`` (``_APPEND``: the checks, the
events, both rows and the notification in one statement, its own
transaction in autocommit).  The append's writes are guarded by its checks
(the session's and turn's rows locked, the turn running, the batch running
on from the log); when they do not hold it wrote nothing, and the
transactional path (``_append_checked``, several round trips) runs to
raise the precise error.  So a turn costs the session read, the turn's
insert, and one round trip per event batch (the last one with the end).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from psycopg import ClientCursor, errors

from trioserve.errors import DuplicateTurn, SessionBusy, SessionNotFound
from trioserve.stores.checks import TenantCount, check_append, check_running, seq_conflict
from trioserve.stores.codec import (
    _TURN_COLUMNS,
    _TURN_ORDER,
    _turn,
    append_params,
    events_upto,
    found_turn,
    log_bounds,
    utf8_turn_row,
)
from trioserve.stores.pg_schema import Conn
from trioserve.stores.pg_sessions import KEYS, _require_session, cap_lock
from trioserve.stores.records import LogBounds, LoggedEvent, TurnRecord, TurnStatus
from trioserve.stores.sql_keys import claim_key, keep_key

_INSERT_EVENT: Final = (
    "INSERT INTO events (session_id, seq, turn_id, type, raw) VALUES (%s, %s, %s, %s, %s)"
)

#: A turn without caps or key, in one statement: the session's row locked, the turn
#: inserted and the session touched only if it exists (a duplicate id or a second
#: running turn of the session violate ``turns_pkey`` / ``turns_one_running``).
_INSERT_TURN: Final = f"""
    WITH s AS (SELECT id FROM sessions WHERE id = %(session)s FOR UPDATE),
    ins AS (
        INSERT INTO turns ({_TURN_COLUMNS})
        SELECT %(id)s::text, s.id, %(input)s::bytea, %(status)s::text, %(created)s::bigint,
               %(started)s::bigint, %(ended)s::bigint, %(reason)s::bytea, NULL, NULL,
               %(owner)s::text, %(lease)s::bigint
        FROM s
    ),
    touched AS (
        UPDATE sessions SET last_active_at = %(created)s::bigint WHERE id IN (SELECT id FROM s)
    )
    SELECT count(*) FROM s
"""

#: A running turn under the caps (``--workers``, replicas), after the caps' lock (see
#: ``pg_sessions.cap_lock``), as a second statement of the same query so that it counts
#: with a snapshot taken once the lock is held; it inserts only if the caps allow it.
_INSERT_CAPPED: Final = f"""
    SELECT pg_advisory_xact_lock(hashtext(%(lock)s || current_schema()));
    WITH s AS (SELECT id, tenant FROM sessions WHERE id = %(session)s FOR UPDATE),
    counts AS (
        SELECT EXISTS (
                   SELECT 1 FROM turns WHERE session_id = %(session)s AND status = 'running'
               ) AS busy,
               CASE WHEN %(cap)s::bigint IS NULL THEN 0
                    ELSE (SELECT count(*) FROM turns WHERE status = 'running') END AS running,
               CASE WHEN %(tcap)s::bigint IS NULL THEN 0 ELSE (
                   SELECT count(*) FROM turns JOIN sessions ON sessions.id = turns.session_id
                   WHERE turns.status = 'running' AND sessions.tenant = (SELECT tenant FROM s)
               ) END AS tenant_running
    ),
    ok AS (
        SELECT 1 FROM s, counts
        WHERE NOT counts.busy
          AND (%(cap)s::bigint IS NULL OR counts.running < %(cap)s::bigint)
          AND (%(tcap)s::bigint IS NULL OR s.tenant IS NULL
               OR counts.tenant_running < %(tcap)s::bigint)
    ),
    ins AS (
        INSERT INTO turns ({_TURN_COLUMNS})
        SELECT %(id)s::text, s.id, %(input)s::bytea, %(status)s::text, %(created)s::bigint,
               %(started)s::bigint, %(ended)s::bigint, %(reason)s::bytea, NULL, NULL,
               %(owner)s::text, %(lease)s::bigint
        FROM s WHERE EXISTS (SELECT 1 FROM ok)
    ),
    touched AS (
        UPDATE sessions SET last_active_at = %(created)s::bigint
        WHERE id IN (SELECT id FROM s) AND EXISTS (SELECT 1 FROM ok)
    )
    SELECT EXISTS (SELECT 1 FROM ok)
"""

#: ``append_events`` in one statement (see the module doc): ``prior`` locks and reads
#: the session's and turn's rows; the writes happen only if ``ok``; the result says
#: whether they did.
_APPEND: Final = """
    WITH prior AS (
        SELECT s.last_seq, t.status
        FROM sessions AS s JOIN turns AS t ON t.id = %(turn)s AND t.session_id = s.id
        WHERE s.id = %(session)s
        FOR UPDATE OF s, t
    ),
    ok AS (
        SELECT 1 FROM prior
        WHERE status = 'running'
          AND (%(first)s::bigint IS NULL OR last_seq = %(first)s::bigint - 1)
    ),
    ins AS (
        INSERT INTO events (session_id, seq, turn_id, type, raw)
        SELECT %(session)s::text, u.seq, %(turn)s::text, u.type, u.raw
        FROM unnest(%(seqs)s::bigint[], %(types)s::text[], %(raws)s::bytea[]) AS u(seq, type, raw)
        WHERE EXISTS (SELECT 1 FROM ok)
    ),
    turn_row AS (
        UPDATE turns SET
            first_seq = coalesce(first_seq, %(first)s::bigint),
            last_seq = coalesce(%(last)s::bigint, last_seq),
            started_at = coalesce(started_at, %(started)s::bigint),
            status = coalesce(%(status)s::text, status),
            reason = CASE WHEN %(status)s::text IS NULL THEN reason ELSE %(reason)s::bytea END,
            ended_at = coalesce(%(ended)s::bigint, ended_at)
        WHERE id = %(turn)s AND EXISTS (SELECT 1 FROM ok)
    ),
    session_row AS (
        UPDATE sessions SET
            last_seq = coalesce(%(last)s::bigint, last_seq),
            last_active_at = coalesce(%(ended)s::bigint, last_active_at)
        WHERE id = %(session)s AND %(touch)s AND EXISTS (SELECT 1 FROM ok)
    )
    SELECT EXISTS (SELECT 1 FROM ok),
           CASE WHEN %(payload)s::text IS NOT NULL AND EXISTS (SELECT 1 FROM ok)
                THEN pg_notify(%(channel)s::text, %(payload)s::text) END
"""


def _insert_turn(
    conn: Conn,
    row: tuple[Any, ...],
    max_running: int | None,
    tenant_cap: int | None = None,
    key: tuple[Any, ...] | None = None,
) -> None:
    """Insert a turn, its session's row locked (single flight) and, with a cap, under the
    caps' lock (see ``pg_sessions.cap_lock``); an idempotency key is claimed first."""
    turn_id, session_id, status, created = row[0], row[1], row[3], row[4]
    row = utf8_turn_row(row)
    try:
        if key is None and _inserted_at_once(conn, row, max_running, tenant_cap):
            return
        with conn.transaction():
            if key is not None:
                claim_key(conn, KEYS, key)
            _require_session(conn, session_id, lock=True)
            if conn.execute("SELECT 1 FROM turns WHERE id = %s", (turn_id,)).fetchone():
                raise DuplicateTurn(f"turn {turn_id!r} already exists")
            if status == TurnStatus.RUNNING:
                check_can_run(conn, session_id, max_running, tenant_cap)
            conn.execute(
                f"INSERT INTO turns ({_TURN_COLUMNS}) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, NULL, NULL, %s, %s)",
                row,
            )
            conn.execute(
                "UPDATE sessions SET last_active_at = %s WHERE id = %s", (created, session_id)
            )
            if key is not None:
                keep_key(conn, KEYS, key)
    except errors.UniqueViolation as exc:
        if exc.diag.constraint_name == "turns_pkey":
            raise DuplicateTurn(f"turn {turn_id!r} already exists") from None
        if exc.diag.constraint_name == "turns_one_running":
            raise SessionBusy(f"session {session_id} already has a turn in flight") from None
        raise


def _inserted_at_once(
    conn: Conn, row: tuple[Any, ...], max_running: int | None, tenant_cap: int | None
) -> bool:
    """Insert the turn in one round trip: without caps one statement, with them the caps'
    lock and a guarded insert in one query (one implicit transaction).  True if it was
    inserted; False if the caps refused it (nothing written: the checked path says why).
    """
    names = ("id", "session", "input", "status", "created", "started", "ended")
    params = dict(zip((*names, "reason", "owner", "lease"), row, strict=True))
    if max_running is None and tenant_cap is None:
        found = conn.execute(_INSERT_TURN, params).fetchone()
        if not found or not found[0]:
            raise SessionNotFound(f"session {row[1]} not found")
        return True
    if row[3] != TurnStatus.RUNNING:
        return False
    params |= {"lock": "trioserve_running:", "cap": max_running, "tcap": tenant_cap}
    with ClientCursor(conn) as cursor:  # several statements, parameters bound here
        cursor.execute(_INSERT_CAPPED, params)
        cursor.nextset()
        done = cursor.fetchone()
    return bool(done and done[0])


def check_can_run(
    conn: Conn, session_id: str, max_running: int | None, tenant_cap: int | None
) -> None:
    """Refuse a new running turn of the session (``checks.check_running``), in the caller's
    transaction, which holds the session's row; with a cap, under the caps' lock."""
    if max_running is not None or tenant_cap is not None:
        cap_lock(conn, "trioserve_running:")
    found = conn.execute(
        """
        SELECT EXISTS (
            SELECT 1 FROM turns WHERE session_id = %(s)s AND status IN ('running', 'waiting')
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


def _renew(conn: Conn, owner: str, until: int) -> int:
    return conn.execute(
        "UPDATE turns SET lease_expires_at = %s "
        "WHERE status IN ('running', 'queued') AND owner = %s",
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
    """One statement (one snapshot, one round trip; a turn's start asks for the session's
    waiting turn): the session's row joined to its turns, no row at all if it is unknown,
    one with no turn if it has none."""
    rows = conn.execute(
        f"""
        SELECT {_JOINED_TURN} FROM sessions AS s
        LEFT JOIN LATERAL (
            SELECT {_TURN_COLUMNS} FROM turns
            WHERE session_id = s.id AND (%(status)s::text IS NULL OR status = %(status)s)
            {_TURN_ORDER} LIMIT %(limit)s
        ) AS t ON true
        WHERE s.id = %(sid)s
        ORDER BY t.created_at, t.id
        """,
        {"sid": session_id, "status": status, "limit": limit},
    ).fetchall()
    if not rows:
        raise SessionNotFound(f"session {session_id} not found")
    return [_turn(row) for row in rows if row[0] is not None]


#: ``_TURN_COLUMNS`` of the joined turn ``t`` (``None`` throughout: the session has none).
_JOINED_TURN: Final = ", ".join(f"t.{column}" for column in _TURN_COLUMNS.split(", "))


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
    """Append in one round trip (see the module doc), else the checked path's error."""
    if batch and seq_conflict(session_id, batch[0].seq - 1, batch) is not None:
        _append_checked(conn, session_id, turn_id, batch, started, end, channel)
        return  # (it raised: the batch does not run on by one)
    params = _params(session_id, turn_id, batch, started, end)
    params |= {
        "seqs": [e.seq for e in batch],
        "types": [e.type for e in batch],
        "raws": [e.raw for e in batch],
        "touch": bool(batch) or end is not None,
        "channel": channel,
        "payload": f"{session_id} {batch[-1].seq}" if batch and channel is not None else None,
    }
    done = conn.execute(_APPEND, params).fetchone()
    if done is None or not done[0]:  # nothing written: the checked path says why
        _append_checked(conn, session_id, turn_id, batch, started, end, channel)


def _params(
    session_id: str,
    turn_id: str,
    batch: Sequence[LoggedEvent],
    started: int | None,
    end: tuple[str, str, int] | None,
) -> dict[str, Any]:
    """``append_params`` with the reason as UTF-8 (``bytea``, as ``codec.utf8_turn_row``)."""
    params = append_params(session_id, turn_id, batch, started, end)
    if params["reason"] is not None:
        params["reason"] = params["reason"].encode()
    return params


def _append_checked(
    conn: Conn,
    session_id: str,
    turn_id: str,
    batch: Sequence[LoggedEvent],
    started: int | None,
    end: tuple[str, str, int] | None,
    channel: str | None,
) -> None:
    """The append as a transaction of checks and writes (the errors' path)."""
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
        params = _params(session_id, turn_id, batch, started, end)
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
