"""Crons: the part of the store contract that keeps scheduled turns (``Store`` inherits it).

A cron (``CronRecord``) is a schedule of a tenant's turns; the store keeps
it with ``next_run_at``, the next time it fires (``None``: never again, or
disabled).  A fire is one slot of the schedule, and the store makes it
happen once across every process sharing it:

- ``claim_fire`` moves ``next_run_at`` from the slot to the next one and
  records the fire's run (``CronRun``) in one atomic step, only if
  ``next_run_at`` still is that slot: of processes claiming the same slot
  at once exactly one wins (a compare-and-set), and a slot, once passed,
  is never claimed again;
- the winner starts the turn and ``finish_run`` records what became of it
  (``started``, ``queued``, ``skipped``, ``failed``);
- a run still ``claimed`` when its lease passes (its process died between
  the claim and the turn) is handed to a survivor by ``claim_stale_runs``,
  each to one process only; starting its turn again is safe because the
  turn is started under an idempotency key of the slot (``sessions._crons``).

``list_runs`` keeps the newest ``KEEP_RUNS`` runs of each cron; older ones
are dropped as new ones are claimed.
"""

from __future__ import annotations

import abc
import builtins
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Final

from trioserve.stores.checks import check_cap, check_limit, has_nul, no_nul_in, opt_utc, utc
from trioserve.stores.records import SessionKey

__all__ = ["KEEP_RUNS", "RUN_STATUSES", "CronRecord", "CronRun", "CronTable"]

#: How many of a cron's runs the store keeps (the newest).
KEEP_RUNS: Final = 50
#: A run's statuses: ``claimed`` (its turn not started yet), and what became of it.
RUN_STATUSES: Final = ("claimed", "started", "queued", "skipped", "failed")


@dataclass(frozen=True, slots=True)
class CronRecord:
    """A cron as stored.  ``inputs`` is ``None`` when each fire is a turn on ``session_id``."""

    id: str
    tenant: str | None
    schedule: str
    timezone: str
    input: str
    session_id: str | None
    inputs: dict[str, str] | None
    multitask: str  # skip | enqueue
    catch_up: str  # skip | once
    enabled: bool
    created_at: datetime
    updated_at: datetime
    next_run_at: datetime | None
    #: When ``@every`` slots count from (the create, or the last reschedule).
    anchor_at: datetime
    end_at: datetime | None = None
    webhook: str | None = None

    @property
    def key(self) -> SessionKey:
        """Its position in ``list_crons``' order (newest first)."""
        return SessionKey(self.created_at, self.id)


@dataclass(frozen=True, slots=True)
class CronRun:
    """One fire of a cron: the slot it stands for, and what became of it."""

    cron_id: str
    scheduled_at: datetime
    status: str = "claimed"
    reason: str | None = None
    owner: str | None = None
    lease_expires_at: datetime | None = None
    fired_at: datetime | None = None
    session_id: str | None = None
    turn_id: str | None = None
    #: Slots this run stands for besides its own (``catchUp``: missed while no process was up).
    missed: int = field(default=0)


def _checked(cron: CronRecord) -> CronRecord:
    no_nul_in(f"cron {cron.id!r}", cron, ("id", "tenant", "schedule", "timezone", "session_id"))
    no_nul_in(f"cron {cron.id!r}", cron, ("multitask", "catch_up", "webhook"))
    return replace(
        cron,
        created_at=utc(cron.created_at, "created_at"),
        updated_at=utc(cron.updated_at, "updated_at"),
        next_run_at=opt_utc(cron.next_run_at, "next_run_at"),
        anchor_at=utc(cron.anchor_at, "anchor_at"),
        end_at=opt_utc(cron.end_at, "end_at"),
        inputs=None if cron.inputs is None else dict(cron.inputs),
    )


def _checked_run(run: CronRun) -> CronRun:
    if run.status not in RUN_STATUSES:
        raise ValueError(f"a cron run's status is one of {RUN_STATUSES}, got {run.status!r}")
    return replace(
        run,
        scheduled_at=utc(run.scheduled_at, "scheduled_at"),
        lease_expires_at=opt_utc(run.lease_expires_at, "lease_expires_at"),
        fired_at=opt_utc(run.fired_at, "fired_at"),
    )


class CronTable(abc.ABC):
    """The contract's crons (see the module doc)."""

    async def create_cron(self, cron: CronRecord, *, max_per_tenant: int | None = None) -> None:
        """Store a new cron.  With ``max_per_tenant`` (>= 1), refused with ``CronCapReached``
        when its tenant has that many crons; the count and the insert are one atomic step,
        exact across processes.  ``StoreError`` for an id that exists."""
        check_cap("max_per_tenant", max_per_tenant)
        await self._create_cron(_checked(cron), max_per_tenant)

    @abc.abstractmethod
    async def _create_cron(self, cron: CronRecord, max_per_tenant: int | None) -> None:
        """``create_cron`` with a checked record."""

    async def get_cron(self, cron_id: str) -> CronRecord:
        """The cron ``cron_id`` (``CronNotFound`` for an unknown id)."""
        return await self._get_cron(cron_id)

    @abc.abstractmethod
    async def _get_cron(self, cron_id: str) -> CronRecord:
        """``get_cron``."""

    async def list_crons(
        self,
        *,
        tenant: str | None = None,
        limit: int | None = None,
        before: SessionKey | None = None,
    ) -> builtins.list[CronRecord]:
        """``tenant``'s crons (``None``: those made without API keys), newest ``created_at``
        first, ties by id descending; up to ``limit``, after ``before`` (keyset paging)."""
        check_limit(limit)
        key = None if before is None else SessionKey(utc(before[0], "before"), before[1])
        if has_nul(tenant, None if key is None else key.id):
            return []
        return await self._list_crons(tenant, limit, key)

    @abc.abstractmethod
    async def _list_crons(
        self, tenant: str | None, limit: int | None, before: SessionKey | None
    ) -> builtins.list[CronRecord]:
        """``list_crons`` with checked arguments."""

    async def update_cron(self, cron: CronRecord, *, reschedule: bool) -> CronRecord:
        """Replace the stored cron of ``cron.id`` (its id, tenant and ``created_at`` kept;
        its ``next_run_at`` and ``anchor_at`` too unless ``reschedule``: a claim may have
        moved them since ``cron`` was read); return it as stored.  ``CronNotFound`` for an
        unknown id."""
        return await self._update_cron(_checked(cron), reschedule)

    @abc.abstractmethod
    async def _update_cron(self, cron: CronRecord, reschedule: bool) -> CronRecord:
        """``update_cron`` with a checked record."""

    async def delete_cron(self, cron_id: str) -> bool:
        """Delete a cron and its runs; whether it was there."""
        return False if has_nul(cron_id) else await self._delete_cron(cron_id)

    @abc.abstractmethod
    async def _delete_cron(self, cron_id: str) -> bool:
        """``delete_cron``."""

    async def due_crons(self, until: datetime, *, limit: int = 100) -> builtins.list[CronRecord]:
        """Enabled crons whose ``next_run_at`` is at or before ``until``, soonest first."""
        check_limit(limit)
        return await self._due_crons(utc(until, "until"), limit)

    @abc.abstractmethod
    async def _due_crons(self, until: datetime, limit: int) -> builtins.list[CronRecord]:
        """``due_crons`` with checked arguments."""

    async def claim_fire(
        self, cron_id: str, slot: datetime, next_run_at: datetime | None, run: CronRun | None
    ) -> bool:
        """If the cron is enabled and its ``next_run_at`` is ``slot``: set it to
        ``next_run_at`` and store ``run`` (if given; a run of that slot stored already is
        kept), in one atomic step, and return ``True``; else change nothing, ``False``."""
        checked = None if run is None else _checked_run(run)
        if checked is not None and checked.cron_id != cron_id:
            raise ValueError(f"run of cron {checked.cron_id!r} claimed for {cron_id!r}")
        moment, following = utc(slot, "slot"), opt_utc(next_run_at, "next_run_at")
        if has_nul(cron_id):
            return False
        return await self._claim_fire(cron_id, moment, following, checked)

    @abc.abstractmethod
    async def _claim_fire(
        self, cron_id: str, slot: datetime, next_run_at: datetime | None, run: CronRun | None
    ) -> bool:
        """``claim_fire`` with checked arguments."""

    async def finish_run(self, run: CronRun) -> bool:
        """Record what became of a ``claimed`` run (its status, reason, fire time, session and
        turn); ``False`` (nothing changes) when it is not ``claimed`` any more or gone."""
        checked = _checked_run(run)
        if checked.status == "claimed":
            raise ValueError("finish_run records a finished run, not a claimed one")
        return await self._finish_run(checked)

    @abc.abstractmethod
    async def _finish_run(self, run: CronRun) -> bool:
        """``finish_run`` with a checked run."""

    async def claim_stale_runs(
        self, owner: str, until: datetime, *, now: datetime
    ) -> builtins.list[CronRun]:
        """Make ``owner`` the owner of every ``claimed`` run whose lease passed before
        ``now``, its lease running to ``until``; return them.  One atomic step: processes
        claiming at once never claim the same run."""
        return await self._claim_stale_runs(owner, utc(until, "until"), utc(now, "now"))

    @abc.abstractmethod
    async def _claim_stale_runs(
        self, owner: str, until: datetime, now: datetime
    ) -> builtins.list[CronRun]:
        """``claim_stale_runs`` with checked arguments."""

    async def list_runs(self, cron_id: str, *, limit: int = 10) -> builtins.list[CronRun]:
        """A cron's runs, the newest slot first (none for an unknown cron)."""
        check_limit(limit)
        return [] if has_nul(cron_id) else await self._list_runs(cron_id, limit)

    @abc.abstractmethod
    async def _list_runs(self, cron_id: str, limit: int) -> builtins.list[CronRun]:
        """``list_runs`` with checked arguments."""
