"""The WebSocket transport: ``GET /v1/sessions/{id}/ws``, turns over one connection.

The client sends JSON text messages (``turn``, ``cancel``, ``ping``,
``resume``); the server sends each event of a turn or a resume as one text
message (the JSON object an SSE ``data:`` line carries) and control
messages (``trioserve.error``, ``trioserve.pong``,
``trioserve.resume.end``).  Turns run one after another; refusals are error
messages and leave the connection open.  The close codes and the message
table are in docs/api.md (WebSocket).

Structure: the handler owns one nursery holding the receive loop, a task
waiting for the drain, and, while a turn or a resume is delivered, one task
forwarding its batches of events to the socket.  The turn itself runs in
the manager's nursery, as for SSE.

Guarantees under cancellation:

- Every wait (a message from the client, a send, admission, an event of the
  turn, the drain) is a plain cancellable Trio wait; nothing here is shielded.
- However the handler ends -- the client closed or vanished (quart-trio
  cancels the handler), hypercorn cancels it at shutdown, this module closes
  the connection, or a bug raises -- a turn still being delivered is told in
  a ``finally`` that its client left (``Turn.client_left``): unless it was
  started with ``onDisconnect: continue`` its adapter gets SIGINT at once.
- The close frame is sent only after the nursery has exited, so no message
  follows it.
- A turn's last event reaches the client only once the turn has released
  the session's lock and its turn slot (the feed holds it back), so the next
  ``turn`` is not refused as busy.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any, Final

import trio
from quart import websocket
from quart.wrappers import Websocket
from quart_trio import QuartTrio

from trioserve.errors import (
    Draining,
    InvalidRequest,
    NotFound,
    SessionBusy,
    TrioserveError,
)
from trioserve.http._errors import error_body, error_extra, status_for, tenant
from trioserve.http._models import _json_type, from_object
from trioserve.http._untrusted import parse_json
from trioserve.protocol import (
    CLOSE_DRAINING,
    CLOSE_INTERNAL,
    CLOSE_NOT_FOUND,
    CLOSE_SHUTDOWN,
    CONTROL_ERROR,
    PONG,
    RESUME_END,
    TURN_END,
    WS_MESSAGES,
    WS_PATH,
    WSMessage,
    WSResume,
    WSTurn,
)
from trioserve.sessions import SessionManager, Turn
from trioserve.stores.base import LoggedEvent

log = logging.getLogger("trioserve.ws")


_TYPES: Final = "turn, cancel, ping or resume"
_MAX_CLOSE_REASON: Final = 123  # bytes, RFC 6455 5.5
_PONG: Final = json.dumps({"type": PONG}, separators=(",", ":"))


def add_websocket_route(app: QuartTrio, manager: SessionManager) -> None:
    """Register ``GET /v1/sessions/{id}/ws`` on ``app``."""

    @app.websocket(WS_PATH)
    async def session_websocket(session_id: str) -> None:
        await Connection(websocket, manager, session_id, tenant()).run()


def parse_message(data: str | bytes | None) -> WSMessage:
    """Check a client message and return it typed.

    Raises ``InvalidRequest`` naming what is wrong.
    """
    if not isinstance(data, str):
        raise InvalidRequest("expected a text message holding a JSON object")
    value = parse_json(data, "message")
    if not isinstance(value, dict):
        raise InvalidRequest(f"expected a JSON object, got {_json_type(value)}")
    kind = value.get("type")
    if not isinstance(kind, str):
        got = "nothing" if "type" not in value else _json_type(kind)
        raise InvalidRequest(f"type: expected a string ({_TYPES}), got {got}")
    model = WS_MESSAGES.get(kind)
    if model is None:
        raise InvalidRequest(f"unknown type {kind!r}: expected {_TYPES}")
    return from_object(model, value, f"{kind} message")


def event_text(raw: bytes) -> str:
    """An event's JSON as a text message, re-serialized only if it is not UTF-8."""
    try:
        return raw.decode()
    except UnicodeDecodeError:  # e.g. an encoded lone surrogate: escape it
        return json.dumps(json.loads(raw), separators=(",", ":"))


def error_message(code: int, reason: str, message: str, **extra: Any) -> str:
    """``{"type":"trioserve.error","error":{...}}``: the HTTP error envelope, typed."""
    return _dumps({"type": CONTROL_ERROR, **error_body(code, reason, message, **extra)})


class Connection:
    """One accepted WebSocket bound to one session; see the module doc."""

    def __init__(
        self, ws: Websocket, manager: SessionManager, session_id: str, tenant: str | None = None
    ) -> None:
        self._ws = ws
        self._manager = manager
        self._session_id = session_id
        self._tenant = tenant
        #: What the connection is delivering: a turn it started, a resume, or nothing.
        self._delivering: Turn | WSResume | None = None
        self._nursery: trio.Nursery | None = None
        self._close: tuple[int, str] | None = None

    async def run(self) -> None:
        await self._ws.accept()
        refusal = await self._refusal()
        if refusal is not None:
            await self._send_close(*refusal)
            return
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._close_on_drain)
                await self._receive_loop()
        except Exception:  # a bug: log it, and say so with the close code
            log.exception("websocket for session %s failed", self._session_id)
            self._close = (CLOSE_INTERNAL, "internal error")
        finally:
            if isinstance(self._delivering, Turn):
                self._delivering.client_left()
        if self._close is not None:
            await self._send_close(*self._close)

    async def _refusal(self) -> tuple[int, str] | None:
        """Why the connection is closed right after accepting, if it is."""
        if self._manager.draining:
            return CLOSE_DRAINING, "server is draining"
        try:
            session = await self._manager.get_session(self._session_id, self._tenant)
        except NotFound as exc:
            return CLOSE_NOT_FOUND, exc.message
        except TrioserveError as exc:  # the store failed
            log.error("websocket for session %s: %s", self._session_id, exc.message)
            return CLOSE_INTERNAL, "internal error"
        if session.status.terminal:
            return CLOSE_NOT_FOUND, f"session {session.id} is {session.status.value}"
        return None

    def _finish(self, code: int, reason: str) -> None:
        """Stop the handler's tasks; the close frame follows once they are gone."""
        if self._close is None:
            self._close = (code, reason)
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()

    async def _receive_loop(self) -> None:
        while True:
            data = await self._ws.receive()
            try:
                await self._handle(parse_message(data))
            except TrioserveError as exc:
                await self._send_error(exc)

    async def _handle(self, message: WSMessage) -> None:
        if message.type == "ping":
            await self._ws.send(_PONG)
        elif message.type == "cancel":
            await self._manager.cancel_turn(self._session_id, self._tenant)
        elif self._delivering is not None:
            # Still delivering this connection's turn (also in the moment
            # between the turn's end and its last event) or a resume.
            what = "a turn" if isinstance(self._delivering, Turn) else "a resume"
            raise SessionBusy(f"session {self._session_id}: this connection is delivering {what}")
        elif isinstance(message, WSTurn):
            await self._start_turn(message)
        else:
            await self._start_resume(message)

    async def _start_turn(self, message: WSTurn) -> None:
        try:
            turn = await self._manager.start_turn(
                self._session_id,
                message.input,
                on_disconnect=message.onDisconnect,
                tenant=self._tenant,
            )
        except Draining as exc:
            self._finish(CLOSE_DRAINING, exc.message)
            return
        except NotFound as exc:  # the session ended or expired since the connection opened
            self._finish(CLOSE_NOT_FOUND, exc.message)
            return
        self._delivering = turn
        self._deliver(self._manager.turn_events(turn), turn.feed.first_seq - 1, turn)

    async def _start_resume(self, message: WSResume) -> None:
        batches = await self._manager.events(
            self._session_id, message.after, turn_id=message.turn, tenant=self._tenant
        )
        self._delivering = message
        self._deliver(batches, message.after, None)

    def _deliver(
        self, batches: AsyncIterator[list[LoggedEvent]], after: int, turn: Turn | None
    ) -> None:
        """Forward ``batches``, then the control message that says the delivery is over."""

        async def forward() -> None:
            last = after
            async for batch in batches:
                for event in batch:
                    await self._ws.send(event_text(event.raw))
                    last = event.seq
            # A turn has released the session and its slot by now.
            self._delivering = None
            await self._ws.send(_dumps(_end_message(turn, last)))
            if self._manager.draining:
                self._finish(CLOSE_SHUTDOWN, "server shutting down")

        assert self._nursery is not None
        self._nursery.start_soon(forward)

    async def _close_on_drain(self) -> None:
        await self._manager.wait_draining()
        if self._delivering is None:
            self._finish(CLOSE_SHUTDOWN, "server shutting down")
        # Otherwise the turn gets the shutdown grace; the delivery closes after it.

    async def _send_error(self, exc: TrioserveError) -> None:
        message = error_message(status_for(exc), exc.reason, exc.message, **error_extra(exc))
        await self._ws.send(message)

    async def _send_close(self, code: int, reason: str) -> None:
        short = reason.encode()[:_MAX_CLOSE_REASON].decode(errors="ignore")
        await self._ws.close(code, short)


def _end_message(turn: Turn | None, last_seq: int) -> dict[str, Any]:
    """``trioserve.turn.end`` after a turn's events, ``trioserve.resume.end`` after a resume's."""
    if turn is None:
        return {"type": RESUME_END, "lastSeq": last_seq}
    end = turn.end
    return {
        "type": TURN_END,
        "turnId": turn.id,
        "status": None if end is None else end.status.value,
        "reason": None if end is None else end.reason,
        "lastSeq": last_seq,
    }


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
