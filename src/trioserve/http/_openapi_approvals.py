"""The approvals routes in the OpenAPI document: their paths and schemas (docs/api.md,
"Approvals")."""

from __future__ import annotations

from typing import Any

from pydantic.json_schema import models_json_schema

from trioserve.http._openapi_components import (
    SESSION_ID,
    error_responses,
    json_body,
    json_response,
    param,
    schema_ref,
)
from trioserve.protocol import ApprovalDecisionBody

_APPROVAL_ID = param(
    "approvalId", "path", "The approval's id (`ap_...`).", {"type": "string", "minLength": 1}
)
_STAMP = {"type": "string", "format": "date-time"}

#: An approval as ``GET .../approvals`` lists it and a decision answers it.
APPROVAL: dict[str, Any] = {
    "type": "object",
    "required": [
        "approvalId",
        "sessionId",
        "turnId",
        "callId",
        "tool",
        "arguments",
        "status",
        "requestedAt",
        "expiresAt",
    ],
    "properties": {
        "approvalId": {"type": "string"},
        "sessionId": {"type": "string"},
        "turnId": {"type": "string"},
        "callId": {"type": "string", "description": "The adapter's id of the tool call."},
        "tool": {"type": "string"},
        "arguments": {"description": "The arguments the model gave the call."},
        "status": {"type": "string", "enum": ["pending", "approved", "denied"]},
        "requestedAt": _STAMP,
        "expiresAt": _STAMP,
        "decision": {"type": "string", "enum": ["approve", "deny"]},
        "reason": {
            "type": ["string", "null"],
            "description": "`null`: a person decided; `expired`, `interrupted`, `cancelled`,"
            " `session_ended`: the server denied it.",
        },
        "message": {"type": ["string", "null"]},
        "decidedBy": {
            "type": ["string", "null"],
            "description": "`TENANT/sha256:KEYID` of the key that decided (never the key);"
            " `null` without API keys or when the server decided.",
        },
        "decidedAt": _STAMP,
        "decidedArguments": {"description": "The arguments the person gave instead."},
    },
}


def approval_schemas() -> dict[str, Any]:
    _, top = models_json_schema(
        [(ApprovalDecisionBody, "validation")], ref_template="#/components/schemas/{model}"
    )
    schemas: dict[str, Any] = top["$defs"]
    schemas["ApprovalDecisionBody"].pop("additionalProperties", None)
    return schemas | {"Approval": APPROVAL}


def approval_paths() -> dict[str, Any]:
    session = "/v1/sessions/{sessionId}"
    return {
        f"{session}/approvals": {
            "parameters": [SESSION_ID],
            "get": {
                "operationId": "listApprovals",
                "summary": "The session's approvals, pending and decided, oldest first.",
                "responses": {
                    "200": json_response(
                        "The approvals.", {"type": "array", "items": schema_ref("Approval")}
                    ),
                    **error_responses(("not_found", "route_not_found")),
                },
            },
        },
        f"{session}/approvals/{{approvalId}}": {
            "parameters": [SESSION_ID, _APPROVAL_ID],
            "post": {
                "operationId": "decideApproval",
                "summary": "Approve or deny a waiting tool call; its turn continues.",
                "requestBody": json_body("ApprovalDecisionBody", "The decision."),
                "responses": {
                    "200": json_response("The approval as decided.", schema_ref("Approval")),
                    **error_responses(
                        (
                            "invalid_request",
                            "not_found",
                            "route_not_found",
                            "approval_decided",
                            "payload_too_large",
                        )
                    ),
                },
            },
        },
    }
