"""AG-UI's ``resume``: the next run answers the interrupt its turn's approval was.

A run whose turn waits for an approval ends ``RUN_FINISHED`` with outcome
``interrupt`` (the interrupt's ``id`` is the approval's).  The thread's next
``RunAgentInput`` answers it with one ``resume`` entry:

- ``interruptId``: the approval's id (the thread's turn must wait for it);
- ``status: "cancelled"``: the approval is denied (the interrupt abandoned);
- ``status: "resolved"`` with a ``payload``: ``true`` / ``false``, or an
  object ``{"approved": bool, "editedArgs"?: {...}, "message"?: "..."}``
  (or ``{"decision": "approve" | "deny", "arguments"?, "message"?}``, as
  ``POST /v1/sessions/{id}/approvals/{approvalId}`` takes it).

The run then starts no turn: the approval is decided (its turn continues,
``ApprovalDesk.decide``) and the run streams the rest of that turn, from
the log after what the thread had seen, to its end or its next interrupt.
A payload that is none of these, an unknown interrupt or more than one
entry is ``400`` naming the field (``resume[0].payload.approved``, ...).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any, Final, cast

from ag_ui.core import RunAgentInput

from trioserve.errors import InvalidRequest
from trioserve.protocol import APPROVAL_REQUESTED
from trioserve.sessions import SessionManager
from trioserve.stores.base import LoggedEvent

_KEYS: Final = frozenset({"approved", "decision", "editedArgs", "arguments", "message", "reason"})


@dataclass(frozen=True)
class Decision:
    approve: bool
    arguments: dict[str, Any] | None = None
    message: str | None = None


def decision_of(run: RunAgentInput) -> tuple[str, Decision]:
    """The interrupt ``run`` answers and how (``InvalidRequest`` naming the field)."""
    entries = run.resume or []
    if len(entries) != 1:
        raise InvalidRequest("resume: expected one entry (a turn waits for one approval)")
    entry = entries[0]
    if not 0 < len(entry.interrupt_id) <= 256:
        raise InvalidRequest("resume[0].interruptId: expected an interrupt's id")
    if entry.status == "cancelled":
        return entry.interrupt_id, Decision(False, message="cancelled")
    payload = entry.payload
    if isinstance(payload, bool):
        return entry.interrupt_id, Decision(payload)
    if not isinstance(payload, dict):
        raise InvalidRequest(
            'resume[0].payload: expected true, false or {"approved": bool, "editedArgs"?}'
        )
    unknown = sorted(set(payload) - _KEYS)
    if unknown:
        raise InvalidRequest(f"resume[0].payload.{unknown[0]}: not a field of an answer")
    if "approved" in payload:
        approve = payload["approved"]
        if not isinstance(approve, bool):
            raise InvalidRequest("resume[0].payload.approved: expected true or false")
    elif payload.get("decision") in ("approve", "deny"):
        approve = payload["decision"] == "approve"
    else:
        raise InvalidRequest(
            'resume[0].payload.approved: required (or decision: "approve" or "deny")'
        )
    name = "editedArgs" if "editedArgs" in payload else "arguments"
    arguments = payload.get(name)
    if arguments is not None and not isinstance(arguments, dict):
        raise InvalidRequest(f"resume[0].payload.{name}: expected an object")
    if arguments is not None and not approve:
        raise InvalidRequest(f"resume[0].payload.{name}: only with an approval")
    said = payload.get("message", payload.get("reason"))
    if said is not None and not (isinstance(said, str) and len(said) <= 4096):
        raise InvalidRequest("resume[0].payload.message: expected a string of at most 4096")
    return entry.interrupt_id, Decision(approve, arguments, said)


async def answer(
    manager: SessionManager,
    session_id: str,
    run: RunAgentInput,
    who: str | None,
    decided_by: str | None,
) -> tuple[str, int]:
    """Decide the approval ``run`` resumes; the turn that goes on, and the seq its rest of
    the run starts after."""
    interrupt_id, decision = decision_of(run)
    pending = [
        a
        for a in await manager.list_approvals(session_id, who)
        if a["approvalId"] == interrupt_id and a["status"] == "pending"
    ]
    if not pending:
        raise InvalidRequest(
            f"resume[0].interruptId: thread {run.thread_id[:100]!r} waits for no"
            f" approval {interrupt_id[:100]!r}"
        )
    after = (await manager.get_session(session_id, who)).last_seq
    await manager.decide(
        session_id,
        interrupt_id,
        approve=decision.approve,
        arguments=decision.arguments,
        message=decision.message,
        decided_by=decided_by,
        tenant=who,
    )
    return pending[0]["turnId"], after


async def until_next_wait(
    manager: SessionManager,
    session_id: str,
    batches: AsyncIterator[list[LoggedEvent]],
) -> AsyncIterator[list[LoggedEvent]]:
    """A resumed turn's batches up to its end, or until it waits for an approval again
    (once parked, if it runs here: its run then ends ``interrupt``)."""
    async with contextlib.aclosing(cast(AsyncGenerator[list[LoggedEvent], None], batches)):
        async for batch in batches:
            yield batch
            if any(event.type == APPROVAL_REQUESTED for event in batch):
                live = manager.running_turn(session_id)
                if live is not None:
                    await live.feed.until_finished()
                return
