"""Crons in the SQL stores: the tables, the statements both backends run, and the hooks.

The ``crons`` and ``cron_runs`` tables (``CRONS_TABLES``, made by both
schemas' migrations) are the same in both dialects: times are microseconds
(``stores.codec``), ``enabled`` is 0 or 1, the turn's ``input`` and a new
session's ``inputs`` are JSON text (so a NUL in them is kept, escaped), and
``''`` is the tenant of a server without API keys.  The statements run in
the idempotency keys' dialect (``sql_keys.KeyDialect``: placeholder,
transaction, lock).  ``claim_fire`` is one transaction whose ``UPDATE``
compares and sets ``next_run_at``: under PostgreSQL's row locks and
SQLite's ``BEGIN IMMEDIATE`` two processes claiming a slot at once see one
``UPDATE`` change the row and the other change nothing.
"""

from __future__ import annotations

import abc
import builtins
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any, Final, TypeVar, TypeVarTuple

from trioserve.errors import CronCapReached, CronNotFound
from trioserve.stores.codec import _from_micros, _opt_from_micros, _opt_micros, _to_micros
from trioserve.stores.crons import KEEP_RUNS, CronRecord, CronRun, CronTable
from trioserve.stores.records import SessionKey
from trioserve.stores.sql_keys import KeyDialect

__all__ = ["CRONS_TABLES", "SQLCrons"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

#: The migration statements that make the tables (both schemas run them).
CRONS_TABLES: Final = (
    """
        CREATE TABLE crons (
            id          text PRIMARY KEY,
            tenant      text NOT NULL,     -- '' without API keys
            schedule    text NOT NULL,     -- as the client wrote it
            timezone    text NOT NULL,     -- an IANA name
            input       text NOT NULL,     -- JSON string: each fire's turn input
            session_id  text,              -- each fire a turn on this session, or
            inputs      text,              -- JSON object: each fire a new session's inputs
            multitask   text NOT NULL,     -- skip | enqueue
            catch_up    text NOT NULL,     -- skip | once
            enabled     integer NOT NULL,  -- 0 | 1
            created_at  bigint NOT NULL,   -- microseconds since 1970-01-01T00:00Z
            updated_at  bigint NOT NULL,
            next_run_at bigint,            -- NULL: never again, or disabled
            anchor_at   bigint NOT NULL,   -- where '@every' slots count from
            end_at      bigint,
            webhook     text
        )
        """,
    "CREATE INDEX crons_by_tenant ON crons (tenant, created_at, id)",
    "CREATE INDEX crons_due ON crons (next_run_at) WHERE enabled = 1",
    """
        CREATE TABLE cron_runs (
            cron_id          text NOT NULL,
            scheduled_at     bigint NOT NULL,  -- the slot, microseconds
            status           text NOT NULL,    -- claimed | started | queued | skipped | failed
            reason           text,
            owner            text,             -- the process that claimed it
            lease_expires_at bigint,
            fired_at         bigint,
            session_id       text,
            turn_id          text,
            missed           bigint NOT NULL DEFAULT 0,
            PRIMARY KEY (cron_id, scheduled_at)
        )
        """,
    "CREATE INDEX cron_runs_claimed ON cron_runs (lease_expires_at) WHERE status = 'claimed'",
)

_COLUMNS: Final = (
    "id, tenant, schedule, timezone, input, session_id, inputs, multitask, catch_up, enabled,"
    " created_at, updated_at, next_run_at, anchor_at, end_at, webhook"
)
_RUN_COLUMNS: Final = (
    "cron_id, scheduled_at, status, reason, owner, lease_expires_at, fired_at, session_id,"
    " turn_id, missed"
)


def _row(c: CronRecord) -> tuple[Any, ...]:
    return (
        c.id,
        c.tenant or "",
        c.schedule,
        c.timezone,
        json.dumps(c.input),
        c.session_id,
        None if c.inputs is None else json.dumps(c.inputs, sort_keys=True),
        c.multitask,
        c.catch_up,
        int(c.enabled),
        _to_micros(c.created_at, "created_at"),
        _to_micros(c.updated_at, "updated_at"),
        _opt_micros(c.next_run_at, "next_run_at"),
        _to_micros(c.anchor_at, "anchor_at"),
        _opt_micros(c.end_at, "end_at"),
        c.webhook,
    )


def _decode(row: tuple[Any, ...]) -> CronRecord:
    cid, tenant, schedule, zone, text, sid, inputs, multitask, catch_up, enabled, *times = row
    created, updated, next_run, anchor, end, webhook = times
    return CronRecord(
        id=cid,
        tenant=tenant or None,
        schedule=schedule,
        timezone=zone,
        input=json.loads(text),
        session_id=sid,
        inputs=None if inputs is None else json.loads(inputs),
        multitask=multitask,
        catch_up=catch_up,
        enabled=bool(enabled),
        created_at=_from_micros(created),
        updated_at=_from_micros(updated),
        next_run_at=_opt_from_micros(next_run),
        anchor_at=_from_micros(anchor),
        end_at=_opt_from_micros(end),
        webhook=webhook,
    )


def _run_row(r: CronRun) -> tuple[Any, ...]:
    return (
        r.cron_id,
        _to_micros(r.scheduled_at, "scheduled_at"),
        r.status,
        r.reason,
        r.owner,
        _opt_micros(r.lease_expires_at, "lease_expires_at"),
        _opt_micros(r.fired_at, "fired_at"),
        r.session_id,
        r.turn_id,
        r.missed,
    )


def _decode_run(row: tuple[Any, ...]) -> CronRun:
    cid, slot, status, reason, owner, lease, fired, sid, tid, missed = row
    return CronRun(
        cid,
        _from_micros(slot),
        status,
        reason,
        owner,
        _opt_from_micros(lease),
        _opt_from_micros(fired),
        sid,
        tid,
        int(missed),
    )


def _marks(d: KeyDialect, count: int) -> str:
    return ", ".join([d.placeholder] * count)


def _cron_create(conn: Any, d: KeyDialect, row: tuple[Any, ...], cap: int | None) -> None:
    p = d.placeholder
    with d.transaction(conn):
        if d.lock is not None:
            d.lock(conn, f"trioserve_crons:{row[1]}")
        if cap is not None:
            (held,) = conn.execute(
                f"SELECT count(*) FROM crons WHERE tenant = {p}", (row[1],)
            ).fetchone()
            if held >= cap:
                raise CronCapReached(f"the tenant has {held} crons, the most it may have")
        conn.execute(f"INSERT INTO crons ({_COLUMNS}) VALUES ({_marks(d, len(row))})", row)


def _cron_get(conn: Any, d: KeyDialect, cron_id: str) -> CronRecord:
    p = d.placeholder
    row = conn.execute(f"SELECT {_COLUMNS} FROM crons WHERE id = {p}", (cron_id,)).fetchone()
    if row is None:
        raise CronNotFound(f"cron {cron_id} not found")
    return _decode(row)


def _cron_list(
    conn: Any, d: KeyDialect, tenant: str, limit: int | None, before: tuple[int, str] | None
) -> list[CronRecord]:
    p = d.placeholder
    where = f"tenant = {p}"
    params: list[Any] = [tenant]
    if before is not None:
        where += f" AND (created_at, id) < ({p}, {p})"
        params += [before[0], before[1]]
    tail = "" if limit is None else f" LIMIT {int(limit)}"
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM crons WHERE {where} ORDER BY created_at DESC, id DESC{tail}",
        params,
    ).fetchall()
    return [_decode(row) for row in rows]


def _cron_update(conn: Any, d: KeyDialect, row: tuple[Any, ...], reschedule: bool) -> CronRecord:
    p = d.placeholder
    names = _COLUMNS.split(", ")
    kept = {"id", "tenant", "created_at"} | (set() if reschedule else {"next_run_at", "anchor_at"})
    sets = ", ".join(f"{name} = {p}" for name in names if name not in kept)
    values = [value for name, value in zip(names, row, strict=True) if name not in kept]
    found = conn.execute(
        f"UPDATE crons SET {sets} WHERE id = {p} RETURNING {_COLUMNS}", (*values, row[0])
    ).fetchone()
    if found is None:
        raise CronNotFound(f"cron {row[0]} not found")
    return _decode(found)


def _cron_delete(conn: Any, d: KeyDialect, cron_id: str) -> bool:
    p = d.placeholder
    with d.transaction(conn):  # the cron's row first, as claim_fire locks them: no deadlock
        deleted: int = conn.execute(f"DELETE FROM crons WHERE id = {p}", (cron_id,)).rowcount
        conn.execute(f"DELETE FROM cron_runs WHERE cron_id = {p}", (cron_id,))
    return deleted > 0


def _cron_due(conn: Any, d: KeyDialect, until: int, limit: int) -> list[CronRecord]:
    p = d.placeholder
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM crons WHERE enabled = 1 AND next_run_at <= {p}"
        f" ORDER BY next_run_at, id LIMIT {int(limit)}",
        (until,),
    ).fetchall()
    return [_decode(row) for row in rows]


def _cron_claim(
    conn: Any,
    d: KeyDialect,
    cron_id: str,
    slot: int,
    next_run: int | None,
    run: tuple[Any, ...] | None,
) -> bool:
    p = d.placeholder
    with d.transaction(conn):
        changed = conn.execute(
            f"UPDATE crons SET next_run_at = {p}"
            f" WHERE id = {p} AND enabled = 1 AND next_run_at = {p}",
            (next_run, cron_id, slot),
        ).rowcount
        if not changed:
            return False
        if run is not None:
            conn.execute(
                f"INSERT INTO cron_runs ({_RUN_COLUMNS}) VALUES ({_marks(d, len(run))})"
                " ON CONFLICT (cron_id, scheduled_at) DO NOTHING",
                run,
            )
            conn.execute(
                f"""
                DELETE FROM cron_runs WHERE cron_id = {p} AND status <> 'claimed'
                AND scheduled_at < (SELECT scheduled_at FROM cron_runs WHERE cron_id = {p}
                                    ORDER BY scheduled_at DESC LIMIT 1 OFFSET {KEEP_RUNS - 1})
                """,
                (cron_id, cron_id),
            )
    return True


def _cron_finish(conn: Any, d: KeyDialect, run: tuple[Any, ...]) -> bool:
    p = d.placeholder
    cron_id, slot, status, reason, _owner, _lease, fired, sid, tid, _missed = run
    changed: int = conn.execute(
        f"UPDATE cron_runs SET status = {p}, reason = {p}, fired_at = {p}, session_id = {p},"
        f" turn_id = {p} WHERE cron_id = {p} AND scheduled_at = {p} AND status = 'claimed'",
        (status, reason, fired, sid, tid, cron_id, slot),
    ).rowcount
    return changed > 0


def _cron_claim_stale(conn: Any, d: KeyDialect, owner: str, until: int, now: int) -> list[CronRun]:
    p = d.placeholder
    with d.transaction(conn):
        rows = conn.execute(
            f"UPDATE cron_runs SET owner = {p}, lease_expires_at = {p} WHERE status = 'claimed'"
            f" AND (lease_expires_at IS NULL OR lease_expires_at < {p}) RETURNING {_RUN_COLUMNS}",
            (owner, until, now),
        ).fetchall()
    return sorted((_decode_run(row) for row in rows), key=lambda r: (r.scheduled_at, r.cron_id))


def _cron_runs(conn: Any, d: KeyDialect, cron_id: str, limit: int) -> list[CronRun]:
    p = d.placeholder
    rows = conn.execute(
        f"SELECT {_RUN_COLUMNS} FROM cron_runs WHERE cron_id = {p}"
        f" ORDER BY scheduled_at DESC LIMIT {int(limit)}",
        (cron_id,),
    ).fetchall()
    return [_decode_run(row) for row in rows]


class SQLCrons(CronTable):
    """The crons' hooks over the statements above (``SQLStore`` has ``_run`` and the dialect)."""

    @abc.abstractmethod
    async def _run(self, fn: Callable[[Any, *Ts], T], *args: *Ts) -> T:
        """Run ``fn(conn, *args)`` in a worker thread (``SQLStore._run``)."""

    @abc.abstractmethod
    def _dialect(self) -> KeyDialect:
        """The backend's dialect (its ``Queries.keys``)."""

    async def _create_cron(self, cron: CronRecord, max_per_tenant: int | None) -> None:
        await self._run(_cron_create, self._dialect(), _row(cron), max_per_tenant)

    async def _get_cron(self, cron_id: str) -> CronRecord:
        if "\x00" in cron_id:
            raise CronNotFound(f"cron {cron_id} not found")
        return await self._run(_cron_get, self._dialect(), cron_id)

    async def _list_crons(
        self, tenant: str | None, limit: int | None, before: SessionKey | None
    ) -> builtins.list[CronRecord]:
        key = None if before is None else (_to_micros(before[0], "before"), before[1])
        return await self._run(_cron_list, self._dialect(), tenant or "", limit, key)

    async def _update_cron(self, cron: CronRecord, reschedule: bool) -> CronRecord:
        return await self._run(_cron_update, self._dialect(), _row(cron), reschedule)

    async def _delete_cron(self, cron_id: str) -> bool:
        return await self._run(_cron_delete, self._dialect(), cron_id)

    async def _due_crons(self, until: datetime, limit: int) -> builtins.list[CronRecord]:
        return await self._run(_cron_due, self._dialect(), _to_micros(until, "until"), limit)

    async def _claim_fire(
        self, cron_id: str, slot: datetime, next_run_at: datetime | None, run: CronRun | None
    ) -> bool:
        row = None if run is None else _run_row(run)
        micros, following = _to_micros(slot, "slot"), _opt_micros(next_run_at, "next_run_at")
        return await self._run(_cron_claim, self._dialect(), cron_id, micros, following, row)

    async def _finish_run(self, run: CronRun) -> bool:
        return await self._run(_cron_finish, self._dialect(), _run_row(run))

    async def _claim_stale_runs(
        self, owner: str, until: datetime, now: datetime
    ) -> builtins.list[CronRun]:
        if "\x00" in owner:
            return []
        until_micros, now_micros = _to_micros(until, "until"), _to_micros(now, "now")
        return await self._run(_cron_claim_stale, self._dialect(), owner, until_micros, now_micros)

    async def _list_runs(self, cron_id: str, limit: int) -> builtins.list[CronRun]:
        return await self._run(_cron_runs, self._dialect(), cron_id, limit)
