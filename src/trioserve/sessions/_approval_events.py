"""An approval as the log and clients see it, and as a continuation's adapter is told it.

``new_approval`` makes the record of an adapter's request; ``public`` is
what clients see of it (the adapter's ``state`` never); ``requested_event``
and ``resolved_event`` are the server's ``approval.requested`` and
``approval.resolved`` events; ``resume_of`` is the ``trioserve.resume`` of
the continuation (``_approvals.py`` has the rest).
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

from trioserve.protocol import APPROVAL_REQUESTED, APPROVAL_RESOLVED
from trioserve.runtime import wire
from trioserve.sessions._turns import Turn
from trioserve.spec import Resume
from trioserve.stores.approvals import ApprovalRecord, ApprovalStatus
from trioserve.stores.base import utcnow


def new_approval(turn: Turn, request: dict[str, Any], timeout: float) -> ApprovalRecord:
    """The approval of ``turn``'s adapter's request (its ``approval.requested`` data)."""
    now = utcnow()
    return ApprovalRecord(
        f"ap_{secrets.token_hex(8)}",
        turn.session_id,
        turn.id,
        {
            "callId": str(request.get("callId", "")),
            "tool": str(request.get("tool", "")),
            "arguments": request.get("arguments"),
            "state": request.get("state") if isinstance(request.get("state"), dict) else {},
        },
        now,
        now + timedelta(seconds=timeout),
    )


def _stamp(value: Any) -> str:
    return str(value.isoformat().replace("+00:00", "Z"))


def public(approval: ApprovalRecord) -> dict[str, Any]:
    """What clients see of an approval (never the adapter's state)."""
    decision = approval.decision
    body: dict[str, Any] = {
        "approvalId": approval.id,
        "sessionId": approval.session_id,
        "turnId": approval.turn_id,
        "callId": approval.call_id,
        "tool": approval.tool,
        "arguments": approval.request.get("arguments"),
        "status": approval.status.value,
        "requestedAt": _stamp(approval.requested_at),
        "expiresAt": _stamp(approval.expires_at),
    }
    if decision is not None:
        body.update(
            decision="approve" if decision.status is ApprovalStatus.APPROVED else "deny",
            reason=decision.reason,
            message=decision.message,
            decidedBy=decision.decided_by,
            decidedAt=_stamp(decision.decided_at),
        )
        if decision.arguments is not None:
            body["decidedArguments"] = decision.arguments
    return body


def requested_event(approval: ApprovalRecord) -> wire.Event:
    data = public(approval)
    del data["status"], data["sessionId"]
    return wire.synthesize(APPROVAL_REQUESTED, approval.session_id, data)


def resolved_event(approval: ApprovalRecord) -> wire.Event:
    data = public(approval)
    del data["sessionId"], data["requestedAt"], data["expiresAt"]
    return wire.synthesize(APPROVAL_RESOLVED, approval.session_id, data)


def resume_of(approval: ApprovalRecord) -> Resume:
    decision = approval.decision
    assert decision is not None
    approved = decision.status is ApprovalStatus.APPROVED
    arguments = decision.arguments if decision.arguments is not None else None
    return Resume.model_validate(
        {
            "approvalId": approval.id,
            "callId": approval.call_id,
            "tool": approval.tool,
            "decision": "approve" if approved else "deny",
            "arguments": arguments,
            "message": decision.message,
            "reason": decision.reason,
            "state": approval.request.get("state") or {},
        }
    )
