"""The memory store's approvals (``stores.approvals``): a dict, each step with no ``await``
between its check and its change, so each is atomic."""

from __future__ import annotations

import builtins
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING

from trioserve.errors import ApprovalDecided, ApprovalNotFound, LogConflict
from trioserve.stores.approvals import (
    ApprovalRecord,
    Approvals,
    ApprovalStatus,
    Decision,
    parked,
)
from trioserve.stores.outbox import WebhookDelivery
from trioserve.stores.records import Session, TurnRecord, TurnStatus

__all__ = ["MemoryApprovals"]


class MemoryApprovals(Approvals):
    """Mixed into ``MemoryStore``, whose dicts it reads (declared here for the checker)."""

    _turns: dict[str, TurnRecord]
    _running: dict[str, str]
    _approvals: dict[str, ApprovalRecord]
    _webhooks: dict[str, WebhookDelivery]

    if TYPE_CHECKING:

        async def _enter(self) -> None: ...
        def _row(self, session_id: str) -> Session: ...
        def _turn(self, session_id: str, turn_id: str) -> TurnRecord: ...

    async def _park_turn(
        self, approval: ApprovalRecord, webhooks: builtins.list[WebhookDelivery]
    ) -> None:
        await self._enter()
        turn = self._turn(approval.session_id, approval.turn_id)
        if turn.status is not TurnStatus.RUNNING:
            raise LogConflict(f"turn {turn.id!r} is not running ({turn.status})")
        self._turns[turn.id] = parked(turn)
        if self._running.get(turn.session_id) == turn.id:
            del self._running[turn.session_id]
        self._approvals[approval.id] = approval
        for delivery in webhooks:  # as ``_enqueue_webhooks``: an id stored already stays
            self._webhooks.setdefault(delivery.id, delivery)

    def _approval(self, session_id: str, approval_id: str) -> ApprovalRecord:
        found = self._approvals.get(approval_id)
        if found is None or found.session_id != session_id:
            raise ApprovalNotFound(f"approval {approval_id} of session {session_id} not found")
        return found

    async def _decide_approval(
        self, session_id: str, approval_id: str, decision: Decision
    ) -> ApprovalRecord:
        await self._enter()
        found = self._approval(session_id, approval_id)
        if found.status is not ApprovalStatus.PENDING:
            raise ApprovalDecided(f"approval {approval_id} was {found.status} already")
        decided = replace(found, status=decision.status, decision=decision)
        self._approvals[approval_id] = decided
        return decided

    async def _resume_turn(
        self, session_id: str, turn_id: str, owner: str | None, lease: datetime | None
    ) -> TurnRecord | None:
        await self._enter()
        turn = self._turn(session_id, turn_id)
        if turn.status is not TurnStatus.WAITING or session_id in self._running:
            return None
        open_ = [a for a in self._approvals.values() if a.turn_id == turn_id and not a.resumed]
        if not open_ or any(a.status is ApprovalStatus.PENDING for a in open_):
            return None
        for approval in open_:
            self._approvals[approval.id] = replace(approval, resumed=True)
        resumed = replace(
            turn,
            status=TurnStatus.RUNNING,
            owner=owner,
            lease_expires_at=lease,
        )
        self._turns[turn_id] = resumed
        self._running[session_id] = turn_id
        return resumed

    async def get_approval(self, session_id: str, approval_id: str) -> ApprovalRecord:
        await self._enter()
        return self._approval(session_id, approval_id)

    async def list_approvals(self, session_id: str) -> builtins.list[ApprovalRecord]:
        await self._enter()
        self._row(session_id)
        found = [a for a in self._approvals.values() if a.session_id == session_id]
        return sorted(found, key=lambda a: (a.requested_at, a.id))

    async def open_approvals(self) -> builtins.list[ApprovalRecord]:
        await self._enter()
        found = [
            a
            for a in self._approvals.values()
            if not a.resumed
            and (t := self._turns.get(a.turn_id)) is not None
            and t.status is TurnStatus.WAITING
        ]
        return sorted(found, key=lambda a: (a.requested_at, a.id))
