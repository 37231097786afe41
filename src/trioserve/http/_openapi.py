"""The OpenAPI 3.1 document of the HTTP API, served at ``GET /openapi.json``.

The paths, parameters, statuses and reasons of each operation are written
here; what they share (the table of reasons, ``REASONS``, that docs/api.md
shows, the headers, the schemas generated from the pydantic models, and
the builders of responses) is in ``_openapi_components.py``.  ``build``
makes the document once, when the app is created: with API keys it
declares the bearer scheme and the ``401`` on every guarded operation;
without them it has neither.

The WebSocket protocol has no OpenAPI form: its handshake is listed as an
operation whose description links to docs/api.md.
"""

from __future__ import annotations

import copy
from typing import Any

from trioserve import __version__
from trioserve.http._openapi_approvals import approval_paths, approval_schemas
from trioserve.http._openapi_components import (
    CONNECTION,
    DOCS,
    GUARD,
    HEADERS,
    IDEMPOTENCY_KEY,
    JSON,
    SEQ,
    SESSION_ID,
    SSE,
    TEXT,
    error_responses,
    header_ref,
    json_body,
    json_response,
    model_schemas,
    param,
    reasons_of,
    schema_ref,
    sse_response,
    webhook_operations,
)
from trioserve.http._openapi_crons import cron_paths
from trioserve.http._openapi_faces import (
    FACE,
    a2a_paths,
    agui_paths,
    mcp_paths,
    with_protocol_errors,
)
from trioserve.protocol import IDEMPOTENT_REPLAYED_HEADER, NEXT_PAGE_HEADER


def _paths() -> dict[str, Any]:
    session = "/v1/sessions/{sessionId}"
    return {
        "/healthz": {
            "get": {
                "operationId": "healthz",
                "summary": "Liveness: always `ok`, also while draining.",
                "security": [],
                "responses": {
                    "200": {
                        "description": "`ok\\n`",
                        "content": {TEXT: {"schema": {"type": "string", "const": "ok\n"}}},
                    },
                    **error_responses(CONNECTION),
                },
            }
        },
        "/readyz": {
            "get": {
                "operationId": "readyz",
                "summary": "Readiness: `ready`, or `503` `draining` once shutdown has begun.",
                "description": "JSON with `Accept: application/json`, else the reference's text.",
                "security": [],
                "responses": {
                    "200": {
                        "description": "Ready.",
                        "headers": {"Trioserve-Warm-Adapters": header_ref("WarmAdapters")},
                        "content": {
                            TEXT: {"schema": {"type": "string", "const": "ready\n"}},
                            JSON: {"schema": schema_ref("ReadyOut")},
                        },
                    },
                    "503": {
                        "description": "Draining (or, in the envelope, `too_many_connections`).",
                        "headers": {
                            "Retry-After": header_ref("Retry-After"),
                            "Trioserve-Warm-Adapters": header_ref("WarmAdapters"),
                        },
                        "content": {
                            TEXT: {"schema": {"type": "string", "const": "draining\n"}},
                            JSON: {
                                "schema": {
                                    "anyOf": [schema_ref("ReadyOut"), schema_ref("ErrorEnvelope")]
                                }
                            },
                        },
                    },
                    **error_responses(("bad_request", "headers_too_large", "not_implemented")),
                },
            }
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document (public: no key, any `Host`).",
                "security": [],
                "responses": {
                    "200": json_response("The OpenAPI 3.1 document.", {"type": "object"}),
                    **error_responses(CONNECTION),
                },
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics, in the text exposition format.",
                "description": "The metrics are listed in docs/operations.md (Metrics). With"
                " API keys, a key of the `admin` scope.",
                "responses": {
                    "200": {
                        "description": "The exposition (`text/plain; version=1.0.0` or `0.0.4`).",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    **error_responses(("admin_required",)),
                },
            }
        },
        "/v1/agent": {
            "get": {
                "operationId": "getAgent",
                "summary": "The agent served: the spec's public fields, and the task's inputs.",
                "description": "Never the spec's environment, paths, options or secrets.",
                "responses": {"200": json_response("The agent.", schema_ref("AgentOut"))},
            }
        },
        "/v1/sessions": {
            "post": {
                "operationId": "createSession",
                "summary": "Create an active session from the served spec.",
                "parameters": [IDEMPOTENCY_KEY],
                "requestBody": json_body(
                    "CreateSessionBody",
                    "Values for `${inputs.<key>}` in the task; none, `null` or `{}` for none.",
                ),
                "responses": {
                    "201": json_response(
                        "The session (a repeat's: the key's session, as it is now).",
                        schema_ref("SessionOut"),
                        **{IDEMPOTENT_REPLAYED_HEADER: "Replayed"},
                    ),
                    **error_responses(
                        (
                            "invalid_request",
                            "not_found",
                            "payload_too_large",
                            "idempotency_key_reused",
                            "session_cap",
                            "tenant_session_cap",
                            "draining",
                        ),
                        keyed=True,
                    ),
                },
            },
            "get": {
                "operationId": "listSessions",
                "summary": "Sessions, most recent activity first; one page with `limit`.",
                "parameters": [
                    param(
                        "status",
                        "query",
                        "Only sessions in this status (an unknown one matches nothing).",
                        {"type": "string"},
                    ),
                    param(
                        "limit",
                        "query",
                        "At most this many (absent: all).",
                        {"type": "integer", "minimum": 1, "maximum": 10_000},
                    ),
                    param(
                        "before",
                        "query",
                        f"Start after this position: a `{NEXT_PAGE_HEADER}` token or a session id.",
                        {"type": "string", "minLength": 1, "maxLength": 512},
                    ),
                ],
                "responses": {
                    "200": json_response(
                        "The sessions (a plain array, also when paged).",
                        {"type": "array", "items": schema_ref("SessionOut")},
                        **{NEXT_PAGE_HEADER: "NextPage", "Link": "Link"},
                    ),
                    **error_responses(("invalid_request",)),
                },
            },
        },
        session: {
            "parameters": [SESSION_ID],
            "get": {
                "operationId": "getSession",
                "summary": "One session.",
                "responses": {
                    "200": json_response("The session.", schema_ref("SessionOut")),
                    **error_responses(("not_found", "route_not_found")),
                },
            },
            "delete": {
                "operationId": "endSession",
                "summary": "End the session (a running turn is cancelled); terminal: no change.",
                "responses": {
                    "204": {"description": "Ended (or already terminal)."},
                    **error_responses(("not_found", "route_not_found")),
                },
            },
        },
        f"{session}/turns": {
            "parameters": [SESSION_ID],
            "post": {
                "operationId": "runTurn",
                "summary": "Run one turn and stream its events (or `detach`: `202` at once);"
                " a busy session rejects, queues or interrupts (`multitask`).",
                "parameters": [
                    IDEMPOTENCY_KEY,
                    param(
                        "traceparent",
                        "header",
                        "W3C trace context: the turn's trace continues it.",
                        {"type": "string"},
                    ),
                    param(
                        "tracestate",
                        "header",
                        "W3C trace state (only with a valid `traceparent`).",
                        {"type": "string"},
                    ),
                ],
                "requestBody": json_body(
                    "TurnBody", "The turn's input; empty: the session's task."
                ),
                "responses": {
                    "200": sse_response(
                        "The turn's events as SSE (a repeat's: the key's turn, from its first"
                        " event); an enqueued turn's stream starts with `trioserve.queued`"
                        " (`data.position`, `data.turnId`), then its events once it starts",
                        **{"Trioserve-Turn-Id": "TurnId", IDEMPOTENT_REPLAYED_HEADER: "Replayed"},
                    ),
                    "202": json_response(
                        "Detached: the turn record (`queued` if it waits); read its events with"
                        " `GET .../events?turn=`.",
                        schema_ref("TurnOut"),
                        **{
                            "Trioserve-Turn-Id": "TurnId",
                            "Location": "Location",
                            IDEMPOTENT_REPLAYED_HEADER: "Replayed",
                        },
                    ),
                    **error_responses(
                        (
                            "invalid_request",
                            "not_found",
                            "route_not_found",
                            "session_busy",
                            "payload_too_large",
                            "idempotency_key_reused",
                            "turn_cap",
                            "tenant_turn_cap",
                            "queue_full",
                            "cursor_expired",
                            "tenant_stream_cap",
                            "draining",
                            "store_unavailable",
                        ),
                        keyed=True,
                    ),
                },
            },
            "get": {
                "operationId": "listTurns",
                "summary": "The session's turn records, oldest first.",
                "responses": {
                    "200": json_response(
                        "The turns.", {"type": "array", "items": schema_ref("TurnOut")}
                    ),
                    **error_responses(("not_found", "route_not_found")),
                },
            },
        },
        f"{session}/turns/current": {
            "parameters": [SESSION_ID],
            "delete": {
                "operationId": "cancelTurn",
                "summary": "Cancel the running turn (its stream ends with `cancelled`).",
                "responses": {
                    "202": json_response("Cancelling.", schema_ref("TurnCancelled")),
                    **error_responses(("not_found", "no_turn", "route_not_found")),
                },
            },
        },
        f"{session}/turns/{{turnId}}": {
            "parameters": [
                SESSION_ID,
                param(
                    "turnId", "path", "The turn's id (`t_...`).", {"type": "string", "minLength": 1}
                ),
            ],
            "get": {
                "operationId": "getTurn",
                "summary": "One turn record.",
                "responses": {
                    "200": json_response("The turn.", schema_ref("TurnOut")),
                    **error_responses(("not_found", "route_not_found")),
                },
            },
            "delete": {
                "operationId": "cancelTurnById",
                "summary": "Cancel a turn: a queued one leaves the queue, the running one is"
                " cancelled (either stream ends with `cancelled`).",
                "responses": {
                    "202": json_response("Cancelling.", schema_ref("TurnCancelled")),
                    **error_responses(("not_found", "turn_ended", "route_not_found")),
                },
            },
        },
        f"{session}/events": {
            "parameters": [SESSION_ID],
            "get": {
                "operationId": "sessionEvents",
                "summary": "Replay the session's event log after a cursor, then follow it live.",
                "parameters": [
                    param(
                        "Last-Event-ID",
                        "header",
                        "The cursor: start after this seq (wins over `after`).",
                        SEQ,
                    ),
                    param("after", "query", "The cursor without `Last-Event-ID`.", SEQ),
                    param(
                        "follow",
                        "query",
                        "Stay open across later turns until the session ends.",
                        {"type": "boolean"},
                    ),
                    param("turn", "query", "Only this turn's events.", {"type": "string"}),
                    param(
                        "format",
                        "query",
                        "`json`: the logged events as one array (no live part).",
                        {"type": "string", "enum": ["sse", "json"]},
                    ),
                ],
                "responses": {
                    "200": {
                        "description": "The events: SSE, or a JSON array with `format=json`.",
                        "content": {
                            SSE: {"schema": schema_ref("SSEEvent")},
                            JSON: {"schema": {"type": "array", "items": {"type": "object"}}},
                        },
                    },
                    **error_responses(
                        (
                            "invalid_request",
                            "not_found",
                            "route_not_found",
                            "cursor_expired",
                            "tenant_stream_cap",
                            "draining",
                        )
                    ),
                },
            },
        },
        f"{session}/ws": {
            "parameters": [SESSION_ID],
            "get": {
                "operationId": "sessionWebSocket",
                "summary": "WebSocket: turns of one session over one connection.",
                "description": "The messages and close codes: docs/api.md, section WebSocket.",
                "externalDocs": {"url": f"{DOCS}#websocket", "description": "The protocol"},
                "responses": {
                    "101": {"description": "Switching to the WebSocket protocol."},
                    **error_responses(("invalid_request", "route_not_found", "tenant_stream_cap")),
                },
            },
        },
    }


def _console_paths() -> dict[str, Any]:
    """The web console's files (docs/console.md): no key, the ``Host`` checked."""
    refusals = error_responses((*GUARD, *CONNECTION, "route_not_found"))
    not_modified = {"description": "Unchanged since the `ETag` sent in `If-None-Match`."}

    def page(operation: str, summary: str, content: dict[str, Any]) -> dict[str, Any]:
        return {
            "operationId": operation,
            "summary": summary,
            "security": [],
            "responses": {
                "200": {"description": "The file.", "content": content},
                "304": not_modified,
                **refusals,
            },
        }

    html = {"text/html; charset=utf-8": {"schema": {"type": "string"}}}
    assets = {
        "text/javascript; charset=utf-8": {"schema": {"type": "string"}},
        "text/css; charset=utf-8": {"schema": {"type": "string"}},
        "image/svg+xml": {"schema": {"type": "string"}},
    }
    name = param("name", "path", "A file of the console (`app.js`, …).", {"type": "string"})
    return {
        "/": {"get": page("console", "The web console's page (HTML).", html)},
        "/console/{name}": {
            "parameters": [name],
            "get": page("consoleFile", "A script, style sheet or image of the console.", assets),
        },
    }


def build(
    *, auth: bool, console: bool = True, mcp: bool = True, ag_ui: bool = True, a2a: bool = True
) -> dict[str, Any]:
    """The document; ``auth``: the server requires API keys; ``console``: it serves the
    web console; ``mcp``, ``ag_ui``, ``a2a``: it serves those faces."""
    paths = _paths() | cron_paths() | (_console_paths() if console else {})
    paths |= (mcp_paths() if mcp else {}) | (agui_paths() if ag_ui else {})
    paths |= (a2a_paths() if a2a else {}) | approval_paths()
    guarded = GUARD + CONNECTION + (("unauthorized",) if auth else ())
    for item in paths.values():
        for method, operation in item.items():
            if method == "parameters" or "security" in operation:
                continue  # the open routes (/healthz, /readyz, /openapi.json) have their own
            responses = operation["responses"]
            if FACE in operation:  # a protocol's: its errors or the envelope's
                face = operation[FACE]
                errors = error_responses(tuple(dict.fromkeys(face["reasons"] + list(guarded))))
                kept = {status: r for status, r in responses.items() if status[0] not in "45"}
                operation["responses"] = kept | with_protocol_errors(operation, errors)
                operation[FACE] = face["protocol"]
                continue
            reasons = tuple(dict.fromkeys(reasons_of(responses) + guarded))
            kept = {status: r for status, r in responses.items() if status[0] not in "45"}
            operation["responses"] = kept | error_responses(reasons)
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "trioserve",
            "version": __version__,
            "description": (
                "An agent server: sessions run turns of an agent's runtime adapter and stream "
                "its events. Every refusal is the error envelope. Connections are HTTP/1.1, "
                "kept alive between requests for `--keep-alive` (default 75 s): close idle "
                "ones sooner on the client's side, and send a create or a turn that got no "
                "response again with the same `Idempotency-Key` (kept `--idempotency-window`, "
                "default 24 h). The prose, with the "
                f"WebSocket protocol: {DOCS}"
            ),
        },
        "externalDocs": {"url": DOCS},
        "paths": paths,
        "webhooks": webhook_operations(),
        "components": {
            "schemas": model_schemas() | approval_schemas(),
            "headers": copy.deepcopy(HEADERS),
        },
    }
    if auth:
        document["components"]["securitySchemes"] = {
            "apiKey": {"type": "http", "scheme": "bearer", "description": "An API key."}
        }
        document["security"] = [{"apiKey": []}]
    return document
