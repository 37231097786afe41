"""The memory store's crons (``stores.crons``' contract), as ``MemoryStore`` keeps everything:
dicts in this process, each call one atomic step after its checkpoint (``_enter``)."""

from __future__ import annotations

import abc
import builtins
from dataclasses import replace
from datetime import datetime

from trioserve.errors import CronCapReached, CronNotFound, StoreError
from trioserve.stores.crons import KEEP_RUNS, CronRecord, CronRun, CronTable
from trioserve.stores.records import SessionKey

__all__ = ["MemoryCrons"]


def _copy(cron: CronRecord) -> CronRecord:
    return replace(cron, inputs=None if cron.inputs is None else dict(cron.inputs))


class MemoryCrons(CronTable):
    """Crons and their runs in dicts (``MemoryStore`` calls ``_init_crons``)."""

    def _init_crons(self) -> None:
        self._crons: dict[str, CronRecord] = {}
        self._runs: dict[str, dict[datetime, CronRun]] = {}  # cron id -> slot -> run

    @abc.abstractmethod
    async def _enter(self) -> None:
        """A checkpoint, then ``StoreError`` if the store is closed (``MemoryStore``'s)."""

    def _cron(self, cron_id: str) -> CronRecord:
        try:
            return self._crons[cron_id]
        except KeyError:
            raise CronNotFound(f"cron {cron_id} not found") from None

    async def _create_cron(self, cron: CronRecord, max_per_tenant: int | None) -> None:
        await self._enter()
        if cron.id in self._crons:
            raise StoreError(f"cron {cron.id!r} exists")
        if max_per_tenant is not None:
            held = sum(1 for c in self._crons.values() if c.tenant == cron.tenant)
            if held >= max_per_tenant:
                raise CronCapReached(f"tenant has {held} crons, the most it may have")
        self._crons[cron.id] = _copy(cron)
        self._runs[cron.id] = {}

    async def _get_cron(self, cron_id: str) -> CronRecord:
        await self._enter()
        return _copy(self._cron(cron_id))

    async def _list_crons(
        self, tenant: str | None, limit: int | None, before: SessionKey | None
    ) -> builtins.list[CronRecord]:
        await self._enter()
        found = sorted(
            (c for c in self._crons.values() if c.tenant == tenant),
            key=lambda c: c.key,
            reverse=True,
        )
        if before is not None:
            found = [c for c in found if c.key < before]
        return [_copy(c) for c in found[:limit]]

    async def _update_cron(self, cron: CronRecord, reschedule: bool) -> CronRecord:
        await self._enter()
        old = self._cron(cron.id)
        new = replace(_copy(cron), tenant=old.tenant, created_at=old.created_at)
        if not reschedule:
            new = replace(new, next_run_at=old.next_run_at, anchor_at=old.anchor_at)
        self._crons[cron.id] = new
        return _copy(new)

    async def _delete_cron(self, cron_id: str) -> bool:
        await self._enter()
        self._runs.pop(cron_id, None)
        return self._crons.pop(cron_id, None) is not None

    async def _due_crons(self, until: datetime, limit: int) -> builtins.list[CronRecord]:
        await self._enter()
        due = [
            c
            for c in self._crons.values()
            if c.enabled and c.next_run_at is not None and c.next_run_at <= until
        ]
        due.sort(key=lambda c: (c.next_run_at, c.id))
        return [_copy(c) for c in due[:limit]]

    async def _claim_fire(
        self, cron_id: str, slot: datetime, next_run_at: datetime | None, run: CronRun | None
    ) -> bool:
        await self._enter()
        cron = self._crons.get(cron_id)
        if cron is None or not cron.enabled or cron.next_run_at != slot:
            return False
        self._crons[cron_id] = replace(cron, next_run_at=next_run_at)
        if run is not None:
            runs = self._runs.setdefault(cron_id, {})
            runs.setdefault(run.scheduled_at, run)
            for old in sorted(runs)[:-KEEP_RUNS]:
                if runs[old].status != "claimed":
                    del runs[old]
        return True

    async def _finish_run(self, run: CronRun) -> bool:
        await self._enter()
        runs = self._runs.get(run.cron_id, {})
        held = runs.get(run.scheduled_at)
        if held is None or held.status != "claimed":
            return False
        runs[run.scheduled_at] = replace(run, owner=held.owner, missed=held.missed)
        return True

    async def _claim_stale_runs(
        self, owner: str, until: datetime, now: datetime
    ) -> builtins.list[CronRun]:
        await self._enter()
        claimed: builtins.list[CronRun] = []
        for runs in self._runs.values():
            for slot, run in runs.items():
                lease = run.lease_expires_at
                if run.status == "claimed" and (lease is None or lease < now):
                    runs[slot] = replace(run, owner=owner, lease_expires_at=until)
                    claimed.append(runs[slot])
        return sorted(claimed, key=lambda r: (r.scheduled_at, r.cron_id))

    async def _list_runs(self, cron_id: str, limit: int) -> builtins.list[CronRun]:
        await self._enter()
        runs = self._runs.get(cron_id, {})
        return [runs[slot] for slot in sorted(runs, reverse=True)[:limit]]
