"""The OpenAPI 3.1 document of the HTTP API, served at ``GET /openapi.json``.

The schemas are the pydantic models the server reads and writes
(``models.py``); the paths, parameters, statuses, reasons and headers are
written here, next to the table of reasons (``REASONS``) that docs/api.md
shows.  ``build`` makes the document once, when the app is created: with
API keys it declares the bearer scheme and the ``401`` on every guarded
operation; without them it has neither.

The WebSocket protocol has no OpenAPI form: its handshake is listed as an
operation whose description links to docs/api.md.
"""

from __future__ import annotations

import copy
from typing import Any, Final

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from trioserve import __version__
from trioserve.protocol import (
    NEXT_PAGE_HEADER,
    CreateSessionBody,
    ErrorEnvelope,
    SessionOut,
    TurnBody,
    TurnOut,
)

#: Where the prose lives (the document links to it), in trioserve's source tree.
DOCS: Final = "docs/api.md"

#: Every ``reason`` of the error envelope: its status and when it is sent.
REASONS: Final[dict[str, tuple[int, str]]] = {
    "invalid_request": (400, "malformed JSON, a wrong field type, a bad query parameter or header"),
    "bad_request": (400, "a request that is not valid HTTP/1.1 (the connection is then closed)"),
    "unauthorized": (401, "no `Authorization: Bearer KEY`, or a key not in `--api-keys`"),
    "origin_not_allowed": (403, "an `Origin` header not in `--cors-origins`"),
    "not_found": (404, "unknown session or turn, another tenant's, or a terminal session"),
    "no_turn": (404, "a cancel when the session has no turn running"),
    "route_not_found": (404, "an unknown route, or a path with an empty segment"),
    "method_not_allowed": (
        405,
        "a known route with the wrong method (`Allow` lists the right ones)",
    ),
    "session_busy": (409, "another turn of the same session is in flight"),
    "cursor_expired": (410, "events after the cursor were dropped; see `earliestSeq`"),
    "payload_too_large": (413, "a request body over the limit (the connection is then closed)"),
    "host_not_allowed": (421, "a `Host` header not in `--allowed-hosts`"),
    "session_cap": (429, "`--max-sessions` active sessions exist"),
    "turn_cap": (429, "`--max-concurrent-turns` turns are running"),
    "tenant_session_cap": (429, "the tenant has `--max-sessions-per-tenant` active sessions"),
    "tenant_turn_cap": (429, "the tenant runs `--max-turns-per-tenant` turns"),
    "headers_too_large": (431, "a request head over 64 KiB (the connection is then closed)"),
    "internal": (500, "a bug: the server log has the traceback"),
    "not_implemented": (501, "a `Transfer-Encoding` other than `chunked`"),
    "draining": (503, "the server is shutting down"),
    "too_many_connections": (503, "`--max-connections` connections are open"),
}

#: Refusals made below the routes, possible on every request.
_CONNECTION: Final = ("bad_request", "headers_too_large", "not_implemented", "too_many_connections")
#: The guard's refusals (every route but /healthz, /readyz, /openapi.json).
_GUARD: Final = ("host_not_allowed", "origin_not_allowed")

_JSON: Final = "application/json"
_SSE: Final = "text/event-stream"
_TEXT: Final = "text/plain; charset=utf-8"

_HEADERS: Final[dict[str, dict[str, Any]]] = {
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
    "WarmAdapters": {
        "description": "Warm adapters ready (loaded and waiting) and wanted: `ready/target`.",
        "schema": {"type": "string", "pattern": "^[0-9]+/[0-9]+$"},
    },
}


def _header(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/headers/{name}"}


def _schema(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _model_schemas() -> dict[str, Any]:
    """The components' schemas, generated from the models (requests as read, responses as sent)."""
    models: list[tuple[type[BaseModel], Any]] = [
        (CreateSessionBody, "validation"),
        (TurnBody, "validation"),
        (SessionOut, "serialization"),
        (TurnOut, "serialization"),
        (ErrorEnvelope, "serialization"),
    ]
    _, top = models_json_schema(models, ref_template="#/components/schemas/{model}")
    schemas: dict[str, Any] = top["$defs"]
    for name in ("CreateSessionBody", "TurnBody"):
        # Bodies are read as Go's encoding/json reads them: unknown fields are ignored.
        schemas[name].pop("additionalProperties", None)
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
                },
            },
        },
    }
    schemas["SSEEvent"] = {
        "description": (
            "One frame of a `text/event-stream` body (the stream is a sequence of them, "
            "with `: keep-alive` comments while quiet). `data` is the event's JSON, "
            "`id` its seq in the session's log."
        ),
        "type": "object",
        "required": ["event", "data", "id"],
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


def _errors(reasons: tuple[str, ...]) -> dict[str, Any]:
    """The error responses of an operation: one per status, its reasons enumerated."""
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
                _JSON: {
                    "schema": {
                        "allOf": [_schema("ErrorEnvelope")],
                        "properties": {"error": error},
                    }
                }
            },
        }
        headers = {}
        if status in (429, 503):
            headers["Retry-After"] = _header("Retry-After")
        if status == 401:
            headers["WWW-Authenticate"] = _header("WWW-Authenticate")
        if headers:
            response["headers"] = headers
        responses[str(status)] = response
    return responses


def _json(description: str, schema: dict[str, Any], **headers: str) -> dict[str, Any]:
    response: dict[str, Any] = {"description": description, "content": {_JSON: {"schema": schema}}}
    if headers:
        response["headers"] = {name: _header(ref) for name, ref in headers.items()}
    return response


def _sse(description: str, **headers: str) -> dict[str, Any]:
    return {
        "description": description + " (frames: docs/wire-protocol.md)",
        "headers": {name: _header(ref) for name, ref in headers.items()},
        "content": {_SSE: {"schema": _schema("SSEEvent")}},
    }


def _param(name: str, where: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "required": where == "path",
        "description": description,
        "schema": schema,
    }


_SESSION_ID: Final = _param(
    "sessionId", "path", "The session's id (`s_...`, opaque).", {"type": "string", "minLength": 1}
)
_SEQ: Final = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}


def _body(schema: str, description: str) -> dict[str, Any]:
    return {
        "required": False,
        "description": description,
        "content": {_JSON: {"schema": {"anyOf": [_schema(schema), {"type": "null"}]}}},
    }


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
                        "content": {_TEXT: {"schema": {"type": "string", "const": "ok\n"}}},
                    },
                    **_errors(_CONNECTION),
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
                        "headers": {"Trioserve-Warm-Adapters": _header("WarmAdapters")},
                        "content": {
                            _TEXT: {"schema": {"type": "string", "const": "ready\n"}},
                            _JSON: {"schema": _schema("ReadyOut")},
                        },
                    },
                    "503": {
                        "description": "Draining (or, in the envelope, `too_many_connections`).",
                        "headers": {
                            "Retry-After": _header("Retry-After"),
                            "Trioserve-Warm-Adapters": _header("WarmAdapters"),
                        },
                        "content": {
                            _TEXT: {"schema": {"type": "string", "const": "draining\n"}},
                            _JSON: {
                                "schema": {"anyOf": [_schema("ReadyOut"), _schema("ErrorEnvelope")]}
                            },
                        },
                    },
                    **_errors(("bad_request", "headers_too_large", "not_implemented")),
                },
            }
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document (public: no key, any `Host`).",
                "security": [],
                "responses": {
                    "200": _json("The OpenAPI 3.1 document.", {"type": "object"}),
                    **_errors(_CONNECTION),
                },
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics, in the text exposition format.",
                "description": "The metrics are listed in docs/operations.md (Metrics).",
                "responses": {
                    "200": {
                        "description": "The exposition (`text/plain; version=1.0.0` or `0.0.4`).",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                },
            }
        },
        "/v1/sessions": {
            "post": {
                "operationId": "createSession",
                "summary": "Create an active session from the served spec.",
                "requestBody": _body(
                    "CreateSessionBody",
                    "Values for `${inputs.<key>}` in the task; none, `null` or `{}` for none.",
                ),
                "responses": {
                    "201": _json("The session.", _schema("SessionOut")),
                    **_errors(
                        (
                            "invalid_request",
                            "payload_too_large",
                            "session_cap",
                            "tenant_session_cap",
                            "draining",
                        )
                    ),
                },
            },
            "get": {
                "operationId": "listSessions",
                "summary": "Sessions, most recent activity first; one page with `limit`.",
                "parameters": [
                    _param(
                        "status",
                        "query",
                        "Only sessions in this status (an unknown one matches nothing).",
                        {"type": "string"},
                    ),
                    _param(
                        "limit",
                        "query",
                        "At most this many (absent: all).",
                        {"type": "integer", "minimum": 1, "maximum": 10_000},
                    ),
                    _param(
                        "before",
                        "query",
                        f"Start after this position: a `{NEXT_PAGE_HEADER}` token or a session id.",
                        {"type": "string", "minLength": 1, "maxLength": 512},
                    ),
                ],
                "responses": {
                    "200": _json(
                        "The sessions (a plain array, also when paged).",
                        {"type": "array", "items": _schema("SessionOut")},
                        **{NEXT_PAGE_HEADER: "NextPage", "Link": "Link"},
                    ),
                    **_errors(("invalid_request",)),
                },
            },
        },
        session: {
            "parameters": [_SESSION_ID],
            "get": {
                "operationId": "getSession",
                "summary": "One session.",
                "responses": {
                    "200": _json("The session.", _schema("SessionOut")),
                    **_errors(("not_found", "route_not_found")),
                },
            },
            "delete": {
                "operationId": "endSession",
                "summary": "End the session (a running turn is cancelled); terminal: no change.",
                "responses": {
                    "204": {"description": "Ended (or already terminal)."},
                    **_errors(("not_found", "route_not_found")),
                },
            },
        },
        f"{session}/turns": {
            "parameters": [_SESSION_ID],
            "post": {
                "operationId": "runTurn",
                "summary": "Run one turn and stream its events (or `detach`: `202` at once).",
                "parameters": [
                    _param(
                        "traceparent",
                        "header",
                        "W3C trace context: the turn's trace continues it.",
                        {"type": "string"},
                    ),
                    _param(
                        "tracestate",
                        "header",
                        "W3C trace state (only with a valid `traceparent`).",
                        {"type": "string"},
                    ),
                ],
                "requestBody": _body("TurnBody", "The turn's input; empty: the session's task."),
                "responses": {
                    "200": _sse("The turn's events as SSE", **{"Trioserve-Turn-Id": "TurnId"}),
                    "202": _json(
                        "Detached: the turn record; read its events with `GET .../events?turn=`.",
                        _schema("TurnOut"),
                        **{"Trioserve-Turn-Id": "TurnId", "Location": "Location"},
                    ),
                    **_errors(
                        (
                            "invalid_request",
                            "not_found",
                            "route_not_found",
                            "session_busy",
                            "payload_too_large",
                            "turn_cap",
                            "tenant_turn_cap",
                            "draining",
                        )
                    ),
                },
            },
            "get": {
                "operationId": "listTurns",
                "summary": "The session's turn records, oldest first.",
                "responses": {
                    "200": _json("The turns.", {"type": "array", "items": _schema("TurnOut")}),
                    **_errors(("not_found", "route_not_found")),
                },
            },
        },
        f"{session}/turns/current": {
            "parameters": [_SESSION_ID],
            "delete": {
                "operationId": "cancelTurn",
                "summary": "Cancel the running turn (its stream ends with `cancelled`).",
                "responses": {
                    "202": _json("Cancelling.", _schema("TurnCancelled")),
                    **_errors(("not_found", "no_turn", "route_not_found")),
                },
            },
        },
        f"{session}/turns/{{turnId}}": {
            "parameters": [
                _SESSION_ID,
                _param(
                    "turnId", "path", "The turn's id (`t_...`).", {"type": "string", "minLength": 1}
                ),
            ],
            "get": {
                "operationId": "getTurn",
                "summary": "One turn record.",
                "responses": {
                    "200": _json("The turn.", _schema("TurnOut")),
                    **_errors(("not_found", "route_not_found")),
                },
            },
        },
        f"{session}/events": {
            "parameters": [_SESSION_ID],
            "get": {
                "operationId": "sessionEvents",
                "summary": "Replay the session's event log after a cursor, then follow it live.",
                "parameters": [
                    _param(
                        "Last-Event-ID",
                        "header",
                        "The cursor: start after this seq (wins over `after`).",
                        _SEQ,
                    ),
                    _param("after", "query", "The cursor without `Last-Event-ID`.", _SEQ),
                    _param(
                        "follow",
                        "query",
                        "Stay open across later turns until the session ends.",
                        {"type": "boolean"},
                    ),
                    _param("turn", "query", "Only this turn's events.", {"type": "string"}),
                    _param(
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
                            _SSE: {"schema": _schema("SSEEvent")},
                            _JSON: {"schema": {"type": "array", "items": {"type": "object"}}},
                        },
                    },
                    **_errors(
                        (
                            "invalid_request",
                            "not_found",
                            "route_not_found",
                            "cursor_expired",
                            "draining",
                        )
                    ),
                },
            },
        },
        f"{session}/ws": {
            "parameters": [_SESSION_ID],
            "get": {
                "operationId": "sessionWebSocket",
                "summary": "WebSocket: turns of one session over one connection.",
                "description": "The messages and close codes: docs/api.md, section WebSocket.",
                "externalDocs": {"url": f"{DOCS}#websocket", "description": "The protocol"},
                "responses": {
                    "101": {"description": "Switching to the WebSocket protocol."},
                    **_errors(("invalid_request", "route_not_found")),
                },
            },
        },
    }


def build(*, auth: bool) -> dict[str, Any]:
    """The document; ``auth``: the server requires API keys."""
    paths = _paths()
    guarded = _GUARD + _CONNECTION + (("unauthorized",) if auth else ())
    for item in paths.values():
        for method, operation in item.items():
            if method == "parameters" or "security" in operation:
                continue  # the open routes (/healthz, /readyz, /openapi.json) have their own
            responses = operation["responses"]
            reasons = tuple(dict.fromkeys(_reasons_of(responses) + guarded))
            kept = {status: r for status, r in responses.items() if status[0] not in "45"}
            operation["responses"] = kept | _errors(reasons)
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "trioserve",
            "version": __version__,
            "description": (
                "An agent server: sessions run turns of an agent's runtime adapter and stream "
                "its events. Every refusal is the error envelope. The prose, with the "
                f"WebSocket protocol: {DOCS}"
            ),
        },
        "externalDocs": {"url": DOCS},
        "paths": paths,
        "components": {
            "schemas": _model_schemas(),
            "headers": copy.deepcopy(_HEADERS),
        },
    }
    if auth:
        document["components"]["securitySchemes"] = {
            "apiKey": {"type": "http", "scheme": "bearer", "description": "An API key."}
        }
        document["security"] = [{"apiKey": []}]
    return document


def _reasons_of(responses: dict[str, Any]) -> tuple[str, ...]:
    """The reasons of the error responses ``_errors`` made."""
    reasons: list[str] = []
    for status, response in responses.items():
        if status[0] in "45":
            schema = response["content"][_JSON]["schema"]
            reasons += schema["properties"]["error"]["properties"]["reason"]["enum"]
    return tuple(reasons)
