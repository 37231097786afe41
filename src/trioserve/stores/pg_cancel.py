"""Cancel requests across processes, in a PostgreSQL store (``turns.cancel_requested``).

A process that does not run a turn asks for its cancel by setting the flag
on the turn's row while it runs; the process owning the turn (``owner``)
reads the requests for its running turns and stops them.  Functions of a
pooled connection, run by ``PostgresStore`` in a worker thread.
"""

from __future__ import annotations

from trioserve.stores.pg_schema import Conn


def _request_cancel(conn: Conn, session_id: str, turn_id: str) -> bool:
    cursor = conn.execute(
        "UPDATE turns SET cancel_requested = true"
        " WHERE id = %s AND session_id = %s AND status = 'running'",
        (turn_id, session_id),
    )
    return cursor.rowcount == 1


def _cancel_requests(conn: Conn, owner: str) -> list[tuple[str, str]]:
    rows = conn.execute(
        "SELECT session_id, id FROM turns"
        " WHERE status = 'running' AND owner = %s AND cancel_requested"
        " ORDER BY created_at, id",
        (owner,),
    ).fetchall()
    return [(str(session_id), str(turn_id)) for session_id, turn_id in rows]
