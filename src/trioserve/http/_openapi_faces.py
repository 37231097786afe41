"""The protocol faces in the OpenAPI document, as far as OpenAPI can describe them.

A face's operations are marked ``x-trioserve-face``: while the document is
built, ``{"protocol", "reasons"}`` (the envelope's reasons it may answer
besides the guard's), then the protocol's name.  Their error statuses may
carry the envelope or the protocol's own errors (a JSON-RPC error object,
or the SDK's plain-text refusals), so ``with_protocol_errors`` widens each
error response of such an operation to either.
"""

from __future__ import annotations

from typing import Any, Final

from trioserve.http._openapi_components import JSON, SSE

#: The operation key that marks a face's operation (its value: the protocol).
FACE: Final = "x-trioserve-face"
_TEXT: Final = "text/plain"

JSONRPC_ERROR: Final[dict[str, Any]] = {
    "type": "object",
    "description": "A JSON-RPC 2.0 error response.",
    "required": ["jsonrpc", "error"],
    "properties": {
        "jsonrpc": {"const": "2.0"},
        "id": {"type": ["string", "integer", "null"]},
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "integer"},
                "message": {"type": "string"},
                "data": {},
            },
        },
    },
}
_JSONRPC_MESSAGES: Final[dict[str, Any]] = {
    "description": "A JSON-RPC 2.0 message, or a batch of them.",
    "anyOf": [{"type": "object"}, {"type": "array", "items": {"type": "object"}}],
}
#: One frame of a face's ``text/event-stream`` body.
_FRAME: Final[dict[str, Any]] = {
    "description": "One frame of a `text/event-stream` body: `data` is a JSON message.",
    "type": "object",
    "required": ["data"],
    "properties": {
        "event": {"type": "string"},
        "data": {"type": "string", "contentMediaType": "application/json"},
        "id": {"type": "string"},
    },
}
_AGUI_FRAME: Final[dict[str, Any]] = {
    "description": "One frame of the run's stream: `data` is an AG-UI event's JSON; a frame"
    " made from a logged event (the last of those it makes) has its seq as `id`.",
    "type": "object",
    "required": ["data"],
    "properties": {
        "data": {"type": "string", "contentMediaType": "application/json"},
        "id": {"type": "string", "pattern": "^[0-9]+$"},
    },
}
_MCP_SESSION: Final = {
    "name": "Mcp-Session-Id",
    "in": "header",
    "required": False,
    "description": "The MCP session (from the `initialize` response's header).",
    "schema": {"type": "string", "minLength": 1, "maxLength": 256, "pattern": "^[!-~]+$"},
}
_LAST_EVENT_ID: Final = {
    "name": "Last-Event-ID",
    "in": "header",
    "required": False,
    "description": "Resume a call's stream after this event (an `id` this MCP session was"
    " sent: `<mcpSession>.<n>.<seq>`), replayed from the session log; an id that is not one"
    " of the session's is `400`.",
    "schema": {"type": "string", "maxLength": 256, "pattern": "^[!-~]*$"},
}


def _protocol_responses(description: str) -> dict[str, Any]:
    """The protocol's error statuses (JSON-RPC errors, or the SDK's text refusals)."""
    reply = {
        "description": description,
        "content": {JSON: {"schema": JSONRPC_ERROR}, _TEXT: {"schema": {"type": "string"}}},
    }
    return {status: dict(reply) for status in ("400", "404", "405", "406", "409", "415")}


def mcp_paths() -> dict[str, Any]:
    """``/mcp``: MCP's streamable HTTP transport (docs/protocols.md)."""
    errors = "an MCP refusal: a JSON-RPC error (or the MCP SDK's plain-text one)."
    face = {"protocol": "mcp", "reasons": ["tenant_stream_cap", "payload_too_large", "draining"]}
    return {
        "/mcp": {
            "post": {
                "operationId": "mcpPost",
                "summary": "MCP (streamable HTTP): send a JSON-RPC message to the agent's MCP"
                " server; `tools/call` of its one tool runs a turn.",
                "description": "The MCP specification's transport; docs/protocols.md says how"
                " a call maps onto sessions, turns and events.",
                FACE: face,
                "parameters": [_MCP_SESSION],
                "requestBody": {
                    "required": True,
                    "content": {JSON: {"schema": _JSONRPC_MESSAGES}},
                },
                "responses": {
                    "200": {
                        "description": "The JSON-RPC response, or an SSE stream of the messages"
                        " that answer the request (progress notifications, then the response).",
                        "content": {
                            JSON: {"schema": _JSONRPC_MESSAGES},
                            SSE: {"schema": _FRAME},
                        },
                    },
                    "202": {"description": "A notification or a response, accepted."},
                    **_protocol_responses(errors),
                },
            },
            "get": {
                "operationId": "mcpStream",
                "summary": "MCP (streamable HTTP): the session's stream of messages from the"
                " server.",
                FACE: face,
                "parameters": [_MCP_SESSION, _LAST_EVENT_ID],
                "responses": {
                    "200": {
                        "description": "An SSE stream of JSON-RPC messages.",
                        "content": {SSE: {"schema": _FRAME}},
                    },
                    **_protocol_responses(errors),
                },
            },
            "delete": {
                "operationId": "mcpEnd",
                "summary": "MCP (streamable HTTP): end the MCP session (not the agent's"
                " sessions it used).",
                FACE: face,
                "parameters": [_MCP_SESSION],
                "responses": {
                    "200": {"description": "The MCP session ended."},
                    **_protocol_responses(errors),
                },
            },
        }
    }


def with_protocol_errors(operation: dict[str, Any], errors: dict[str, Any]) -> dict[str, Any]:
    """``errors`` (envelope responses) merged with a face's own error responses."""
    merged: dict[str, Any] = {}
    own = {s: r for s, r in operation["responses"].items() if s[0] in "45"}
    for status in sorted(set(own) | set(errors)):
        if status not in own:
            merged[status] = errors[status]
            continue
        response = dict(own[status])
        if status in errors:
            envelope = errors[status]
            content = dict(response["content"])
            content[JSON] = {
                "schema": {"anyOf": [envelope["content"][JSON]["schema"], JSONRPC_ERROR]}
            }
            response["content"] = content
            response["description"] = f"{envelope['description']}; or {response['description']}"
            if "headers" in envelope:
                response["headers"] = envelope["headers"]
        merged[status] = response
    return merged


def agui_paths() -> dict[str, Any]:
    """``/ag-ui``: an AG-UI run (docs/protocols.md)."""
    return {
        "/ag-ui": {
            "post": {
                "operationId": "aguiRun",
                "summary": "AG-UI: run the agent on a `RunAgentInput`; the answer is an SSE"
                " stream of AG-UI events.",
                "description": "`threadId` is a session, `runId` a turn (posted again: that"
                " turn's events again, after `Last-Event-ID`); docs/protocols.md.",
                "parameters": [
                    {
                        "name": "Last-Event-ID",
                        "in": "header",
                        "required": False,
                        "description": "A run posted again: its events after this seq.",
                        "schema": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
                    }
                ],
                "requestBody": {
                    "required": True,
                    "content": {JSON: {"schema": RUN_AGENT_INPUT}},
                },
                "responses": {
                    "200": {
                        "description": "The run's AG-UI events (`data:` lines of JSON; a frame"
                        " made from a logged event has its `seq` as `id:`).",
                        "headers": {"Trioserve-Turn-Id": {"$ref": "#/components/headers/TurnId"}},
                        "content": {SSE: {"schema": _AGUI_FRAME}},
                    },
                },
                FACE: {
                    "protocol": "ag-ui",
                    "reasons": [
                        "invalid_request",
                        "not_found",
                        "payload_too_large",
                        "idempotency_key_reused",
                        "session_busy",
                        "session_cap",
                        "tenant_session_cap",
                        "turn_cap",
                        "tenant_turn_cap",
                        "tenant_stream_cap",
                        "draining",
                    ],
                },
            }
        }
    }


#: The parts of AG-UI's ``RunAgentInput`` that the face reads (the rest is kept as given).
RUN_AGENT_INPUT: Final[dict[str, Any]] = {
    "type": "object",
    "required": ["threadId", "runId", "messages"],
    "properties": {
        "threadId": {"type": "string", "minLength": 1, "maxLength": 1024},
        "runId": {"type": "string", "minLength": 1, "maxLength": 1024},
        "messages": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "role"],
                "properties": {"id": {"type": "string"}, "role": {"type": "string"}},
            },
        },
        "state": {},
        "tools": {"type": "array"},
        "context": {"type": "array"},
        "forwardedProps": {},
        "resume": {
            "type": "array",
            "description": "The answer to the interrupt of the thread's turn waiting for an"
            " approval (one entry: `interruptId` the approval's id; `status: resolved` with a"
            " `payload` of `true`, `false` or `{approved, editedArgs?, message?}`, or `status:"
            " cancelled`, a denial): the run streams the rest of that turn.",
            "items": {
                "type": "object",
                "required": ["interruptId", "status"],
                "properties": {
                    "interruptId": {"type": "string"},
                    "status": {"enum": ["resolved", "cancelled"]},
                    "payload": {},
                    "metadata": {"type": "object"},
                },
            },
        },
    },
}


def a2a_paths() -> dict[str, Any]:
    """A2A: the agent card and the JSON-RPC binding (docs/protocols.md)."""
    refusals = ["tenant_stream_cap", "payload_too_large"]
    return {
        "/.well-known/agent-card.json": {
            "get": {
                "operationId": "a2aAgentCard",
                "summary": "A2A: the agent card (made from the spec; its interface's `url` is"
                " this server's `/a2a`).",
                "responses": {
                    "200": {
                        "description": "The AgentCard (A2A 1.0, ProtoJSON).",
                        "content": {JSON: {"schema": {"type": "object"}}},
                    }
                },
                FACE: {"protocol": "a2a", "reasons": []},
            }
        },
        "/a2a": {
            "post": {
                "operationId": "a2aRpc",
                "summary": "A2A (JSON-RPC binding, 1.0): `SendMessage`, `SendStreamingMessage`,"
                " `GetTask`, `ListTasks`, `CancelTask`, `SubscribeToTask`, and the push"
                " notification configs (`Create`/`Get`/`List`/`DeleteTaskPushNotificationConfig`).",
                "description": "A task is a turn (`<sessionId>.<turnId>`), a context a"
                " session; a push notification config a webhook of the turn (signed, the"
                " `turnEnded` and `turnWaiting` bodies); docs/protocols.md. Errors are JSON-RPC"
                " errors, answered `200`.",
                "parameters": [
                    {
                        "name": "Last-Event-ID",
                        "in": "header",
                        "required": False,
                        "description": "`SubscribeToTask`: the events after this seq.",
                        "schema": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
                    }
                ],
                "requestBody": {
                    "required": True,
                    "content": {JSON: {"schema": {"type": "object"}}},
                },
                "responses": {
                    "200": {
                        "description": "The JSON-RPC response (or error), or for the streaming"
                        " methods an SSE stream of JSON-RPC responses.",
                        "content": {
                            JSON: {"schema": {"type": "object"}},
                            SSE: {"schema": _FRAME},
                        },
                    }
                },
                FACE: {"protocol": "a2a", "reasons": refusals},
            }
        },
    }
