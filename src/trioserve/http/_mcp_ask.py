"""MCP elicitation: a call whose turn waits for an approval asks its client.

When a client declared the elicitation capability (form mode) and the
call's channel can carry a server request (the handshake era's SSE
stream; not a JSON response), a call whose turn starts waiting for an
approval asks the client through the SDK's ``elicit_form``, once the turn
is parked: "approve the call of TOOL with ARGUMENTS?", a form of
``approve`` (boolean, required) and ``message`` (string: told to the model
with a denial).  The answer decides the approval as ``POST
/v1/sessions/{id}/approvals/{approvalId}`` would (who decided:
``<tenant>/mcp``): ``accept`` with ``approve: true`` approves, ``accept``
with ``approve: false`` or ``decline`` denies; ``cancel`` (or no answer)
leaves it pending, for the REST API, the console or its expiry.  The
question is withdrawn (its request cancelled) once the approval is decided
elsewhere.  The call goes on to the turn's end either way.
"""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Any, Final

from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from trioserve.errors import ApprovalDecided, NotFound
from trioserve.protocol import TurnStatus
from trioserve.sessions import SessionManager, Turn

log = logging.getLogger("trioserve.mcp")

SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "approve": {
            "type": "boolean",
            "title": "Approve",
            "description": "run the tool call (false: deny it)",
        },
        "message": {
            "type": "string",
            "title": "Message",
            "description": "told to the model with a denial (optional)",
        },
    },
    "required": ["approve"],
}


def can_ask(ctx: ServerRequestContext[Any]) -> bool:
    """Whether the call's client takes a form elicitation on this call's channel."""
    caps = ctx.session.client_capabilities
    elicitation = None if caps is None else caps.elicitation
    if elicitation is None or not ctx.session.can_send_request:
        return False
    return elicitation.form is not None or elicitation.url is None  # {}: form mode


async def ask(
    ctx: ServerRequestContext[Any],
    manager: SessionManager,
    turn: Turn,
    approval: dict[str, Any],
    who: str | None,
) -> None:
    """Ask the client to decide ``approval`` (the ``data`` of ``turn``'s
    ``approval.requested``), once the turn is parked; decide it as answered."""
    approval_id = approval.get("approvalId")
    if not isinstance(approval_id, str):
        return
    await turn.feed.until_finished()  # parked once its run has released it
    if turn.end is None or turn.end.status is not TurnStatus.WAITING:
        return
    arguments = json.dumps(approval.get("arguments"), ensure_ascii=False)[:2000]
    question = f"The agent wants to call {approval.get('tool')} with {arguments}. Approve?"
    try:
        answer = await ctx.session.elicit_form(question, SCHEMA, related_request_id=ctx.request_id)
    except (MCPError, ValueError) as exc:  # no answer: it waits for another decision
        log.info("approval %s: the MCP client did not answer: %s", approval_id, exc)
        return
    if answer.action == "cancel":
        return
    content = answer.content or {}
    said = content.get("message")
    with contextlib.suppress(ApprovalDecided, NotFound):  # decided meanwhile, elsewhere
        await manager.decide(
            turn.session_id,
            approval_id,
            approve=answer.action == "accept" and content.get("approve") is True,
            message=said if isinstance(said, str) and said else None,
            decided_by="mcp" if who is None else f"{who}/mcp",
            tenant=who,
        )
