"""Queued turns: the part of the store contract that keeps them (``Store`` inherits it).

A turn accepted with ``multitask: enqueue`` while its session is busy is
stored by ``create_turn`` with status ``queued`` (no ``ended_at``, no log):
it holds no turn slot and is not the session's single flight.  It leaves
the queue in one of two ways, each one atomic step, exact across processes
sharing the store:

- ``begin_turn`` makes it ``running``: only the session's oldest queued
  turn (``created_at``, then id: the order of acceptance), only when no
  turn of the session runs (single flight), and under the same caps as a
  running ``create_turn``;
- ``end_queued`` ends it unstarted (``cancelled``: removed from the queue,
  its session ended), with no events.

``queued_turns`` lists every queued turn, oldest first: what a restarted
server runs in order.  With a shared store a queued turn has an ``owner``
and a lease, as a running turn (``renew_leases`` renews both), and
``claim_queued`` hands the queued turns whose owner stopped renewing (a
worker's death, ``kill -9``) to a survivor, each to one process only.
"""

from __future__ import annotations

import abc
import builtins
from datetime import datetime

from trioserve.stores.checks import check_cap, opt_utc, utc
from trioserve.stores.records import TurnEnd, TurnRecord, TurnStatus, utcnow

__all__ = ["QueuedTurns"]


class QueuedTurns(abc.ABC):
    """The contract's queued turns (see the module doc)."""

    async def begin_turn(
        self,
        session_id: str,
        turn_id: str,
        *,
        owner: str | None = None,
        lease_expires_at: datetime | None = None,
        max_running: int | None = None,
        max_running_per_tenant: int | None = None,
    ) -> TurnRecord | None:
        """Start the queued turn ``turn_id``: it becomes ``running``, with ``owner`` and
        ``lease_expires_at`` as given; return it as stored.

        ``None`` when the turn is not queued any more (started or ended
        meanwhile, maybe by another process): then nothing changes.
        ``SessionNotFound``/``TurnNotFound`` as ``get_turn``.  Refused with
        ``SessionBusy`` while a turn of the session runs or an older turn of
        it is queued, and with ``TurnCapReached``/``TenantTurnCapReached``
        under ``max_running``/``max_running_per_tenant``, exactly as
        ``create_turn`` refuses a running turn; nothing changes then.
        """
        check_cap("max_running", max_running)
        check_cap("max_running_per_tenant", max_running_per_tenant)
        lease = opt_utc(lease_expires_at, "lease_expires_at")
        return await self._begin_turn(
            session_id, turn_id, owner, lease, max_running, max_running_per_tenant
        )

    @abc.abstractmethod
    async def _begin_turn(
        self,
        session_id: str,
        turn_id: str,
        owner: str | None,
        lease_expires_at: datetime | None,
        max_running: int | None,
        tenant_cap: int | None,
    ) -> TurnRecord | None:
        """``begin_turn`` with checked arguments."""

    async def end_queued(self, session_id: str, turn_id: str, end: TurnEnd) -> bool:
        """End the queued turn ``turn_id`` unstarted, as ``end`` says (a finished status,
        else ``ValueError``); ``False`` (nothing changes) when it is not queued any more.

        ``SessionNotFound``/``TurnNotFound`` as ``get_turn``.  Its log gets nothing.
        """
        status = TurnStatus(end.status)
        if not status.finished:
            raise ValueError(f"turn {turn_id!r}: a turn cannot end as {status}")
        checked = TurnEnd(status, end.reason, utc(end.ended_at, "ended_at"))
        return await self._end_queued(session_id, turn_id, checked)

    @abc.abstractmethod
    async def _end_queued(self, session_id: str, turn_id: str, end: TurnEnd) -> bool:
        """``end_queued`` with a checked end."""

    @abc.abstractmethod
    async def queued_turns(self) -> builtins.list[TurnRecord]:
        """Every queued turn of any session, oldest first (``created_at``, then id)."""

    async def claim_queued(
        self, owner: str, until: datetime, *, now: datetime | None = None
    ) -> builtins.list[TurnRecord]:
        """Make ``owner`` the owner of every queued turn whose lease passed before ``now``
        (default: now) or that has none, its lease running to ``until``; return them as
        stored, oldest first.

        One atomic step: processes claiming at once never claim the same turn.
        """
        moment = utcnow() if now is None else utc(now, "now")
        return await self._claim_queued(owner, utc(until, "until"), moment)

    @abc.abstractmethod
    async def _claim_queued(
        self, owner: str, until: datetime, now: datetime
    ) -> builtins.list[TurnRecord]:
        """``claim_queued`` with checked arguments."""
