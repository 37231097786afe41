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

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any, Final

import quart.wrappers
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
from trioserve.http._errors import error_body, error_extra, key_digest, status_for, tenant
from trioserve.http._models import _json_type, from_object
from trioserve.http._streams import StreamSlots
from trioserve.http._untrusted import parse_json
from trioserve.http._ws_batch import TextBatch
from trioserve.protocol import (
    CLOSE_DRAINING,
    CLOSE_INTERNAL,
    CLOSE_KEY_REVOKED,
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
from trioserve.sessions import QueuedTurn, SessionManager, Turn, TurnReplay
from trioserve.stores.base import LoggedEvent

log = logging.getLogger("trioserve.ws")


_TYPES: Final = "turn, cancel, ping or resume"
_MAX_CLOSE_REASON: Final = 123  # bytes, RFC 6455 5.5
_PONG: Final = json.dumps({"type": PONG}, separators=(",", ":"))
#: What a receive or a send raises once the client has gone: quart 0.23 raises
#: ``ClientDisconnectedError`` (and cancels the handler); older releases only cancel.
_CLIENT_GONE: Final[tuple[type[Exception], ...]] = tuple(
    error
    for error in (getattr(quart.wrappers, "ClientDisconnectedError", None),)
    if isinstance(error, type) and issubclass(error, Exception)
)


def add_websocket_route(app: QuartTrio, manager: SessionManager, streams: StreamSlots) -> None:
    """Register ``GET /v1/sessions/{id}/ws`` on ``app``; each socket takes a stream slot."""

    @app.websocket(WS_PATH)
    async def session_websocket(session_id: str) -> None:
        slot = streams.take(tenant(), key_digest())  # over the cap: a 429, no handshake
        try:
            connection = Connection(websocket, manager, session_id, tenant())
            slot.closer = connection.revoke
            await connection.run()
        finally:
            slot.release()


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
        #: What the connection is delivering: a turn it started (or, for a repeated
        #: idempotency key, the turn the key started), a resume, or nothing.
        self._delivering: Turn | QueuedTurn | TurnReplay | WSResume | None = None
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
                if self._close is not None:  # revoked while it was being accepted
                    nursery.cancel_scope.cancel()
                nursery.start_soon(self._close_on_drain)
                await self._receive_loop()
        except Exception:  # a bug: log it, and say so with the close code
            log.exception("websocket for session %s failed", self._session_id)
            self._close = (CLOSE_INTERNAL, "internal error")
        finally:
            if isinstance(self._delivering, Turn | QueuedTurn):
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

    def revoke(self, reason: str) -> None:
        """Its API key was revoked: close it, with ``CLOSE_KEY_REVOKED`` and ``reason``."""
        if self._close is None:
            self._close = (CLOSE_KEY_REVOKED, reason)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def _finish(self, code: int, reason: str) -> None:
        """Stop the handler's tasks; the close frame follows once they are gone."""
        if self._close is None:
            self._close = (code, reason)
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()

    async def _receive_loop(self) -> None:
        while True:
            try:
                data = await self._ws.receive()
            except _CLIENT_GONE:
                self._client_gone()
                return
            try:
                await self._handle(parse_message(data))
            except TrioserveError as exc:
                await self._send_error(exc)

    async def _handle(self, message: WSMessage) -> None:
        if message.type == "ping":
            await self._send(_PONG)
        elif message.type == "cancel":
            await self._manager.cancel_turn(self._session_id, self._tenant)
        elif self._delivering is not None:
            # Still delivering this connection's turn (also in the moment
            # between the turn's end and its last event) or a resume.
            what = "a resume" if isinstance(self._delivering, WSResume) else "a turn"
            raise SessionBusy(f"session {self._session_id}: this connection is delivering {what}")
        elif isinstance(message, WSTurn):
            await self._start_turn(message)
        else:
            await self._start_resume(message)

    async def _start_turn(self, message: WSTurn) -> None:
        try:
            if message.idempotencyKey is None:
                turn: Turn | QueuedTurn | TurnReplay = await self._manager.start_turn(
                    self._session_id,
                    message.input,
                    on_disconnect=message.onDisconnect,
                    tenant=self._tenant,
                    multitask=message.multitask,
                    webhook=message.webhook,
                )
            else:
                turn = await self._manager.keyed.start_turn(
                    message.idempotencyKey,
                    self._session_id,
                    message.input,
                    on_disconnect=message.onDisconnect,
                    tenant=self._tenant,
                    multitask=message.multitask,
                    webhook=message.webhook,
                )
        except Draining as exc:
            self._finish(CLOSE_DRAINING, exc.message)
            return
        except NotFound as exc:  # the session ended or expired since the connection opened
            self._finish(CLOSE_NOT_FOUND, exc.message)
            return
        if isinstance(turn, TurnReplay):  # a repeat: the key's turn, from its first event
            batches = await self._manager.events(
                self._session_id, turn_id=turn.turn_id, tenant=self._tenant
            )
            self._delivering = turn
            self._deliver(batches, 0, turn)
        else:
            self._delivering = turn
            after = 0 if isinstance(turn, QueuedTurn) else turn.feed.first_seq - 1
            self._deliver(self._manager.turn_events(turn), after, turn)

    async def _start_resume(self, message: WSResume) -> None:
        batches = await self._manager.events(
            self._session_id, message.after, turn_id=message.turn, tenant=self._tenant
        )
        self._delivering = message
        self._deliver(batches, message.after, None)

    def _deliver(
        self,
        batches: AsyncIterator[list[LoggedEvent]],
        after: int,
        turn: Turn | QueuedTurn | TurnReplay | None,
    ) -> None:
        """Forward ``batches``, then the control message that says the delivery is over."""

        async def forward() -> None:
            last = after
            async for batch in batches:
                if not batch:
                    continue
                texts, bug = _texts(batch)
                if texts:  # one socket write for the batch (what came before a bug)
                    await self._send(texts[0] if len(texts) == 1 else TextBatch(texts))
                if bug is not None:
                    raise bug
                last = max(last, *(event.seq for event in batch))  # a queued turn's first
                # event is not logged (seq 0)
            # A turn has released the session and its slot by now.
            end = await self._end_message(turn, last)
            self._delivering = None
            await self._send(_dumps(end))
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
        await self._send(message)

    async def _send(self, text: str) -> None:
        """Send one message; if the client has gone, stop the handler's tasks (no close)."""
        try:
            await self._ws.send(text)
        except _CLIENT_GONE:
            self._client_gone()
            await trio.lowlevel.checkpoint()  # raises Cancelled: the nursery is cancelled

    def _client_gone(self) -> None:
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()

    async def _send_close(self, code: int, reason: str) -> None:
        short = reason.encode()[:_MAX_CLOSE_REASON].decode(errors="ignore")
        with contextlib.suppress(*_CLIENT_GONE):  # gone: nobody to tell
            await self._ws.close(code, short)

    async def _end_message(
        self, turn: Turn | QueuedTurn | TurnReplay | None, last_seq: int
    ) -> dict[str, Any]:
        """``trioserve.turn.end`` after a turn's events (a repeated turn's: as its record
        says), ``trioserve.resume.end`` after a resume's."""
        if turn is None:
            return {"type": RESUME_END, "lastSeq": last_seq}
        status: str | None = None
        reason: str | None = None
        if isinstance(turn, TurnReplay):
            record = await self._manager.get_turn(turn.session_id, turn.turn_id, self._tenant)
            turn_id, status, reason = record.id, record.status.value, record.reason
        else:
            turn_id = turn.id
            if turn.end is not None:
                status, reason = turn.end.status.value, turn.end.reason
        return {
            "type": TURN_END,
            "turnId": turn_id,
            "status": status,
            "reason": reason,
            "lastSeq": last_seq,
        }


def _texts(batch: list[LoggedEvent]) -> tuple[list[str], Exception | None]:
    """The messages of ``batch``'s events, as far as they could be made, and the bug
    that stopped it (if one did): the events before it still go out."""
    texts: list[str] = []
    try:
        for event in batch:
            texts.append(event_text(event.raw))
    except Exception as bug:
        return texts, bug
    return texts, None


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
