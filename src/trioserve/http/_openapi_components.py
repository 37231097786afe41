"""The parts of the OpenAPI document that its paths share (``_openapi.py`` has the paths).

The table of reasons (``REASONS``, which docs/api.md shows), the response
headers, the schemas (generated from the pydantic models the server reads
and writes, ``trioserve.protocol``, and a few written here), and builders
of responses, parameters and bodies.
"""

from __future__ import annotations

from typing import Any, Final

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from trioserve.protocol import (
    IDEMPOTENCY_KEY_HEADER,
    IDEMPOTENT_REPLAYED_HEADER,
    AgentOut,
    CreateSessionBody,
    CronBody,
    CronOut,
    CronPatchBody,
    ErrorEnvelope,
    SessionOut,
    TurnBody,
    TurnOut,
    TurnStatus,
    TurnWaitingWebhook,
    TurnWebhook,
)

#: Where the prose lives (the document links to it), in trioserve's source tree.
DOCS: Final = "docs/api.md"

#: Every ``reason`` of the error envelope: its status and when it is sent.
REASONS: Final[dict[str, tuple[int, str]]] = {
    "invalid_request": (400, "malformed JSON, a wrong field type, a bad query parameter or header"),
    "bad_request": (
        400,
        "a request that is not valid HTTP/1.1 (a malformed `Host`, two `Authorization` headers,"
        " obs-fold, an oversized chunk size, ...; the connection is then closed)",
    ),
    "unauthorized": (401, "no `Authorization: Bearer KEY`, or a key not in `--api-keys`"),
    "origin_not_allowed": (403, "an `Origin` header not in `--cors-origins`"),
    "admin_required": (403, "`GET /metrics` with a key that has not the `admin` scope"),
    "not_found": (
        404,
        "unknown session, turn or cron, another tenant's, or a terminal session",
    ),
    "no_turn": (404, "a cancel when the session has no turn running"),
    "route_not_found": (404, "an unknown route, or a path with an empty segment"),
    "method_not_allowed": (
        405,
        "a known route with the wrong method (`Allow` lists the right ones)",
    ),
    "session_busy": (
        409,
        "another turn of the same session is in flight or waiting (`multitask: reject`)",
    ),
    "turn_ended": (409, "a cancel of a turn that has ended"),
    "approval_decided": (409, "a decision on an approval that was decided already"),
    "cursor_expired": (410, "events after the cursor were dropped; see `earliestSeq`"),
    "payload_too_large": (413, "a request body over the limit (the connection is then closed)"),
    "host_not_allowed": (421, "a `Host` header not in `--allowed-hosts`"),
    "idempotency_key_reused": (
        422,
        "an `Idempotency-Key` sent again with another request within `--idempotency-window`",
    ),
    "session_cap": (429, "`--max-sessions` active sessions exist"),
    "turn_cap": (429, "`--max-concurrent-turns` turns are running"),
    "queue_full": (
        429,
        "`--max-queued-turns` turns wait on the session already (`multitask: enqueue`)",
    ),
    "cron_cap": (429, "the tenant has `--max-crons-per-tenant` crons"),
    "tenant_session_cap": (429, "the tenant has `--max-sessions-per-tenant` active sessions"),
    "tenant_turn_cap": (429, "the tenant runs `--max-turns-per-tenant` turns"),
    "tenant_stream_cap": (
        429,
        "a stream (SSE or WebSocket) of a tenant that holds `--max-streams-per-tenant` open",
    ),
    "address_connection_cap": (
        429,
        "`--max-connections-per-ip` connections from the client's address are open",
    ),
    "headers_too_large": (431, "a request head over 64 KiB (the connection is then closed)"),
    "internal": (500, "a bug: the server log has the traceback"),
    "not_implemented": (
        501,
        "a method not implemented (case-sensitive: `get` is one), or a `Transfer-Encoding`"
        " other than `chunked`",
    ),
    "draining": (503, "the server is shutting down"),
    "store_unavailable": (
        503,
        "the session's last turn's end is not written yet: the session store refuses writes",
    ),
    "too_many_connections": (503, "`--max-connections` connections are open, none of them idle"),
}

#: Refusals made below the routes, possible on every request.
CONNECTION: Final = (
    "bad_request",
    "headers_too_large",
    "not_implemented",
    "address_connection_cap",
    "too_many_connections",
)
#: The guard's refusals (every route but /healthz, /readyz, /openapi.json).
GUARD: Final = ("host_not_allowed", "origin_not_allowed")

JSON: Final = "application/json"
SSE: Final = "text/event-stream"
TEXT: Final = "text/plain; charset=utf-8"

HEADERS: Final[dict[str, dict[str, Any]]] = {
    "Retry-After": {
        "description": "Seconds to wait before retrying (whole seconds, at least 1).",
        "schema": {"type": "string", "pattern": "^[0-9]+$"},
    },
    "TurnId": {
        "description": "The id of the turn (its record: `GET .../turns/{turnId}`).",
        "schema": {"type": "string"},
    },
    "Location": {
        "description": "The turn record: `/v1/sessions/{id}/turns/{turnId}`.",
        "schema": {"type": "string"},
    },
    "NextPage": {
        "description": "The token of the next page, for `?before=` (absent on the last page).",
        "schema": {"type": "string"},
    },
    "Link": {
        "description": 'RFC 8288 link to the next page: `<URL>; rel="next"` (absent on the last).',
        "schema": {"type": "string"},
    },
    "WWW-Authenticate": {
        "description": 'The challenge: `Bearer realm="trioserve"` (and `error="invalid_token"`).',
        "schema": {"type": "string"},
    },
    "Replayed": {
        "description": "`true` on an answer repeated from an `Idempotency-Key`: the first"
        " request's, and nothing ran for this one.",
        "schema": {"const": "true"},
    },
    "WarmAdapters": {
        "description": "Warm adapters ready (loaded and waiting) and wanted: `ready/target`.",
        "schema": {"type": "string", "pattern": "^[0-9]+/[0-9]+$"},
    },
}


def header_ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/headers/{name}"}


def schema_ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def model_schemas() -> dict[str, Any]:
    """The components' schemas, generated from the models (requests as read, responses as sent)."""
    models: list[tuple[type[BaseModel], Any]] = [
        (CreateSessionBody, "validation"),
        (TurnBody, "validation"),
        (SessionOut, "serialization"),
        (TurnOut, "serialization"),
        (TurnWebhook, "serialization"),
        (TurnWaitingWebhook, "serialization"),
        (AgentOut, "serialization"),
        (ErrorEnvelope, "serialization"),
        (CronBody, "validation"),
        (CronPatchBody, "validation"),
        (CronOut, "serialization"),
    ]
    _, top = models_json_schema(models, ref_template="#/components/schemas/{model}")
    schemas: dict[str, Any] = top["$defs"]
    for name in ("CreateSessionBody", "TurnBody", "CronBody", "CronPatchBody"):
        # Bodies are read as Go's encoding/json reads them: unknown fields are ignored.
        schemas[name].pop("additionalProperties", None)
    schemas["TurnBody"]["properties"]["webhook"]["description"] = (
        "A URL the turn's end is POSTed to, signed (Standard Webhooks); its host must be"
        " allowed by `--webhook-allow` (see `webhooks`)."
    )
    schemas["TurnWebhook"]["properties"]["type"]["enum"] = ["turn.ended"]
    waiting = schemas["TurnWaitingWebhook"]["properties"]
    waiting["type"]["enum"] = ["turn.waiting"]
    waiting["approval"] = schema_ref("Approval")
    status = schemas["TurnOut"]["properties"]["status"]
    status["enum"] = [s.value for s in TurnStatus]
    status["description"] = (
        "`queued` until it starts (`multitask: enqueue`), then `running`; `waiting` while a"
        " tool call waits for an approval."
    )
    detail = schemas["ErrorDetail"]["properties"]
    detail["reason"]["enum"] = sorted(REASONS)
    detail["reason"]["description"] = "Stable machine-readable word to branch on."
    detail["code"]["description"] = "The HTTP status, repeated."
    schemas["ReadyOut"] = {
        "type": "object",
        "required": ["status", "warmAdapters"],
        "properties": {
            "status": {"type": "string", "enum": ["ready", "draining"]},
            "warmAdapters": {
                "type": "object",
                "required": ["ready", "loading", "target", "min", "max", "loadMs", "loadCpuMs"],
                "properties": {
                    **{
                        k: {"type": "integer", "minimum": 0}
                        for k in ("ready", "loading", "target", "min", "max", "turnsPerLoad")
                    },
                    "loadMs": {"type": ["integer", "null"]},
                    "loadCpuMs": {"type": ["integer", "null"]},
                    "standingDown": {"type": "boolean"},
                },
            },
            "forkServer": {
                "type": "object",
                "required": ["state", "forks", "fallbacks", "restarts", "forkMs"],
                "properties": {
                    "state": {
                        "type": "string",
                        "enum": ["off", "starting", "ready", "down", "stopped"],
                    },
                    **{
                        k: {"type": "integer", "minimum": 0}
                        for k in ("forks", "fallbacks", "restarts")
                    },
                    "forkMs": {"type": ["number", "null"]},
                },
            },
            "turns": {
                "type": "object",
                "description": "Turns this process runs now, and `--max-concurrent-turns`"
                " (0: no cap).",
                "required": ["running", "max"],
                "properties": {
                    "running": {"type": "integer", "minimum": 0},
                    "max": {"type": "integer", "minimum": 0},
                },
            },
        },
    }
    schemas["SSEEvent"] = {
        "description": (
            "One frame of a `text/event-stream` body (the stream is a sequence of them, "
            "with `: keep-alive` comments while quiet). `data` is the event's JSON, "
            "`id` its seq in the session's log; an event that is not logged (a queued "
            "turn's `trioserve.queued`, and its `session.ended` if it leaves the queue "
            "unstarted) has no `id`."
        ),
        "type": "object",
        "required": ["event", "data"],
        "properties": {
            "event": {"type": "string", "description": "The event's type."},
            "data": {"type": "string", "contentMediaType": "application/json"},
            "id": {"type": "string", "pattern": "^[0-9]+$"},
        },
    }
    schemas["TurnCancelled"] = {
        "type": "object",
        "required": ["turnCancelled"],
        "properties": {"turnCancelled": {"const": True}},
    }
    return schemas


def error_responses(reasons: tuple[str, ...], *, keyed: bool = False) -> dict[str, Any]:
    """The error responses of an operation: one per status, its reasons enumerated
    (``keyed``: an operation that takes an ``Idempotency-Key``, whose 409 and 429 may be
    a repeat's)."""
    by_status: dict[int, list[str]] = {}
    for reason in reasons:
        by_status.setdefault(REASONS[reason][0], []).append(reason)
    responses: dict[str, Any] = {}
    for status, names in sorted(by_status.items()):
        error: dict[str, Any] = {"properties": {"reason": {"enum": sorted(names)}}}
        if names == ["cursor_expired"]:
            error["required"] = ["earliestSeq"]
        response: dict[str, Any] = {
            "description": "; ".join(f"`{n}`: {REASONS[n][1]}" for n in names),
            "content": {
                JSON: {
                    "schema": {
                        "allOf": [schema_ref("ErrorEnvelope")],
                        "properties": {"error": error},
                    }
                }
            },
        }
        headers = {}
        if status in (429, 503):
            headers["Retry-After"] = header_ref("Retry-After")
        if status == 401:
            headers["WWW-Authenticate"] = header_ref("WWW-Authenticate")
        if keyed and status in (409, 429):
            headers[IDEMPOTENT_REPLAYED_HEADER] = header_ref("Replayed")
        if headers:
            response["headers"] = headers
        responses[str(status)] = response
    return responses


def json_response(description: str, schema: dict[str, Any], **headers: str) -> dict[str, Any]:
    response: dict[str, Any] = {"description": description, "content": {JSON: {"schema": schema}}}
    if headers:
        response["headers"] = {name: header_ref(ref) for name, ref in headers.items()}
    return response


def sse_response(description: str, **headers: str) -> dict[str, Any]:
    return {
        "description": description + " (frames: docs/wire-protocol.md)",
        "headers": {name: header_ref(ref) for name, ref in headers.items()},
        "content": {SSE: {"schema": schema_ref("SSEEvent")}},
    }


def param(name: str, where: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "required": where == "path",
        "description": description,
        "schema": schema,
    }


IDEMPOTENCY_KEY: Final = param(
    IDEMPOTENCY_KEY_HEADER,
    "header",
    "Makes the request safe to send again (docs/api.md, Idempotency keys): a repeat with the"
    " same key within `--idempotency-window` answers what the first did without running"
    " anything.  1 to 255 printable ASCII characters (a structured-field string: the same"
    " in double quotes).",
    {"type": "string", "minLength": 1, "maxLength": 257, "pattern": "^[ -~]+$"},
)
SESSION_ID: Final = param(
    "sessionId", "path", "The session's id (`s_...`, opaque).", {"type": "string", "minLength": 1}
)
SEQ: Final = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}


def json_body(schema: str, description: str) -> dict[str, Any]:
    return {
        "required": False,
        "description": description,
        "content": {JSON: {"schema": {"anyOf": [schema_ref(schema), {"type": "null"}]}}},
    }


def reasons_of(responses: dict[str, Any]) -> tuple[str, ...]:
    """The reasons of the error responses ``errors`` made."""
    reasons: list[str] = []
    for status, response in responses.items():
        if status[0] in "45":
            schema = response["content"][JSON]["schema"]
            reasons += schema["properties"]["error"]["properties"]["reason"]["enum"]
    return tuple(reasons)


def webhook_operations() -> dict[str, Any]:
    """The document's ``webhooks``: what the server POSTs to a turn's ``webhook``."""
    signed = {
        "webhook-id": "The delivery's id: the same on every retry (drop a repeat).",
        "webhook-timestamp": "This attempt's time, Unix seconds.",
        "webhook-signature": "`v1,` + base64 of HMAC-SHA256 of `{id}.{timestamp}.{body}`"
        " under the `whsec_` secret's bytes.",
    }
    return {
        "turnEnded": {
            "post": {
                "operationId": "turnEnded",
                "summary": "A turn ended (any status): at least once, retried until a 2xx.",
                "parameters": [
                    param(name, "header", text, {"type": "string"}) for name, text in signed.items()
                ],
                "requestBody": json_body("TurnWebhook", "The event and the turn record."),
                "responses": {"2XX": {"description": "Taken: the delivery is done."}},
            }
        },
        "turnWaiting": {
            "post": {
                "operationId": "turnWaiting",
                "summary": "A turn waits for a person's approval of a tool call (docs/api.md,"
                " Approvals): at least once, retried until a 2xx.",
                "parameters": [
                    param(name, "header", text, {"type": "string"}) for name, text in signed.items()
                ],
                "requestBody": json_body(
                    "TurnWaitingWebhook", "The event, the turn record and the approval."
                ),
                "responses": {"2XX": {"description": "Taken: the delivery is done."}},
            }
        },
    }
