"""Approvals: the part of the store contract that keeps paused turns (``Store`` inherits it).

A turn whose adapter asks for a person's approval before a tool call runs
is *parked*: ``park_turn`` makes it ``waiting`` (no owner, no lease: no
process holds it) and stores its ``ApprovalRecord`` (``pending``) in the
same atomic step.  The record keeps what the adapter needs to continue
(``request.state``, never shown to clients).  ``decide_approval`` records
the decision once (``approved`` or ``denied``; a second one is refused
with ``ApprovalDecided``); ``resume_turn`` then makes the turn ``running``
again for the process that will run its continuation, and marks the
approval ``resumed``: each step is atomic and exact across processes
sharing the store, so one decision starts one continuation.
``open_approvals`` lists the approvals whose turn still waits (pending, or
decided and not resumed yet: a process died between the two steps).
"""

from __future__ import annotations

import abc
import builtins
import enum
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from trioserve.stores.checks import no_nul, opt_utc, to_json, utc
from trioserve.stores.outbox import WebhookDelivery, check_deliveries
from trioserve.stores.records import TurnRecord, TurnStatus

__all__ = ["ApprovalRecord", "ApprovalStatus", "Approvals", "Decision", "parked"]


class ApprovalStatus(enum.StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"


@dataclass(frozen=True, slots=True)
class Decision:
    """What decided an approval: ``approved`` or ``denied``, why (``reason``: ``None`` for a
    person's decision, ``expired``, ``interrupted``, ``cancelled``), the person's
    ``message`` and edited ``arguments`` (``None``: as requested), the key id that decided
    (``decided_by``), and when."""

    status: ApprovalStatus
    decided_at: datetime
    reason: str | None = None
    message: str | None = None
    arguments: Any = None
    decided_by: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"message": self.message, "arguments": self.arguments, "decidedBy": self.decided_by}


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    """One approval of a turn's tool call.

    ``request`` is the adapter's: ``callId``, ``tool``, ``arguments`` and
    ``state`` (what it resumes from; a JSON object, never sent to clients).
    """

    id: str
    session_id: str
    turn_id: str
    request: dict[str, Any]
    requested_at: datetime
    expires_at: datetime
    status: ApprovalStatus = ApprovalStatus.PENDING
    decision: Decision | None = None
    #: Whether a continuation of its turn was started (``resume_turn``).
    resumed: bool = False

    @property
    def tool(self) -> str:
        return str(self.request.get("tool", ""))

    @property
    def call_id(self) -> str:
        return str(self.request.get("callId", ""))


def check_new_approval(approval: ApprovalRecord) -> ApprovalRecord:
    """A new approval's checked copy (``ValueError`` naming what is wrong)."""
    for what in ("id", "session_id", "turn_id"):
        no_nul(f"approval: {what}", getattr(approval, what))
    if approval.status is not ApprovalStatus.PENDING or approval.decision is not None:
        raise ValueError(f"approval {approval.id!r}: a new approval must be pending")
    if type(approval.request) is not dict:
        raise ValueError(f"approval {approval.id!r}: request must be a JSON object")
    to_json(approval.request, f"approval {approval.id!r}: request")
    return ApprovalRecord(
        approval.id,
        approval.session_id,
        approval.turn_id,
        approval.request,
        utc(approval.requested_at, "requested_at"),
        utc(approval.expires_at, "expires_at"),
    )


def check_decision(decision: Decision) -> Decision:
    status = ApprovalStatus(decision.status)
    if status is ApprovalStatus.PENDING:
        raise ValueError("a decision must be approved or denied, not pending")
    to_json(decision.as_json(), "decision")
    return Decision(
        status,
        utc(decision.decided_at, "decided_at"),
        decision.reason,
        decision.message,
        decision.arguments,
        decision.decided_by,
    )


def parked(turn: TurnRecord) -> TurnRecord:
    """The running ``turn`` as ``park_turn`` stores it: ``waiting``, no owner, no lease."""
    return replace(turn, status=TurnStatus.WAITING, owner=None, lease_expires_at=None)


class Approvals(abc.ABC):
    """The contract's approvals (see the module doc)."""

    async def park_turn(
        self,
        session_id: str,
        turn_id: str,
        approval: ApprovalRecord,
        webhooks: Sequence[WebhookDelivery] = (),
    ) -> None:
        """Make the running turn ``waiting`` (owner and lease cleared), store ``approval``
        (``pending``, of this turn) and ``webhooks`` (as ``enqueue_webhooks`` would: the
        turn's ``turn.waiting`` deliveries), in one atomic step.

        ``LogConflict`` if the turn is not running (nothing changes);
        ``SessionNotFound``/``TurnNotFound`` as ``get_turn``.
        """
        if approval.session_id != session_id or approval.turn_id != turn_id:
            raise ValueError(f"approval {approval.id!r} is not of turn {turn_id!r}")
        await self._park_turn(check_new_approval(approval), check_deliveries(webhooks))

    @abc.abstractmethod
    async def _park_turn(
        self, approval: ApprovalRecord, webhooks: builtins.list[WebhookDelivery]
    ) -> None:
        """``park_turn`` with checked records."""

    async def decide_approval(
        self, session_id: str, approval_id: str, decision: Decision
    ) -> ApprovalRecord:
        """Record the decision of a pending approval; return it as stored.

        One atomic step: ``ApprovalDecided`` when it was decided already
        (by anyone, in any process), ``ApprovalNotFound`` for an unknown id
        or another session's.
        """
        return await self._decide_approval(session_id, approval_id, check_decision(decision))

    @abc.abstractmethod
    async def _decide_approval(
        self, session_id: str, approval_id: str, decision: Decision
    ) -> ApprovalRecord:
        """``decide_approval`` with a checked decision."""

    async def resume_turn(
        self,
        session_id: str,
        turn_id: str,
        *,
        owner: str | None = None,
        lease_expires_at: datetime | None = None,
    ) -> TurnRecord | None:
        """Make the waiting turn ``running`` again (with ``owner`` and its lease) once its
        approval is decided, marking the approval resumed; return the turn as stored.

        ``None`` (nothing changes) when the turn is not waiting, its approval
        is still pending or another turn of the session runs: another
        process took it, or it is not time yet.
        """
        lease = opt_utc(lease_expires_at, "lease_expires_at")
        return await self._resume_turn(session_id, turn_id, owner, lease)

    @abc.abstractmethod
    async def _resume_turn(
        self, session_id: str, turn_id: str, owner: str | None, lease: datetime | None
    ) -> TurnRecord | None:
        """``resume_turn`` with a UTC lease."""

    @abc.abstractmethod
    async def get_approval(self, session_id: str, approval_id: str) -> ApprovalRecord:
        """One approval of one session (``ApprovalNotFound`` for an unknown id)."""

    @abc.abstractmethod
    async def list_approvals(self, session_id: str) -> builtins.list[ApprovalRecord]:
        """A session's approvals, oldest first (``SessionNotFound`` for an unknown session)."""

    @abc.abstractmethod
    async def open_approvals(self) -> builtins.list[ApprovalRecord]:
        """Every approval whose turn still waits for it (not resumed), oldest first."""
