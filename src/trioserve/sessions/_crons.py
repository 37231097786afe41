"""Crons: schedules of turns a tenant makes, reads, changes and deletes (``Crons``).

A cron fires at each time of its schedule (``_schedule``): a turn of its
``input`` on its session (``sessionId``), or on a new session made with its
``inputs``.  The store keeps each cron with its next fire time and each
fire's run (``stores.crons``); ``CronScheduler`` (``_cron_fire``) claims the
fires that are due, in every process sharing the store, and starts their
turns.  This module checks what a client asks (a ``400`` naming the field:
the expression, the time zone, the interval, ``endAt``, ``webhook``,
``sessionId``, ``inputs``), computes ``nextRunAt`` and keeps the tenants
apart (another tenant's cron is a ``404``).

``webhook`` is each fire's turn's ``webhook`` (``_webhooks``: checked against
``--webhook-allow`` when the cron is made or changed, and again when a fire
starts its turn, where a refusal fails the run).
"""

from __future__ import annotations

import contextlib
import secrets
import time
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import trio

from trioserve.errors import CronNotFound, InvalidRequest, NotFound
from trioserve.protocol import CronBody, CronPatchBody
from trioserve.sessions._inputs import missing_inputs
from trioserve.sessions._schedule import Schedule, parse_schedule, parse_timezone
from trioserve.stores.base import SessionKey, TurnRecord, utcnow
from trioserve.stores.crons import CronRecord, CronRun

if TYPE_CHECKING:
    from trioserve.sessions._manager import SessionManager

__all__ = ["CronPage", "CronView", "Crons", "schedule_of"]

#: How many of its last runs ``GET /v1/crons/{id}`` shows.
LAST_RUNS = 10
_MAX_WEBHOOK = 2048


def new_cron_id() -> str:
    """``c_<base36 millis><8 hex>``, as session ids; clients treat it as opaque."""
    millis, digits, out = int(time.time() * 1000), "0123456789abcdefghijklmnopqrstuvwxyz", ""
    while millis:
        millis, r = divmod(millis, 36)
        out = digits[r] + out
    return f"c_{out}{secrets.token_hex(4)}"


def schedule_of(cron: CronRecord) -> Schedule:
    """A stored cron's schedule (checked when it was stored)."""
    return parse_schedule(cron.schedule, parse_timezone(cron.timezone), cron.anchor_at)


def first_run(schedule: Schedule, after: datetime, end_at: datetime | None) -> datetime | None:
    """The first time after ``after``, unless it is past ``end_at``."""
    found = schedule.next_after(after)
    return None if found is None or (end_at is not None and found > end_at) else found


def _end_at(value: str | None, now: datetime) -> datetime | None:
    if value is None or value == "":
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise InvalidRequest(
            f"endAt: expected an RFC 3339 time with its offset (2027-01-01T00:00:00Z),"
            f" got {value!r}"
        )
    if when <= now:
        raise InvalidRequest(f"endAt: {value!r} is not in the future")
    return when


def _webhook(value: str | None) -> str | None:
    if value is None or value == "":
        return None
    parts = urlsplit(value) if len(value) <= _MAX_WEBHOOK and value.isprintable() else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequest(
            f"webhook: expected an http:// or https:// URL of at most {_MAX_WEBHOOK}"
            f" characters, got {value[:80]!r}"
        )
    return value


@dataclass(frozen=True, slots=True)
class CronView:
    """A cron and, for ``GET /v1/crons/{id}``, its last runs with their turns (if found)."""

    cron: CronRecord
    runs: list[tuple[CronRun, TurnRecord | None]] | None = None


@dataclass(frozen=True, slots=True)
class CronPage:
    """A page of crons, and the key of the last one when there may be more."""

    crons: list[CronRecord]
    next: SessionKey | None


class Crons:
    """The crons of the manager's store, as each tenant sees them (see the module doc)."""

    def __init__(self, manager: SessionManager) -> None:
        self.manager = manager
        self.store = manager.store
        #: Set when a cron is made or changed here: the scheduler looks again at once.
        self.changed = trio.Event()

    async def _check_webhook(self, value: str | None) -> str | None:
        """A cron's ``webhook``: checked as a turn's is (webhooks on, ``--webhook-allow``)
        when the cron is made or changed, not first when it fires."""
        url = _webhook(value)
        return None if url is None else await self.manager.webhooks.check(url)

    def _touch(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def create(self, body: CronBody, tenant: str | None) -> CronRecord:
        """Check and store a new cron of ``tenant`` (``CronCapReached`` over the cap)."""
        now = utcnow()
        zone = parse_timezone(body.timezone)
        schedule = parse_schedule(body.schedule, zone, now)
        end_at = _end_at(body.endAt, now)
        webhook = await self._check_webhook(body.webhook)
        if body.sessionId is not None and body.inputs is not None:
            raise InvalidRequest(
                "sessionId, inputs: give one (each fire a turn on that session, or on a new"
                " session with these inputs), not both"
            )
        if body.sessionId is not None:
            await self._check_session(body.sessionId, tenant)
        inputs = None if body.sessionId is not None else dict(body.inputs or {})
        if inputs is not None and self.manager.limits.require_inputs:
            missing = missing_inputs(self.manager.spec.task, inputs)
            if missing:
                raise InvalidRequest(f"inputs: no value for {', '.join(missing)} (the task's)")
        cron = CronRecord(
            id=new_cron_id(),
            tenant=tenant,
            schedule=body.schedule,
            timezone=body.timezone,
            input=body.input,
            session_id=body.sessionId,
            inputs=inputs,
            multitask=body.multitask,
            catch_up=body.catchUp,
            enabled=body.enabled,
            created_at=now,
            updated_at=now,
            next_run_at=first_run(schedule, now, end_at) if body.enabled else None,
            anchor_at=now,
            end_at=end_at,
            webhook=webhook,
        )
        cap = self.manager.limits.max_crons_per_tenant or None
        await self.store.create_cron(cron, max_per_tenant=cap)
        self._touch()
        return cron

    async def _check_session(self, session_id: str, tenant: str | None) -> None:
        try:
            session = await self.manager.get_session(session_id, tenant)
        except NotFound:
            raise InvalidRequest(f"sessionId: no session {session_id!r}") from None
        if session.status.terminal:
            raise InvalidRequest(f"sessionId: session {session_id} is {session.status.value}")

    async def get(self, cron_id: str, tenant: str | None) -> CronRecord:
        """``tenant``'s cron (``CronNotFound`` for an unknown one or another tenant's)."""
        cron = await self.store.get_cron(cron_id)
        if cron.tenant != tenant:
            raise CronNotFound(f"cron {cron_id} not found")
        return cron

    async def view(self, cron_id: str, tenant: str | None) -> CronView:
        """The cron with its last ``LAST_RUNS`` runs, newest first, and their turns."""
        cron = await self.get(cron_id, tenant)
        runs: list[tuple[CronRun, TurnRecord | None]] = []
        for run in await self.store.list_runs(cron_id, limit=LAST_RUNS):
            turn = None
            if run.session_id is not None and run.turn_id is not None:
                with contextlib.suppress(NotFound):  # else purged with its session
                    turn = await self.store.get_turn(run.session_id, run.turn_id)
            runs.append((run, turn))
        return CronView(cron, runs)

    async def list(
        self, tenant: str | None, limit: int | None, before: SessionKey | str | None
    ) -> CronPage:
        """``tenant``'s crons, newest first, ``limit`` of them after ``before`` (a key where
        an earlier page ended, or a cron id)."""
        if isinstance(before, str):
            try:
                before = (await self.get(before, tenant)).key
            except CronNotFound:
                raise InvalidRequest(
                    f"before: {before!r} is neither a page token nor the id of a cron"
                ) from None
        wanted = None if limit is None else limit + 1
        found = await self.store.list_crons(tenant=tenant, limit=wanted, before=before)
        if limit is not None and len(found) > limit:
            return CronPage(found[:limit], found[limit - 1].key)
        return CronPage(found, None)

    async def update(self, cron_id: str, body: CronPatchBody, tenant: str | None) -> CronRecord:
        """Change a cron.  A new schedule, time zone or ``endAt``, or enabling it, computes
        ``nextRunAt`` again from now (``@every`` counts from now); disabling clears it."""
        cron = await self.get(cron_id, tenant)
        now = utcnow()
        webhook = cron.webhook if body.webhook is None else await self._check_webhook(body.webhook)
        new = replace(
            cron,
            schedule=cron.schedule if body.schedule is None else body.schedule,
            timezone=cron.timezone if body.timezone is None else body.timezone,
            input=cron.input if body.input is None else body.input,
            multitask=body.multitask or cron.multitask,
            catch_up=body.catchUp or cron.catch_up,
            enabled=cron.enabled if body.enabled is None else body.enabled,
            webhook=webhook,
            end_at=cron.end_at if body.endAt is None else _end_at(body.endAt, now),
            updated_at=now,
        )
        zone = parse_timezone(new.timezone)
        schedule = parse_schedule(new.schedule, zone, now)
        reschedule = (new.schedule, new.timezone, new.end_at) != (
            cron.schedule,
            cron.timezone,
            cron.end_at,
        ) or new.enabled != cron.enabled
        if reschedule:
            following = first_run(schedule, now, new.end_at) if new.enabled else None
            new = replace(new, anchor_at=now, next_run_at=following)
        stored = await self.store.update_cron(new, reschedule=reschedule)
        self._touch()
        return stored

    async def delete(self, cron_id: str, tenant: str | None) -> None:
        """Delete a cron and its runs; its turns already started go on."""
        await self.get(cron_id, tenant)
        await self.store.delete_cron(cron_id)
