"""The WebSocket transport: ``GET /v1/sessions/{id}/ws``, turns over one connection.

The client sends JSON text messages (``turn``, ``cancel``, ``ping``); the
server sends each wire event of a turn as one text message (the JSON object
an SSE ``data:`` line carries) and two control messages,
``trioserve.error`` and ``trioserve.pong``.  Turns run one after another;
refusals are error messages and leave the connection open.  The close codes
and the message table are in docs/api.md (WebSocket).

Structure: the handler owns one nursery holding the receive loop, a task
waiting for the drain, and, while a turn is delivered, one task forwarding
``Turn.events`` to the socket.  The turn itself runs in the manager's
nursery, as for SSE.

Guarantees under cancellation:

- Every wait (a message from the client, a send, admission, an event of the
  turn, the drain) is a plain cancellable Trio wait; nothing here is shielded.
- However the handler ends -- the client closed or vanished (quart-trio
  cancels the handler), hypercorn cancels it at shutdown, this module closes
  the connection, or a bug raises -- a turn still being delivered is
  detached in a ``finally``: its adapter gets SIGINT at once.  No turn
  outlives its connection.
- The close frame is sent only after the nursery has exited, so no message
  follows it.
- A turn's ``session.ended`` (and an ``error`` event, which may be its last)
  is held back until the next event arrives or the turn's channel has ended.
  When the client receives a turn's last event the session's lock and turn
  slot are already free, so the next ``turn`` is not refused as busy.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Final

import trio
from quart import websocket
from quart.wrappers import Websocket
from quart_trio import QuartTrio

from . import wire
from .app import status_for
from .errors import Draining, InvalidRequest, NotFound, SessionBusy, TrioserveError
from .manager import SessionManager, Turn
from .models import _json_type

log = logging.getLogger("trioserve.ws")

PATH: Final = "/v1/sessions/<session_id>/ws"

#: Close codes (1009, a message over the size limit, is sent by hypercorn).
CLOSE_SHUTDOWN: Final = 1001
CLOSE_INTERNAL: Final = 1011  # also hypercorn's, when the handler raises
CLOSE_NOT_FOUND: Final = 4404
CLOSE_DRAINING: Final = 4503

#: Events held back until the turn has finished or the next event arrives.
_HELD: Final = frozenset({wire.SESSION_ENDED, wire.ERROR})
_TYPES: Final = "turn, cancel or ping"
_FIELDS: Final[dict[str, frozenset[str]]] = {
    "turn": frozenset({"type", "input"}),
    "cancel": frozenset({"type"}),
    "ping": frozenset({"type"}),
}
_MAX_CLOSE_REASON: Final = 123  # bytes, RFC 6455 5.5


def add_websocket_route(app: QuartTrio, manager: SessionManager) -> None:
    """Register ``GET /v1/sessions/{id}/ws`` on ``app``."""

    @app.websocket(PATH)
    async def session_websocket(session_id: str) -> None:
        await Connection(websocket, manager, session_id).run()


def parse_message(data: str | bytes | None) -> tuple[str, str]:
    """Check a client message; return its type and (for ``turn``) its input.

    Raises ``InvalidRequest`` naming what is wrong.
    """
    if not isinstance(data, str):
        raise InvalidRequest("expected a text message holding a JSON object")
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise InvalidRequest(f"malformed JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidRequest(f"expected a JSON object, got {_json_type(value)}")
    kind = value.get("type")
    if not isinstance(kind, str):
        got = "nothing" if "type" not in value else _json_type(kind)
        raise InvalidRequest(f"type: expected a string ({_TYPES}), got {got}")
    if kind not in _FIELDS:
        raise InvalidRequest(f"unknown type {kind!r}: expected {_TYPES}")
    problems = [f"{name}: unknown field" for name in value if name not in _FIELDS[kind]]
    text = value.get("input", "")
    if not isinstance(text, str):
        problems.insert(0, f"input: expected a string, got {_json_type(text)}")
    if problems:
        raise InvalidRequest(f"invalid {kind} message: " + "; ".join(problems))
    return kind, text


def event_text(event: wire.Event) -> str:
    """The event as a text message: its JSON, re-serialized only if not UTF-8."""
    try:
        return event.raw.decode()
    except UnicodeDecodeError:  # e.g. an encoded lone surrogate: escape it
        return json.dumps(event.json(), separators=(",", ":"))


def error_message(code: int, reason: str, message: str) -> str:
    error = {"code": code, "reason": reason, "message": message}
    return _dumps({"type": "trioserve.error", "error": error})


PONG: Final = '{"type":"trioserve.pong"}'


class Connection:
    """One accepted WebSocket bound to one session; see the module doc."""

    def __init__(self, ws: Websocket, manager: SessionManager, session_id: str) -> None:
        self._ws = ws
        self._manager = manager
        self._session_id = session_id
        self._turn: Turn | None = None  # the turn being delivered, if any
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
        finally:
            if self._turn is not None:
                self._turn.detach()
        if self._close is not None:
            await self._send_close(*self._close)

    async def _refusal(self) -> tuple[int, str] | None:
        """Why the connection is closed right after accepting, if it is."""
        if self._manager.draining:
            return CLOSE_DRAINING, "server is draining"
        try:
            session = await self._manager.get_session(self._session_id)
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
                await self._handle(data)
            except TrioserveError as exc:
                await self._send_error(exc)

    async def _handle(self, data: str | bytes | None) -> None:
        kind, text = parse_message(data)
        if kind == "ping":
            await self._ws.send(PONG)
        elif kind == "cancel":
            await self._manager.cancel_turn(self._session_id)
        else:
            await self._start_turn(text)

    async def _start_turn(self, text: str) -> None:
        if self._turn is not None:
            # Still delivering this connection's turn: the manager's answer,
            # also in the moment between the turn's end and its last event.
            raise SessionBusy(f"session {self._session_id} already has a turn in flight")
        try:
            turn = await self._manager.start_turn(self._session_id, text)
        except Draining as exc:
            self._finish(CLOSE_DRAINING, exc.message)
            return
        except NotFound as exc:  # the session ended or expired since the connection opened
            self._finish(CLOSE_NOT_FOUND, exc.message)
            return
        self._turn = turn
        assert self._nursery is not None
        self._nursery.start_soon(self._forward, turn)

    async def _forward(self, turn: Turn) -> None:
        held: wire.Event | None = None
        async for event in turn.events:
            if held is not None:
                await self._ws.send(event_text(held))
                held = None
            if event.type in _HELD:
                held = event
            else:
                await self._ws.send(event_text(event))
        # The channel has ended: the turn has released the session and its slot.
        if held is not None:
            await self._ws.send(event_text(held))
        self._turn = None
        if self._manager.draining:
            self._finish(CLOSE_SHUTDOWN, "server shutting down")

    async def _close_on_drain(self) -> None:
        await self._manager.wait_draining()
        if self._turn is None:
            self._finish(CLOSE_SHUTDOWN, "server shutting down")
        # Otherwise the turn gets the shutdown grace; ``_forward`` closes after it.

    async def _send_error(self, exc: TrioserveError) -> None:
        await self._ws.send(error_message(status_for(exc), exc.reason, exc.message))

    async def _send_close(self, code: int, reason: str) -> None:
        short = reason.encode()[:_MAX_CLOSE_REASON].decode(errors="ignore")
        await self._ws.close(code, short)


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
