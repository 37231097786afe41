"""Approvals in the SQL stores (``stores.approvals``): the table, the migration statements
and the statements both backends run, in their dialect (``sql_keys.KeyDialect``).

The ``approvals`` table has one row per approval; ``request`` and
``decision`` are JSON text (so a NUL a person typed is kept, escaped), times
are microseconds.  A waiting turn is a status of its own (``turns.status =
'waiting'``, no ``ended_at``): the migration widens the turns' checks
(``WAITING_STATUS_CHECK``, ``WAITING_ENDED_CHECK``).  Each operation is one
transaction whose changes are conditional ``UPDATE``s, so two processes
deciding or resuming at once are served one after the other and the second
finds nothing to change.
"""

from __future__ import annotations

import builtins
import json
from typing import Any, Final

from trioserve.errors import ApprovalDecided, ApprovalNotFound, LogConflict, SessionNotFound
from trioserve.stores.approvals import ApprovalRecord, Approvals, ApprovalStatus, Decision
from trioserve.stores.checks import has_nul
from trioserve.stores.codec import _TURN_COLUMNS, _from_micros, _to_micros
from trioserve.stores.codec import found_turn as _found_turn
from trioserve.stores.outbox import WebhookDelivery
from trioserve.stores.records import TurnRecord
from trioserve.stores.sql_keys import KeyDialect
from trioserve.stores.sql_outbox import insert_deliveries, outbox_row

__all__ = [
    "APPROVALS_TABLE",
    "WAITING_ENDED_CHECK",
    "WAITING_SINGLE_FLIGHT",
    "WAITING_STATUS_CHECK",
    "SQLApprovals",
]

#: The turns' checks once a turn may wait (SQLite 9 -> 10, PostgreSQL 8 -> 9).
WAITING_STATUS_CHECK: Final = (
    "(status IN ('queued', 'running', 'waiting', 'completed', 'failed', 'cancelled',"
    " 'interrupted'))"
)
WAITING_ENDED_CHECK: Final = "((status IN ('queued', 'running', 'waiting')) = (ended_at IS NULL))"
#: Single flight once a turn may wait: a session's turn running or waiting holds it (the
#: index ``sql.SINGLE_FLIGHT`` made for running turns, made again), so no other turn of
#: the session starts beside a waiting one, whichever process asks.
WAITING_SINGLE_FLIGHT: Final = (
    "CREATE UNIQUE INDEX turns_one_running ON turns (session_id)"
    " WHERE status IN ('running', 'waiting')"
)
#: The migration statements that make the table (both schemas run them).
APPROVALS_TABLE: Final = (
    """
        CREATE TABLE approvals (
            id           text PRIMARY KEY NOT NULL,
            session_id   text NOT NULL,
            turn_id      text NOT NULL,
            status       text NOT NULL CHECK (status IN ('pending', 'approved', 'denied')),
            reason       text,             -- expired, interrupted, cancelled; NULL: a person
            request      text NOT NULL,    -- JSON: callId, tool, arguments, state
            decision     text,             -- JSON: message, arguments, decidedBy
            requested_at bigint NOT NULL,  -- microseconds since 1970-01-01T00:00Z
            expires_at   bigint NOT NULL,
            decided_at   bigint,
            resumed      integer NOT NULL DEFAULT 0  -- 1: its turn's continuation started
        )
        """,
    "CREATE INDEX approvals_by_session ON approvals (session_id, requested_at, id)",
    "CREATE INDEX approvals_open ON approvals (turn_id) WHERE resumed = 0",
)

_COLUMNS: Final = (
    "id, session_id, turn_id, status, reason, request, decision, requested_at, expires_at,"
    " decided_at, resumed"
)
_ORDER: Final = "ORDER BY requested_at, id"


def _record(row: tuple[Any, ...]) -> ApprovalRecord:
    aid, sid, tid, status, reason, request, decision, requested, expires, decided, resumed = row
    found = None
    if decision is not None:
        body = json.loads(decision)
        found = Decision(
            ApprovalStatus(status),
            _from_micros(decided),
            reason,
            body.get("message"),
            body.get("arguments"),
            body.get("decidedBy"),
        )
    return ApprovalRecord(
        aid,
        sid,
        tid,
        json.loads(request),
        _from_micros(requested),
        _from_micros(expires),
        ApprovalStatus(status),
        found,
        bool(resumed),
    )


def _sql(d: KeyDialect, text: str) -> str:
    return text.replace("?", d.placeholder)


def _park(
    conn: Any, d: KeyDialect, approval: ApprovalRecord, webhooks: list[tuple[Any, ...]]
) -> None:
    with d.transaction(conn):
        parked = conn.execute(
            _sql(
                d,
                "UPDATE turns SET status = 'waiting', owner = NULL, lease_expires_at = NULL"
                " WHERE id = ? AND session_id = ? AND status = 'running' RETURNING id",
            ),
            (approval.turn_id, approval.session_id),
        ).fetchone()
        if parked is None:
            row = conn.execute(
                _sql(d, f"SELECT {_TURN_COLUMNS} FROM turns WHERE id = ? AND session_id = ?"),
                (approval.turn_id, approval.session_id),
            ).fetchone()
            turn = _found_turn(row, approval.session_id, approval.turn_id)
            raise LogConflict(f"turn {turn.id!r} is not running ({turn.status})")
        conn.execute(
            _sql(d, f"INSERT INTO approvals ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"),
            (
                approval.id,
                approval.session_id,
                approval.turn_id,
                "pending",
                None,
                json.dumps(approval.request, separators=(",", ":")),
                None,
                _to_micros(approval.requested_at, "requested_at"),
                _to_micros(approval.expires_at, "expires_at"),
                None,
                0,
            ),
        )
        insert_deliveries(conn, d.placeholder, webhooks)


def _select(conn: Any, d: KeyDialect, session_id: str, approval_id: str) -> ApprovalRecord:
    row = conn.execute(
        _sql(d, f"SELECT {_COLUMNS} FROM approvals WHERE id = ? AND session_id = ?"),
        (approval_id, session_id),
    ).fetchone()
    if row is None:
        raise ApprovalNotFound(f"approval {approval_id} of session {session_id} not found")
    return _record(row)


def _decide(
    conn: Any, d: KeyDialect, session_id: str, approval_id: str, decision: Decision
) -> ApprovalRecord:
    with d.transaction(conn):
        row = conn.execute(
            _sql(
                d,
                "UPDATE approvals SET status = ?, reason = ?, decision = ?, decided_at = ?"
                f" WHERE id = ? AND session_id = ? AND status = 'pending' RETURNING {_COLUMNS}",
            ),
            (
                decision.status.value,
                decision.reason,
                json.dumps(decision.as_json(), separators=(",", ":")),
                _to_micros(decision.decided_at, "decided_at"),
                approval_id,
                session_id,
            ),
        ).fetchone()
        if row is None:
            found = _select(conn, d, session_id, approval_id)
            raise ApprovalDecided(f"approval {approval_id} was {found.status} already")
        return _record(row)


def _resume(
    conn: Any, d: KeyDialect, session_id: str, turn_id: str, owner: str | None, lease: int | None
) -> TurnRecord | None:
    with d.transaction(conn):
        busy = conn.execute(
            _sql(d, "SELECT 1 FROM turns WHERE session_id = ? AND status = 'running'"),
            (session_id,),
        ).fetchone()
        if busy is not None:
            return None
        row = conn.execute(
            _sql(
                d,
                "UPDATE turns SET status = 'running', owner = ?, lease_expires_at = ?"
                " WHERE id = ? AND session_id = ? AND status = 'waiting'"
                " AND EXISTS (SELECT 1 FROM approvals WHERE approvals.turn_id = turns.id"
                " AND resumed = 0)"
                " AND NOT EXISTS (SELECT 1 FROM approvals WHERE approvals.turn_id = turns.id"
                " AND resumed = 0 AND status = 'pending')"
                f" RETURNING {_TURN_COLUMNS}",
            ),
            (owner, lease, turn_id, session_id),
        ).fetchone()
        if row is None:
            return None
        conn.execute(
            _sql(d, "UPDATE approvals SET resumed = 1 WHERE turn_id = ? AND resumed = 0"),
            (turn_id,),
        )
        return _found_turn(row, session_id, turn_id)


def _list(conn: Any, d: KeyDialect, session_id: str) -> builtins.list[ApprovalRecord]:
    exists = conn.execute(_sql(d, "SELECT 1 FROM sessions WHERE id = ?"), (session_id,)).fetchone()
    if exists is None:
        raise SessionNotFound(f"session {session_id} not found")
    rows = conn.execute(
        _sql(d, f"SELECT {_COLUMNS} FROM approvals WHERE session_id = ? {_ORDER}"), (session_id,)
    ).fetchall()
    return [_record(row) for row in rows]


def _open(conn: Any, d: KeyDialect) -> builtins.list[ApprovalRecord]:
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM approvals WHERE resumed = 0 AND EXISTS (SELECT 1 FROM turns"
        f" WHERE turns.id = approvals.turn_id AND turns.status = 'waiting') {_ORDER}"
    ).fetchall()
    return [_record(row) for row in rows]


class SQLApprovals(Approvals):
    """Mixed into ``SQLStore``: the hooks over the statements above."""

    async def _approvals_run(self, fn: Any, *args: Any) -> Any:
        store: Any = self
        return await store._run(fn, store._q.keys, *args)

    async def _park_turn(
        self, approval: ApprovalRecord, webhooks: builtins.list[WebhookDelivery]
    ) -> None:
        await self._approvals_run(_park, approval, [outbox_row(w) for w in webhooks])

    async def _decide_approval(
        self, session_id: str, approval_id: str, decision: Decision
    ) -> ApprovalRecord:
        if has_nul(session_id) or has_nul(approval_id):
            raise ApprovalNotFound(f"approval {approval_id!r} of session {session_id!r} not found")
        found: ApprovalRecord = await self._approvals_run(
            _decide, session_id, approval_id, decision
        )
        return found

    async def _resume_turn(
        self, session_id: str, turn_id: str, owner: str | None, lease: Any
    ) -> TurnRecord | None:
        micros = None if lease is None else _to_micros(lease, "lease_expires_at")
        found: TurnRecord | None = await self._approvals_run(
            _resume, session_id, turn_id, owner, micros
        )
        return found

    async def get_approval(self, session_id: str, approval_id: str) -> ApprovalRecord:
        if has_nul(session_id) or has_nul(approval_id):
            raise ApprovalNotFound(f"approval {approval_id!r} of session {session_id!r} not found")
        found: ApprovalRecord = await self._approvals_run(_select, session_id, approval_id)
        return found

    async def list_approvals(self, session_id: str) -> builtins.list[ApprovalRecord]:
        found: builtins.list[ApprovalRecord] = await self._approvals_run(_list, session_id)
        return found

    async def open_approvals(self) -> builtins.list[ApprovalRecord]:
        found: builtins.list[ApprovalRecord] = await self._approvals_run(_open)
        return found
