"""The MCP face: ``/mcp``, the agent as a tool over MCP's streamable HTTP transport.

The official ``mcp`` package serves the protocol (both of its eras: the
``initialize`` handshake with ``Mcp-Session-Id`` sessions, and the
per-request envelope of 2026-07-28); it runs on anyio, so it runs under
Trio as it is, mounted on the app's route by ``_asgi.asgi_response`` once
the guard has admitted the request.  This module only translates:

- ``tools/list`` offers one tool, named and described by the spec
  (``metadata.name``, ``metadata.description``): input ``message`` (the
  turn's input) and an optional ``sessionId``.
- ``tools/call`` starts a turn through ``_faces`` (a new session of the
  caller's tenant when ``sessionId`` is absent), sends its logged events
  as progress notifications while it runs, one per batch the log hands
  over (``progress``: the place in the turn of the batch's last event, 1,
  2, ...; ``message``: the batch's events' JSON, ``seq`` included, one per
  line: a turn streamed at a model's pace is one event a notification, a
  burst is a few notifications, not one each), and answers the reply text, with ``reply``,
  ``sessionId``, ``turnId``, ``status``, ``reason`` and ``lastSeq`` as
  structured content; a turn that did not complete is an ``isError``
  result.  A refusal (unknown session, a turn in flight, a cap, draining)
  is an ``isError`` result naming the reason; bad arguments are the
  protocol's invalid-params error.
- A call the client cancels (``notifications/cancelled``) stops its turn,
  as ``DELETE .../turns/current`` would.
- A call whose stream was cut is resumed with ``GET /mcp`` and
  ``Last-Event-ID`` (handshake era): ``_mcp_replay`` gives each MCP session
  an event store whose ids name it, and replays the call from the log.

Tenants: the API key's tenant travels in the request's scope; an MCP
session belongs to the tenant that opened it (the SDK answers another
tenant's requests for it as for an unknown session), and a ``sessionId``
of another tenant is not found.  Every request to ``/mcp`` holds one of its
tenant's stream slots while it is answered (``--max-streams-per-tenant``).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Final

import mcp_types as types
import trio
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from quart import Response, request
from quart_trio import QuartTrio

from trioserve import __version__
from trioserve.errors import Draining, TrioserveError
from trioserve.http import _faces as faces
from trioserve.http import _mcp_ask as mcp_ask
from trioserve.http._asgi import asgi_response
from trioserve.http._errors import key_digest, tenant
from trioserve.http._mcp_replay import (
    MCP_SESSION_HEADER,
    McpSessions,
    call_result,
    progress_token,
    refused,
)
from trioserve.http._streams import StreamSlots
from trioserve.protocol import APPROVAL_REQUESTED, APPROVAL_RESOLVED, TurnStatus
from trioserve.sessions import SessionManager, Turn

log = logging.getLogger("trioserve.mcp")

MCP_PATH: Final = "/mcp"
#: Where the route leaves the request's tenant in the scope it hands the SDK.
TENANT_KEY: Final = "trioserve.tenant"

INPUT_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "message": {"type": "string", "description": "what to tell the agent: the turn's input"},
        "sessionId": {
            "type": "string",
            "description": "the session to continue (from an earlier call's result);"
            " without it, a new session",
        },
    },
    "required": ["message"],
    "additionalProperties": False,
}
OUTPUT_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "reply": {"type": "string", "description": "the agent's reply text"},
        "sessionId": {"type": "string"},
        "turnId": {"type": "string"},
        "status": {"type": "string", "enum": ["completed", "cancelled", "failed"]},
        "reason": {"type": "string"},
        "lastSeq": {"type": "integer", "description": "the seq of the turn's last event"},
    },
    "required": ["reply", "sessionId", "turnId", "status", "lastSeq"],
}


class ToolArguments(BaseModel):
    """The tool's arguments (``INPUT_SCHEMA``)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    message: str
    sessionId: str | None = Field(default=None, min_length=1, max_length=256)


class McpFace:
    """The MCP server of one app: the SDK's session manager and the tool it offers."""

    def __init__(self, manager: SessionManager) -> None:
        self.manager = manager
        metadata = manager.spec.metadata
        self.tool = types.Tool(
            name=metadata.name,
            description=metadata.description
            or f"Run the agent {metadata.name!r}: send it a message, get its reply.",
            input_schema=INPUT_SCHEMA,
            output_schema=OUTPUT_SCHEMA,
        )
        server: Server[Any] = Server(
            "trioserve",
            version=__version__,
            description=f"the agent {metadata.name!r}, served by trioserve",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        self.sessions = McpSessions(
            manager,
            server,
            # The app's guard checks Host and Origin before the SDK sees a request.
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self.nursery: trio.Nursery | None = None
        self._stop = trio.CancelScope()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the SDK's sessions, and the requests' tasks, until ``close``."""
        with self._stop:
            async with self.sessions.run(), trio.open_nursery() as nursery:
                self.nursery = nursery
                task_status.started()
                await trio.sleep_forever()

    def close(self) -> None:
        self.nursery = None
        self._stop.cancel()

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[self.tool])

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        if params.name != self.tool.name:
            raise MCPError(
                types.INVALID_PARAMS,
                f"unknown tool {params.name[:100]!r}: this server's tool is {self.tool.name!r}",
            )
        arguments = _arguments(params.arguments)
        who = _tenant_of(ctx)
        try:
            turn = await faces.start_turn(
                self.manager,
                arguments.message,
                protocol="mcp",
                session_id=arguments.sessionId,
                tenant=who,
            )
        except TrioserveError as exc:
            return refused(exc)
        headers = getattr(ctx.request, "headers", None)
        mcp_session = None if headers is None else headers.get(MCP_SESSION_HEADER)
        events = self.sessions.store_of(mcp_session)
        if events is not None and ctx.request_id is not None:  # resumable from the log
            events.started(ctx.request_id, progress_token(ctx.params), turn, who)
        return await self._follow(ctx, turn, who)

    async def _follow(
        self, ctx: ServerRequestContext[Any], turn: Turn, who: str | None
    ) -> types.CallToolResult:
        reply = faces.Reply(last_seq=turn.feed.first_seq - 1)
        first = turn.feed.first_seq
        asking = trio.CancelScope()  # a question to the client about an approval
        try:
            async with trio.open_nursery() as nursery:
                async for batch in self.manager.turn_events(turn):
                    for event in batch:
                        reply.add(event)
                        if event.type == APPROVAL_REQUESTED and mcp_ask.can_ask(ctx):
                            asking = trio.CancelScope()
                            data = faces.event_object(event).get("data")
                            nursery.start_soon(self._ask, asking, ctx, turn, data, who)
                        elif event.type == APPROVAL_RESOLVED:
                            asking.cancel()  # decided: the question is withdrawn
                    if batch:  # one notification a batch: the SDK's cost is per message
                        lines = "\n".join([faces.event_text(event) for event in batch])
                        await ctx.session.report_progress(batch[-1].seq - first + 1, None, lines)
                nursery.cancel_scope.cancel()
        except BaseException:
            # The call was cancelled (notifications/cancelled, or the server stops).
            turn.stop("cancelled")
            raise
        end = turn.end
        status = "failed" if end is None else end.status.value
        reason: str | None = "internal" if end is None else end.reason
        if end is not None and end.status is TurnStatus.WAITING:  # it went on: how it ended
            record = await self.manager.get_turn(turn.session_id, turn.id)
            status, reason = record.status.value, record.reason
        return call_result(reply, turn.session_id, turn.id, status, reason)

    async def _ask(
        self,
        scope: trio.CancelScope,
        ctx: ServerRequestContext[Any],
        turn: Turn,
        approval: Any,
        who: str | None,
    ) -> None:
        if isinstance(approval, dict):
            with scope:
                await mcp_ask.ask(ctx, self.manager, turn, approval, who)


def _arguments(value: dict[str, Any] | None) -> ToolArguments:
    try:
        return ToolArguments.model_validate(value or {})
    except ValidationError as exc:
        problems = "; ".join(
            f"arguments.{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
            for e in exc.errors(include_url=False)
        )
        raise MCPError(types.INVALID_PARAMS, problems) from None


def _bad_cursor() -> Response:
    """A ``Last-Event-ID`` that is not one of the MCP session's: a JSON-RPC error, as the
    SDK answers its other refusals."""
    error = {
        "code": types.INVALID_REQUEST,
        "message": "Last-Event-ID: not an event of this"
        " MCP session (or one it no longer remembers)",
    }
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": error})
    return Response(body, status=400, content_type="application/json")


def _tenant_of(ctx: ServerRequestContext[Any]) -> str | None:
    scope = getattr(ctx.request, "scope", None)
    value = scope.get(TENANT_KEY) if isinstance(scope, dict) else None
    return value if isinstance(value, str) else None


def install(app: QuartTrio, manager: SessionManager, streams: StreamSlots) -> McpFace:
    """Serve ``/mcp`` on ``app`` (while the app serves: its lifespan runs the face)."""
    face = McpFace(manager)

    @app.before_serving
    async def _start_mcp() -> None:
        await app.nursery.start(face.serve)

    @app.after_serving
    async def _stop_mcp() -> None:
        face.close()

    @app.route(MCP_PATH, methods=["GET", "POST", "DELETE"])
    async def mcp_endpoint() -> Response:
        nursery = face.nursery
        if nursery is None or manager.draining:
            raise Draining("server is draining; not accepting MCP requests")
        last = request.headers.get("Last-Event-ID")
        if request.method == "GET" and last:
            events = face.sessions.store_of(request.headers.get(MCP_SESSION_HEADER))
            if events is not None and events.owner == tenant() and not events.knows(last):
                return _bad_cursor()
        slot = streams.take(tenant(), key_digest())
        try:
            data = await request.get_data(parse_form_data=False)
            body = data if isinstance(data, bytes) else data.encode()
            scope = dict(request.scope)
            who = tenant()
            scope[TENANT_KEY] = who
            if who is not None:  # the SDK ties an MCP session to the tenant that opened it
                scope["user"] = AuthenticatedUser(AccessToken(token="", client_id=who, scopes=[]))
            response, stream = await asgi_response(
                face.sessions.handle_request, scope, body, nursery, slot.release
            )
        except BaseException:
            slot.release()
            raise
        slot.closer = stream.end
        return response

    return face
