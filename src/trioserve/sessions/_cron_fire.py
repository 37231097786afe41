"""The scheduler: each process claims the crons' due fires and starts their turns, once.

``CronScheduler.run`` lives in the server's nursery until the server drains.
Every pass (at the next fire time known, at most ``POLL`` apart, at once
when a cron is made or changed here):

1. ``claim_stale_runs`` (every half lease): fires another process claimed
   and never started (it died: ``kill -9``) whose lease passed are this
   process's now;
2. for each enabled cron whose ``next_run_at`` has come, ``claim_fire``
   moves it to the following slot and records the run, only if no other
   process did first (the store's compare-and-set: one winner per slot);
3. each claimed fire starts its turn: on the cron's session (``multitask``
   ``skip``: none while the session is busy; ``enqueue``: queued behind
   the running turn), or on a new session with its ``inputs``.

The turn (and a new session) are made under idempotency keys of the slot
(``cron:<id>:<slot>:turn``, ``...:session``), bound in the store in the same
step as the turn (``KeyedRequests``): a fire started again after its
process died, or by a slow process whose lease passed, answers the turn the
first start made instead of making another.  So each slot starts exactly
one turn across ``--workers`` and replicas, or records why it started none.

A slot more than ``Limits.cron_misfire_grace`` old when a process first
sees it was missed (no process was up to claim it): ``catchUp: skip``
records it ``skipped`` (``missed``), ``once`` fires one turn for all the
slots missed (the run's ``missed`` counts the others); either way the
cron goes on from the first slot still in the grace.  Each fire logs one
line and feeds ``trioserve_cron_fires``, ``trioserve_cron_skips`` and
``trioserve_cron_lateness_seconds``.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Final

import trio

from trioserve.errors import (
    Draining,
    InvalidRequest,
    NotFound,
    SessionBusy,
    StoreError,
    TrioserveError,
)
from trioserve.sessions._crons import Crons, schedule_of
from trioserve.sessions._idempotency import KeyedRequests, TurnReplay
from trioserve.sessions._leases import new_owner
from trioserve.sessions._queue import QueuedTurn
from trioserve.stores.base import TurnStatus, utcnow
from trioserve.stores.crons import CronRecord, CronRun

if TYPE_CHECKING:
    from trioserve.sessions._manager import SessionManager

__all__ = ["POLL", "CronScheduler"]

log = logging.getLogger("trioserve.crons")

#: The longest a pass waits for the next (seconds): crons made by other processes
#: are seen within it.
POLL: Final = 1.0
#: How long the slot's idempotency keys last (at least; ``--idempotency-window`` if longer).
KEY_WINDOW: Final = 24 * 3600.0
_MICRO: Final = timedelta(microseconds=1)
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


class CronScheduler:
    """Claims and fires the crons' due slots in this process (see the module doc)."""

    def __init__(self, manager: SessionManager, crons: Crons) -> None:
        self.manager = manager
        self.crons = crons
        self.store = manager.store
        self.metrics = manager.metrics
        self.grace = timedelta(seconds=manager.limits.cron_misfire_grace)
        #: How long a claimed fire is this process's before another may take it over.
        self.lease = timedelta(seconds=manager.limits.turn_lease)
        self._stale_at = datetime.min.replace(tzinfo=UTC)  # when to look for stale claims
        self.owner = manager.leases.owner if manager.leases is not None else new_owner()
        self.keyed = KeyedRequests(
            manager.store,
            max(manager.limits.idempotency_window, KEY_WINDOW),
            create=manager._create_session,
            start=manager._start_turn,
            get_session=manager.get_session,
        )

    async def run(self) -> None:
        """Claim and fire until the server drains (then return; a fire claimed but not
        started is left to its lease: another process, or the next start, fires it)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._loop)
            await self.manager.wait_draining()
            nursery.cancel_scope.cancel()

    async def _loop(self) -> None:
        while True:
            changed = self.crons.changed
            try:
                wait = await self.tick()
            except (StoreError, OSError) as exc:  # the store is down: try again later
                log.warning("crons: could not claim due fires: %s", exc)
                wait = POLL
            with trio.move_on_after(wait):
                await changed.wait()

    async def tick(self, now: datetime | None = None) -> float:
        """One pass: claim what is due and fire it; the seconds until the next pass."""
        now = utcnow() if now is None else now
        fires: list[tuple[CronRecord, CronRun]] = []
        if now >= self._stale_at:  # a write: every half lease, not every pass
            self._stale_at = now + self.lease / 2
            for run in await self.store.claim_stale_runs(self.owner, now + self.lease, now=now):
                taken = await self._take_over(run, now)
                if taken is not None:
                    fires.append(taken)
        soonest = POLL
        for cron in await self.store.due_crons(now + timedelta(seconds=POLL)):
            assert cron.next_run_at is not None
            if cron.next_run_at > now:
                soonest = min(soonest, (cron.next_run_at - now).total_seconds())
                continue
            claimed = await self._claim(cron, now)
            soonest = 0.0  # its next slot may be due already
            if claimed is not None:
                fires.append((cron, claimed))
        async with trio.open_nursery() as nursery:
            for cron, run in fires:
                nursery.start_soon(self._fire, cron, run)
        return max(soonest, 0.005)

    async def _claim(self, cron: CronRecord, now: datetime) -> CronRun | None:
        """Claim the cron's due slot; the run to fire (``None``: nothing to fire here)."""
        slot = cron.next_run_at
        assert slot is not None
        try:
            schedule = schedule_of(cron)
        except InvalidRequest as exc:  # a zone this machine lacks: the cron stops here
            log.error("cron %s: cannot compute its schedule (%s); it stops", cron.id, exc)
            await self.store.claim_fire(cron.id, slot, None, None)
            return None
        if cron.end_at is not None and slot > cron.end_at:
            await self.store.claim_fire(cron.id, slot, None, None)
            return None
        run = CronRun(cron.id, slot, owner=self.owner, lease_expires_at=now + self.lease)
        horizon = now - self.grace
        if slot >= horizon:
            following = schedule.next_after(slot)
        else:  # missed while no process was up: one run stands for them all
            missed = max(schedule.count_between(slot, horizon) - 1, 0)
            following = schedule.next_after(horizon - _MICRO)
            run = replace(run, missed=missed)
            if cron.catch_up == "skip":
                run = replace(run, status="skipped", reason="missed", fired_at=now, owner=None)
        if following is not None and cron.end_at is not None and following > cron.end_at:
            following = None
        if not await self.store.claim_fire(cron.id, slot, following, run):
            return None  # another process claimed it first
        if run.status == "skipped":
            self._skipped(cron, run, "missed")
            return None
        return run

    async def _take_over(self, run: CronRun, now: datetime) -> tuple[CronRecord, CronRun] | None:
        """A fire whose process died after claiming it: fire it here (or, too old under
        ``catchUp: skip``, record it missed)."""
        try:
            cron = await self.store.get_cron(run.cron_id)
        except NotFound:
            return None  # deleted with its runs
        log.warning(
            "cron %s: fire of %s claimed by %s, which stopped before starting it: firing it",
            cron.id,
            run.scheduled_at.isoformat(),
            run.owner,
        )
        if run.scheduled_at < now - self.grace and cron.catch_up == "skip":
            skipped = CronRun(cron.id, run.scheduled_at, "skipped", "missed", fired_at=now)
            if await self.store.finish_run(skipped):
                self._skipped(cron, skipped, "missed")
            return None
        return cron, run

    async def _fire(self, cron: CronRecord, run: CronRun) -> None:
        """Start the fire's turn and record what became of it."""
        key = f"cron:{cron.id}:{(run.scheduled_at - _EPOCH) // _MICRO}"
        session_id = cron.session_id
        status, reason, turn_id = "started", None, None
        try:
            if session_id is None:
                session, _ = await self.keyed.create_session(
                    f"{key}:session", cron.inputs, tenant=cron.tenant
                )
                session_id = session.id
            turn = await self.keyed.start_turn(
                f"{key}:turn",
                session_id,
                cron.input,
                detach=True,
                on_disconnect="continue",
                tenant=cron.tenant,
                multitask="enqueue" if cron.multitask == "enqueue" else "reject",
                webhook=cron.webhook,  # its end (and a wait for an approval) POSTed there
            )
        except Draining:
            return  # left claimed: fired by another process, or after the restart
        except SessionBusy:
            status, reason = "skipped", "busy"
        except NotFound as exc:
            status, reason = "failed", exc.reason
        except StoreError as exc:  # the store failed: left claimed, retried after its lease
            log.warning("cron %s: fire of %s not started: %s", cron.id, run.scheduled_at, exc)
            return
        except TrioserveError as exc:  # the caps, a queue full, a bad input
            status, reason = "failed", exc.reason
        else:
            if isinstance(turn, TurnReplay):  # started before, by a process that died
                turn_id = turn.turn_id
                record = await self.store.get_turn(turn.session_id, turn.turn_id)
                status = "queued" if record.status is TurnStatus.QUEUED else "started"
            else:
                turn_id = turn.id
                status = "queued" if isinstance(turn, QueuedTurn) else "started"
        fired = utcnow()
        done = CronRun(
            cron.id, run.scheduled_at, status, reason, None, None, fired, session_id, turn_id
        )
        if not await self.store.finish_run(done):
            return  # finished by another process meanwhile
        if status == "skipped":
            self._skipped(cron, done, reason or "busy")
            return
        lateness = (fired - run.scheduled_at).total_seconds()
        self.metrics.cron_fires.labels(status).inc()
        if turn_id is not None:
            self.metrics.cron_lateness_seconds.observe(max(lateness, 0.0))
        log.info(
            "cron fired id=%s slot=%s outcome=%s reason=%s session=%s turn=%s late=%.3fs missed=%d",
            cron.id,
            run.scheduled_at.isoformat(),
            status,
            reason or "-",
            session_id or "-",
            turn_id or "-",
            lateness,
            run.missed,
        )

    def _skipped(self, cron: CronRecord, run: CronRun, reason: str) -> None:
        self.metrics.cron_fires.labels("skipped").inc()
        self.metrics.cron_skips.labels(reason).inc(1 + run.missed)
        log.info(
            "cron fired id=%s slot=%s outcome=skipped reason=%s session=%s missed=%d",
            cron.id,
            run.scheduled_at.isoformat(),
            reason,
            run.session_id or cron.session_id or "-",
            run.missed,
        )
