"""The approvals routes: a session's approvals, and a person's decision on one.

``GET /v1/sessions/{id}/approvals`` lists them (pending and decided, oldest
first); ``POST /v1/sessions/{id}/approvals/{approvalId}`` decides one
(``ApprovalDecisionBody``): ``200`` with the approval as decided, ``409``
``approval_decided`` for a second decision, ``404`` for an unknown one or
another tenant's.  Who decided is the key's id (``key_id``: a prefix of the
key's SHA-256, never the key), with its tenant.
"""

from __future__ import annotations

import json
from typing import Any

from quart import Response, request
from quart_trio import QuartTrio

from trioserve.http._errors import key_digest, tenant
from trioserve.http._models import parse_body
from trioserve.protocol import ApprovalDecisionBody
from trioserve.sessions import SessionManager


def key_id(digest: bytes | None) -> str | None:
    """The public id of an API key: ``sha256:`` and the first 16 hex digits of its digest."""
    return None if digest is None else f"sha256:{digest.hex()[:16]}"


def decider() -> str | None:
    """Who decides in this request, as an approval records it: ``<tenant>/<key id>``
    (``None`` without API keys); never the key."""
    key = key_id(key_digest())
    return None if key is None else f"{tenant()}/{key}"


async def _body() -> bytes:
    data = await request.get_data(parse_form_data=False)
    return data if isinstance(data, bytes) else data.encode()


def _json(value: Any) -> Response:
    body = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return Response(body, content_type="application/json")


def install(app: QuartTrio, manager: SessionManager) -> None:
    @app.get("/v1/sessions/<session_id>/approvals")
    async def list_approvals(session_id: str) -> Response:
        return _json(await manager.list_approvals(session_id, tenant()))

    @app.post("/v1/sessions/<session_id>/approvals/<approval_id>")
    async def decide_approval(session_id: str, approval_id: str) -> Response:
        raw = await _body()
        if raw.strip() in (b"", b"null"):  # no decision: refused naming the field
            raw = b"{}"
        body = parse_body(ApprovalDecisionBody, raw)
        decided = await manager.decide(
            session_id,
            approval_id,
            approve=body.decision == "approve",
            arguments=body.arguments,
            message=body.message,
            decided_by=decider(),
            tenant=tenant(),
        )
        return _json(decided)
