"""The webhook outbox in the SQL stores (``stores.outbox``'s contract), in both dialects.

The ``webhook_outbox`` table (``OUTBOX_TABLE``, made by both schemas'
migrations: SQLite 8 -> 9, PostgreSQL 7 -> 8) has one row per delivery;
times are microseconds, as everywhere (``stores.codec``).  A claim is one
``UPDATE ... WHERE id IN (SELECT ...)`` in a transaction: SQLite's
``BEGIN IMMEDIATE`` serialises claims; on PostgreSQL the selected rows are
locked ``FOR UPDATE SKIP LOCKED``, so processes claiming at once take
different deliveries and never wait for each other.  A delivery gated on a
turn is due once the turn's row has a finished status (a correlated
``EXISTS`` on the turns' primary key).
"""

from __future__ import annotations

import abc
import builtins
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Final, NamedTuple, TypeVar, TypeVarTuple

from trioserve.stores.checks import has_nul
from trioserve.stores.codec import _from_micros, _opt_from_micros, _opt_micros, _to_micros
from trioserve.stores.outbox import TURN_ENDED, Outbox, WebhookDelivery

__all__ = ["OUTBOX_TABLE", "OutboxDialect", "SQLOutbox", "insert_deliveries", "outbox_row"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

#: The migration statements that make the table (both schemas run them).
OUTBOX_TABLE: Final = (
    """
        CREATE TABLE webhook_outbox (
            id               text PRIMARY KEY,  -- the webhook-id header
            event            text NOT NULL,     -- turn.ended, ...
            url              text NOT NULL,
            session_id       text NOT NULL,
            turn_id          text,              -- due once this turn is finished
            payload          text,              -- the JSON body; NULL: not rendered yet
            created_at       bigint NOT NULL,   -- microseconds since 1970-01-01T00:00Z
            next_attempt_at  bigint NOT NULL,
            attempts         integer NOT NULL DEFAULT 0,
            first_attempt_at bigint,
            last_error       text,
            owner            text,
            lease_expires_at bigint
        )
        """,
    "CREATE INDEX webhook_outbox_due ON webhook_outbox (next_attempt_at, id)",
    "CREATE INDEX webhook_outbox_by_turn ON webhook_outbox (turn_id)",
)

_COLUMNS: Final = (
    "id, event, url, session_id, turn_id, payload, created_at, next_attempt_at, attempts,"
    " first_attempt_at, last_error, owner, lease_expires_at"
)
_FINISHED: Final = "t.status NOT IN ('queued', 'running', 'waiting')"


class OutboxDialect(NamedTuple):
    """What differs between the backends here."""

    #: The positional placeholder (``?`` or ``%s``).
    placeholder: str
    #: Opens a transaction on a connection (``BEGIN IMMEDIATE``; psycopg's ``transaction``).
    transaction: Callable[[Any], AbstractContextManager[Any]]
    #: What the claim's inner SELECT ends with (PostgreSQL: ``FOR UPDATE SKIP LOCKED``).
    lock_rows: str = ""


def outbox_row(delivery: WebhookDelivery) -> tuple[Any, ...]:
    return (
        delivery.id,
        delivery.event,
        delivery.url,
        delivery.session_id,
        delivery.turn_id,
        delivery.payload,
        _to_micros(delivery.created_at, "created_at"),
        _to_micros(delivery.next_attempt_at, "next_attempt_at"),
        delivery.attempts,
        _opt_micros(delivery.first_attempt_at, "first_attempt_at"),
        delivery.last_error,
        delivery.owner,
        _opt_micros(delivery.lease_expires_at, "lease_expires_at"),
    )


def _delivery(row: tuple[Any, ...]) -> WebhookDelivery:
    return WebhookDelivery(
        id=row[0],
        event=row[1],
        url=row[2],
        session_id=row[3],
        turn_id=row[4],
        payload=row[5],
        created_at=_from_micros(row[6]),
        next_attempt_at=_from_micros(row[7]),
        attempts=int(row[8]),
        first_attempt_at=_opt_from_micros(row[9]),
        last_error=row[10],
        owner=row[11],
        lease_expires_at=_opt_from_micros(row[12]),
    )


def _enqueue_webhooks(conn: Any, d: OutboxDialect, rows: builtins.list[tuple[Any, ...]]) -> None:
    with d.transaction(conn):
        insert_deliveries(conn, d.placeholder, rows)


def insert_deliveries(conn: Any, placeholder: str, rows: builtins.list[tuple[Any, ...]]) -> None:
    """Insert ``outbox_row``s in the transaction open on ``conn``; an id stored already
    stays as it is."""
    if not rows:
        return
    marks = ", ".join([placeholder] * 13)
    conn.cursor().executemany(
        f"INSERT INTO webhook_outbox ({_COLUMNS}) VALUES ({marks}) ON CONFLICT (id) DO NOTHING",
        rows,
    )


def _claim_webhooks(
    conn: Any, d: OutboxDialect, owner: str, until: int, now: int, limit: int
) -> builtins.list[WebhookDelivery]:
    p = d.placeholder
    with d.transaction(conn):
        rows = conn.execute(
            f"""
            UPDATE webhook_outbox
            SET owner = {p}, lease_expires_at = {p}, first_attempt_at = COALESCE(first_attempt_at, {p})
            WHERE id IN (
                SELECT o.id FROM webhook_outbox AS o
                WHERE o.next_attempt_at <= {p}
                  AND (o.lease_expires_at IS NULL OR o.lease_expires_at < {p})
                  AND (o.payload IS NOT NULL OR o.turn_id IS NULL OR EXISTS (
                      SELECT 1 FROM turns AS t WHERE t.id = o.turn_id AND {_FINISHED}))
                ORDER BY o.next_attempt_at, o.id
                LIMIT {p} {d.lock_rows})
            RETURNING {_COLUMNS}
            """,  # noqa: E501
            (owner, until, now, now, now, limit),
        ).fetchall()
    return sorted((_delivery(row) for row in rows), key=lambda x: (x.next_attempt_at, x.id))


def _webhook_failed(
    conn: Any, d: OutboxDialect, delivery_id: str, owner: str, at: int, error: str, payload: str
) -> bool:
    p = d.placeholder
    cursor = conn.execute(
        f"""
        UPDATE webhook_outbox
        SET attempts = attempts + 1, next_attempt_at = {p}, last_error = {p},
            payload = COALESCE(payload, {p}), owner = NULL, lease_expires_at = NULL
        WHERE id = {p} AND owner = {p}
        """,
        (at, error, payload, delivery_id, owner),
    )
    return bool(cursor.rowcount)


def _finish_webhook(conn: Any, d: OutboxDialect, delivery_id: str) -> bool:
    p = d.placeholder
    cursor = conn.execute(f"DELETE FROM webhook_outbox WHERE id = {p}", (delivery_id,))
    return bool(cursor.rowcount)


def _drop_unborn_webhooks(conn: Any, d: OutboxDialect, turn_id: str) -> int:
    p = d.placeholder
    cursor = conn.execute(
        f"""
        DELETE FROM webhook_outbox
        WHERE turn_id = {p} AND NOT EXISTS (SELECT 1 FROM turns WHERE id = {p})
        """,
        (turn_id, turn_id),
    )
    return int(cursor.rowcount)


def _turn_webhook_urls(conn: Any, d: OutboxDialect, turn_id: str) -> builtins.list[str]:
    p = d.placeholder
    rows = conn.execute(
        f"SELECT DISTINCT url FROM webhook_outbox WHERE turn_id = {p} AND event = {p} ORDER BY url",
        (turn_id, TURN_ENDED),
    ).fetchall()
    return [str(url) for (url,) in rows]


def _pending_webhooks(conn: Any, d: OutboxDialect) -> int:
    (count,) = conn.execute("SELECT count(*) FROM webhook_outbox").fetchone()
    return int(count)


def _purge_webhooks(conn: Any, d: OutboxDialect, cutoff: int) -> int:
    p = d.placeholder
    cursor = conn.execute(
        f"""
        DELETE FROM webhook_outbox
        WHERE payload IS NULL AND turn_id IS NOT NULL AND created_at < {p}
          AND NOT EXISTS (SELECT 1 FROM turns AS t WHERE t.id = webhook_outbox.turn_id)
        """,
        (cutoff,),
    )
    return int(cursor.rowcount)


class SQLOutbox(Outbox, abc.ABC):
    """``Outbox`` over the statements above; a backend gives ``_outbox`` and ``_run``."""

    #: The backend's dialect (a class attribute of each backend).
    _outbox: OutboxDialect

    @abc.abstractmethod
    async def _run(self, fn: Callable[[Any, *Ts], T], *args: *Ts) -> T:
        """Run ``fn(conn, *args)`` in a worker thread (``SQLStore._run``)."""

    async def _enqueue_webhooks(self, deliveries: builtins.list[WebhookDelivery]) -> None:
        await self._run(_enqueue_webhooks, self._outbox, [outbox_row(d) for d in deliveries])

    async def _claim_webhooks(
        self, owner: str, until: datetime, now: datetime, limit: int
    ) -> builtins.list[WebhookDelivery]:
        if has_nul(owner) or not limit:
            return []
        times = _to_micros(until, "until"), _to_micros(now, "now")
        return await self._run(_claim_webhooks, self._outbox, owner, *times, limit)

    async def _webhook_failed(
        self, delivery_id: str, owner: str, retry_at: datetime, error: str, payload: str
    ) -> bool:
        if has_nul(delivery_id, owner):
            return False
        at = _to_micros(retry_at, "retry_at")
        return await self._run(
            _webhook_failed, self._outbox, delivery_id, owner, at, error, payload
        )

    async def finish_webhook(self, delivery_id: str) -> bool:
        if has_nul(delivery_id):
            return False
        return await self._run(_finish_webhook, self._outbox, delivery_id)

    async def drop_unborn_webhooks(self, turn_id: str) -> int:
        if has_nul(turn_id):
            return 0
        return await self._run(_drop_unborn_webhooks, self._outbox, turn_id)

    async def turn_webhook_urls(self, turn_id: str) -> builtins.list[str]:
        if has_nul(turn_id):
            return []
        return await self._run(_turn_webhook_urls, self._outbox, turn_id)

    async def pending_webhooks(self) -> int:
        return await self._run(_pending_webhooks, self._outbox)

    async def _purge_webhooks(self, cutoff: datetime) -> int:
        return await self._run(_purge_webhooks, self._outbox, _to_micros(cutoff, "cutoff"))
