"""MCP calls resumed with ``Last-Event-ID``: each MCP session's event store, over the log.

The SDK resumes a stream through an ``EventStore``: every message it sends
on a request's SSE stream (or on the session's GET stream) gets the id
``store_event`` returns, and a ``GET /mcp`` with ``Last-Event-ID`` is
answered by ``replay_events_after``.  Its store is one for all MCP sessions
and is told only the stream (the request's JSON-RPC id), so a store keyed
by it would replay one MCP session's request ``2`` to another.  Here each
MCP session gets its own store (``SessionEvents``, made when the SDK admits
the session: ``McpSessions``), and its ids name it:

- ``<mcpSession>.<n>.<seq>``: a message of the session's ``n``-th request
  stream; ``seq`` is the seq of the last logged event the client has with
  it (``0``: none yet, the stream's priming event); ``.end``: the answer.
- ``<mcpSession>.g.<k>``: a message of the GET stream.

Nothing of a turn is kept here: a call knows only its turn (session, turn,
first seq, tenant) and its progress token.  A replay rebuilds what the
client missed from the durable log: the progress notifications of the
turn's events after ``seq`` (one per batch the log hands over, as a live
call sends them: ``message`` the events' JSON, one a line; ``progress`` the
place in the turn of the batch's last event), following the turn live to
its end, then the call's result, made from the log and the turn's record
exactly as the live call makes it.  The replay takes the request's stream
over (a stream of it still open is closed first), and the SDK registers no
live stream after it: nothing is sent twice.  An answer that is not a
turn's (a refusal, ``tools/list``) is kept as it was sent, for its replay.
An id that is not one of the session's is refused by the route (``400``)
before the SDK sees it.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import mcp_types as types
import trio
from mcp.server.auth.middleware.bearer_auth import AuthorizationContext
from mcp.server.streamable_http import (
    GET_STREAM_KEY,
    EventCallback,
    EventMessage,
    EventStore,
    StreamableHTTPServerTransport,
)
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp_types import JSONRPCError, JSONRPCMessage, JSONRPCNotification, JSONRPCResponse

from trioserve.errors import TrioserveError
from trioserve.http import _faces as faces
from trioserve.sessions import SessionManager, Turn

log = logging.getLogger("trioserve.mcp")

#: The request streams an MCP session remembers (its oldest are forgotten first).
MAX_CALLS: Final = 128
PROGRESS: Final = "notifications/progress"
MCP_SESSION_HEADER: Final = "mcp-session-id"


def call_result(
    reply: faces.Reply, session_id: str, turn_id: str, status: str, reason: str | None
) -> types.CallToolResult:
    """A call's result: the reply text, with the ids and how the turn ended."""
    result = {
        "reply": reply.text,
        "sessionId": session_id,
        "turnId": turn_id,
        "status": status,
        "reason": reason or "internal",
        "lastSeq": reply.last_seq,
    }
    return types.CallToolResult(
        content=[types.TextContent(text=reply.text)],
        structured_content=result,
        is_error=status != "completed",
    )


def refused(exc: TrioserveError) -> types.CallToolResult:
    """A refused turn: the reason and message, as an ``isError`` result."""
    return types.CallToolResult(
        content=[types.TextContent(text=f"{exc.reason}: {exc.message}")],
        is_error=True,
    )


def progress_token(params: Mapping[str, Any] | None) -> str | int | None:
    """A request's ``_meta.progressToken`` (``None``: it asked for no progress)."""
    meta = (params or {}).get("_meta")
    token = meta.get("progressToken") if isinstance(meta, dict) else None
    return token if isinstance(token, str | int) and not isinstance(token, bool) else None


@dataclass
class Call:
    """One request stream of an MCP session: what its replay needs, and no event."""

    number: int
    stream_id: str
    request_id: types.RequestId | None = None
    token: str | int | None = None
    session_id: str = ""
    turn_id: str = ""
    first_seq: int = 0
    tenant: str | None = None
    sent: int = 0  # the seq of the last logged event its messages carried
    answer: JSONRPCMessage | None = None  # an answer not made from a turn
    known: trio.Event = field(default_factory=trio.Event)  # its turn or its answer is known

    @property
    def has_turn(self) -> bool:
        return bool(self.turn_id)


class SessionEvents(EventStore):
    """The event store of one MCP session (see the module doc)."""

    def __init__(
        self,
        manager: SessionManager,
        mcp_session: str,
        transport: StreamableHTTPServerTransport,
        owner: str | None,
    ) -> None:
        self.manager = manager
        self.mcp = mcp_session
        self.owner = owner
        self._transport = transport
        self._calls: dict[int, Call] = {}
        self._streams: dict[str, Call] = {}
        self._numbers = itertools.count(1)
        self._get_events = itertools.count(1)

    # -- the live side -----------------------------------------------------------------

    def _new(self, stream_id: str) -> Call:
        call = Call(next(self._numbers), stream_id)
        self._calls[call.number] = call
        self._streams[stream_id] = call
        while len(self._calls) > MAX_CALLS:
            oldest = self._calls.pop(next(iter(self._calls)))
            if self._streams.get(oldest.stream_id) is oldest:
                del self._streams[oldest.stream_id]
        return call

    def started(
        self, request_id: types.RequestId, token: str | int | None, turn: Turn, tenant: str | None
    ) -> None:
        """The request ``request_id`` runs ``turn`` (called before its first progress)."""
        stream_id = str(request_id)
        call = self._streams.get(stream_id)
        if call is None or call.has_turn or call.answer is not None:
            call = self._new(stream_id)  # a client older than priming events
        call.request_id, call.token, call.tenant = request_id, token, tenant
        call.session_id, call.turn_id = turn.session_id, turn.id
        call.first_seq = turn.feed.first_seq
        call.known.set()

    async def store_event(self, stream_id: str, message: JSONRPCMessage | None) -> str:
        if stream_id == GET_STREAM_KEY:
            return f"{self.mcp}.g.{next(self._get_events)}"
        if message is None:  # a request's priming event: its stream starts
            return f"{self.mcp}.{self._new(stream_id).number}.0"
        call = self._streams.get(stream_id) or self._new(stream_id)
        if isinstance(message, JSONRPCResponse | JSONRPCError):
            if not call.has_turn:
                call.request_id, call.answer = message.id, message
            call.known.set()
            return f"{self.mcp}.{call.number}.end"
        if call.has_turn and isinstance(message, JSONRPCNotification):
            progress = (message.params or {}).get("progress")
            if message.method == PROGRESS and isinstance(progress, int | float):
                call.sent = call.first_seq + int(progress) - 1
        # Anything else (an elicitation) says what the client has: the last progress' seq.
        return f"{self.mcp}.{call.number}.{call.sent}"

    # -- the replay ----------------------------------------------------------------------

    def _parse(self, event_id: str) -> tuple[Call | None, str] | None:
        """The call and cursor an id names (``None`` call: the GET stream); ``None``: not
        an id of this MCP session's (or one it has forgotten)."""
        head, _, rest = event_id.partition(".")
        stream, _, cursor = rest.partition(".")
        if head != self.mcp or not cursor:
            return None
        if stream == "g":
            return (None, cursor) if cursor.isdigit() else None
        if not (stream.isdigit() and (cursor == "end" or cursor.isdigit())):
            return None
        call = self._calls.get(int(stream))
        return None if call is None else (call, cursor)

    def knows(self, event_id: str) -> bool:
        return self._parse(event_id) is not None

    async def replay_events_after(
        self, last_event_id: str, send_callback: EventCallback
    ) -> str | None:
        parsed = self._parse(last_event_id)
        if parsed is None:
            return None
        call, cursor = parsed
        if call is None:  # the GET stream: nothing of it is kept; on from now, live
            return GET_STREAM_KEY
        if self._streams.get(call.stream_id) is call:
            self._transport.close_sse_stream(call.stream_id)  # the replay takes it over
        if cursor == "end":
            return None
        await call.known.wait()
        if not call.has_turn:
            if call.answer is not None:
                await send_callback(EventMessage(call.answer, f"{self.mcp}.{call.number}.end"))
            return None
        await self._replay_turn(call, int(cursor), send_callback)
        return None

    async def _replay_turn(self, call: Call, cursor: int, send: EventCallback) -> None:
        first = call.first_seq
        reply = faces.Reply(last_seq=first - 1)
        try:
            batches = await self.manager.events(
                call.session_id, first - 1, turn_id=call.turn_id, tenant=call.tenant
            )
            async for batch in batches:
                fresh = []
                for event in batch:
                    reply.add(event)
                    if event.seq > cursor:
                        fresh.append(event)
                if fresh and call.token is not None:
                    lines = "\n".join([faces.event_text(event) for event in fresh])
                    params = {
                        "progressToken": call.token,
                        "progress": batch[-1].seq - first + 1,
                        "message": lines,
                    }
                    note = JSONRPCNotification(jsonrpc="2.0", method=PROGRESS, params=params)
                    await send(EventMessage(note, f"{self.mcp}.{call.number}.{batch[-1].seq}"))
            record = await self.manager.get_turn(call.session_id, call.turn_id, call.tenant)
            result = call_result(
                reply, call.session_id, call.turn_id, record.status.value, record.reason
            )
        except TrioserveError as exc:  # the session was deleted meanwhile, ...
            result = refused(exc)
        assert call.request_id is not None
        answer = JSONRPCResponse(
            jsonrpc="2.0",
            id=call.request_id,
            # As the SDK writes a result on this era's wire (its ``resultType`` is 2026's).
            result=result.model_dump(
                by_alias=True, mode="json", exclude_none=True, exclude={"result_type"}
            ),
        )
        await send(EventMessage(answer, f"{self.mcp}.{call.number}.end"))


class McpSessions(StreamableHTTPSessionManager):
    """The SDK's session manager, giving each MCP session its own ``SessionEvents``."""

    def __init__(self, manager: SessionManager, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.manager = manager
        self.stores: dict[str, SessionEvents] = {}

    def _admit_session(
        self, requestor: AuthorizationContext | None
    ) -> StreamableHTTPServerTransport | None:
        transport = super()._admit_session(requestor)
        if transport is not None and transport.mcp_session_id is not None:
            owner = None if requestor is None else requestor["client_id"]
            events = SessionEvents(self.manager, transport.mcp_session_id, transport, owner)
            self.stores[transport.mcp_session_id] = events
            transport._event_store = events  # the SDK's own store would be all sessions'
        return transport

    async def _discard_session(
        self, session_id: str, transport: StreamableHTTPServerTransport
    ) -> None:
        self.stores.pop(session_id, None)
        await super()._discard_session(session_id, transport)

    def store_of(self, mcp_session: str | None) -> SessionEvents | None:
        return None if mcp_session is None else self.stores.get(mcp_session)
