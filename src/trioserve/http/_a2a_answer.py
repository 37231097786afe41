"""A2A's answer to an ``input-required`` task: a follow-up message that decides its approval.

A task whose turn waits for a person (``input-required``) is answered by a
``SendMessage`` (or ``SendStreamingMessage``) whose message names the task
(``taskId``).  The message decides the approval the turn waits for,
instead of starting a new turn:

- a data part ``{"approvalId": ..., "decision": "approve" | "deny",
  "arguments"?: {...}, "message"?: "..."}`` (``reason`` is taken for
  ``message``; ``approvalId`` may be left out: the task's pending one),
  as ``POST /v1/sessions/{id}/approvals/{approvalId}`` takes it;
- or a text reply: ``yes`` / ``y`` / ``approve`` / ``ok`` approves, ``no`` /
  ``n`` / ``deny`` denies (case and surrounding blanks aside).

Anything else sent to an ``input-required`` task, an approval id that is not
the task's pending one, or a decision the desk refuses is ``-32602`` naming
the field (``params.message.parts[i].data.approvalId``, ...).  A data part
with an ``approvalId`` or a ``decision`` sent to a task that is working
waits (a short while) for it to be parked first: the task is shown
``input-required`` as its approval is logged, a moment before the store has
the approval.  Who decided is the key's id, as over REST.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import trio
from a2a.types.a2a_pb2 import Message
from google.protobuf import json_format

from trioserve.errors import ApprovalDecided, InvalidRequest, NotFound
from trioserve.http._a2a_rpc import INVALID_PARAMS, RpcError
from trioserve.http._a2a_tasks import task_id
from trioserve.protocol import TurnStatus
from trioserve.sessions import SessionManager
from trioserve.stores.base import TurnRecord

YES: Final = frozenset({"yes", "y", "approve", "approved", "ok"})
NO: Final = frozenset({"no", "n", "deny", "denied"})
#: How long a decision sent to a working task waits for it to be parked.
PARK_WAIT: Final = 10.0
_FIELDS: Final = frozenset({"approvalId", "decision", "arguments", "message", "reason"})


@dataclass(frozen=True)
class Answer:
    """A decision read from a message; ``where``: the part it was read from."""

    approve: bool
    where: str
    approval_id: str | None = None
    arguments: dict[str, Any] | None = None
    message: str | None = None

    @property
    def explicit(self) -> bool:
        """A data part's (a text reply to a task that does not wait is a new turn's input)."""
        return self.where.endswith(".data")


def answer_of(message: Message) -> Answer | None:
    """The decision ``message`` holds (``None``: it holds none); ``RpcError`` for a data
    part that is a decision but a wrong one."""
    texts = []
    for i, part in enumerate(message.parts):
        where = f"params.message.parts[{i}]"
        if part.HasField("data"):
            data = json_format.MessageToDict(part.data)
            if isinstance(data, dict) and ("approvalId" in data or "decision" in data):
                return _data_answer(data, f"{where}.data")
        elif part.HasField("text"):
            texts.append(part.text)
    said = "".join(texts).strip().lower()
    if said in YES or said in NO:
        return Answer(said in YES, "params.message.parts")
    return None


def _data_answer(data: dict[str, Any], where: str) -> Answer:
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise RpcError(INVALID_PARAMS, f"{where}.{unknown[0]}: not a field of a decision")
    decision = data.get("decision")
    if decision not in ("approve", "deny"):
        raise RpcError(INVALID_PARAMS, f'{where}.decision: expected "approve" or "deny"')
    approval_id = data.get("approvalId")
    named = isinstance(approval_id, str) and 0 < len(approval_id) < 256
    if approval_id is not None and not named:
        raise RpcError(INVALID_PARAMS, f"{where}.approvalId: expected an approval's id")
    arguments = data.get("arguments")
    if arguments is not None and not isinstance(arguments, dict):
        raise RpcError(INVALID_PARAMS, f"{where}.arguments: expected an object")
    said = data.get("message", data.get("reason"))
    if said is not None and not (isinstance(said, str) and len(said) <= 4096):
        raise RpcError(INVALID_PARAMS, f"{where}.message: expected a string of at most 4096")
    return Answer(decision == "approve", where, approval_id, arguments, said)


async def parked(manager: SessionManager, record: TurnRecord, who: str | None) -> TurnRecord:
    """``record`` once its turn is parked, if it runs here and is being parked (at most
    ``PARK_WAIT`` seconds): its record then."""
    live = manager.running_turn(record.session_id)
    if record.status is not TurnStatus.RUNNING or live is None or live.id != record.id:
        return record
    with trio.move_on_after(PARK_WAIT):
        await live.feed.until_finished()
    return await manager.get_turn(record.session_id, record.id, who)


async def decide(
    manager: SessionManager,
    record: TurnRecord,
    answer: Answer,
    who: str | None,
    decided_by: str | None,
) -> None:
    """Decide the approval ``record``'s turn waits for, as ``answer`` says (its turn then
    continues: ``ApprovalDesk.decide``)."""
    task = task_id(record.session_id, record.id)
    pending = [
        a
        for a in await manager.list_approvals(record.session_id, who)
        if a["turnId"] == record.id and a["status"] == "pending"
    ]
    field = f"{answer.where}.approvalId" if answer.approval_id is not None else "params.message"
    if answer.approval_id is not None:
        pending = [a for a in pending if a["approvalId"] == answer.approval_id]
    if not pending:
        named = "" if answer.approval_id is None else f" {answer.approval_id[:100]!r}"
        raise RpcError(INVALID_PARAMS, f"{field}: task {task} waits for no approval{named}")
    try:
        await manager.decide(
            record.session_id,
            pending[-1]["approvalId"],
            approve=answer.approve,
            arguments=answer.arguments,
            message=answer.message,
            decided_by=decided_by,
            tenant=who,
        )
    except ApprovalDecided as exc:
        raise RpcError(INVALID_PARAMS, f"{field}: {exc.message}") from None
    except InvalidRequest as exc:
        raise RpcError(INVALID_PARAMS, f"{answer.where}.{exc.message}") from None
    except NotFound as exc:  # decided and gone meanwhile
        raise RpcError(INVALID_PARAMS, f"{field}: {exc.message}") from None
