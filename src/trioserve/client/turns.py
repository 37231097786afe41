"""A turn's events as an async iterator, over SSE or over WebSocket.

``TurnStream`` is what ``Client.turn`` yields.  The two transports differ in
how a turn's end is seen:

- SSE: the stream ends (EOF) after ``session.ended``, or after the ``error``
  that explains why the adapter stopped without one.  EOF after any other
  event is a cut stream: ``StreamInterrupted``.  The EOF also says the
  server has freed the session; ``SSETurn.read_to_end`` waits for it.
- WebSocket: the connection outlives the turn, so the end is read from the
  events themselves: ``session.ended``, or one of the ``error`` events the
  server documents as a turn's last (docs/wire-protocol.md, "What the
  server adds"; see ``ends_turn``).  A close before then is mapped to the
  exception its code stands for (4404, 4503, 1001, 1009, 1011), or
  ``StreamInterrupted``.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, Final, Literal

import httpx
from trio_websocket import CloseReason, ConnectionClosed, WebSocketConnection

from ..wire import ERROR, SESSION_ENDED
from .errors import (
    ProtocolError,
    StreamInterrupted,
    TrioserveClientError,
    from_close,
    from_error_object,
)
from .models import Event
from .sse import SSEParser

Transport = Literal["sse", "websocket"]

#: Control messages of the WebSocket endpoint (trioserve.ws).
_CONTROL_PREFIX: Final = "trioserve."
_CONTROL_ERROR: Final = "trioserve.error"


class TurnStream:
    """The events of one turn, in order: ``async for event in stream``.

    Iteration stops after the turn's last event (``session.ended``, or an
    ``error`` that ended the turn without one).  It raises
    ``StreamInterrupted`` if the stream ends before that, ``ProtocolError``
    for something that is not an event, and over WebSocket the ``APIError``
    a close code stands for.  Each ``__anext__`` is a plain cancellable
    wait; cancelling it loses nothing already received, but the stream
    should then be left (the ``async with`` block of ``Client.turn``).
    """

    def __init__(self, session_id: str, transport: Transport) -> None:
        self.session_id = session_id
        self.transport: Transport = transport
        #: The last event yielded, if any.
        self.last_event: Event | None = None
        self._finished = False

    @property
    def finished(self) -> bool:
        """True once the turn's last event was yielded (or the stream ended)."""
        return self._finished

    def __aiter__(self) -> TurnStream:
        return self

    async def __anext__(self) -> Event:
        if self._finished:
            raise StopAsyncIteration
        try:
            event = await self._receive()
        except TrioserveClientError:
            self._finished = True
            raise
        if event is None:
            self._finished = True
            raise StopAsyncIteration
        self.last_event = event
        if self._is_last(event):
            self._finished = True
        return event

    async def _receive(self) -> Event | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _is_last(self, event: Event) -> bool:
        return event.is_end


class SSETurn(TurnStream):
    """A turn read from a ``text/event-stream`` response."""

    def __init__(self, session_id: str, response: httpx.Response) -> None:
        super().__init__(session_id, "sse")
        self._chunks: AsyncIterator[bytes] = response.aiter_bytes()
        self._parser = SSEParser()
        self._ready: deque[Event] = deque()
        self._eof = False

    async def _receive(self) -> Event | None:
        while not self._ready:
            if self._eof:
                return None
            try:
                chunk = await anext(self._chunks)
            except StopAsyncIteration:
                self._eof = True
                self._parser.close()
                last = self.last_event.type if self.last_event else None
                if last not in (SESSION_ENDED, ERROR):
                    raise StreamInterrupted(
                        "the turn's stream ended before its last event (the server went away?)"
                    ) from None
                return None
            except httpx.HTTPError as exc:
                raise StreamInterrupted(f"the turn's stream broke: {exc}") from exc
            for frame in self._parser.feed(chunk):
                event = Event.parse(frame.data, last_event_id=frame.last_event_id)
                self._ready.append(event)
        return self._ready.popleft()

    async def read_to_end(self) -> None:
        """After the turn's last event, read the stream to its end (EOF).

        The server ends the stream once the turn has released the session
        and its turn slot, which can be a little after ``session.ended``
        (the adapter has 1 s to exit before it is stopped).  Waiting for it means
        a turn started next is not refused as busy.  Does nothing if the
        turn's last event was not reached (then closing cancels the turn).
        """
        if not self._finished or self._eof:
            return
        try:
            async for _ in self._chunks:
                pass
        except httpx.HTTPError:
            pass  # the turn is over either way
        self._eof = True

    async def aclose(self) -> None:
        close = getattr(self._chunks, "aclose", None)
        if close is not None:
            await close()


class WebSocketTurn(TurnStream):
    """A turn run over one WebSocket connection."""

    def __init__(self, session_id: str, ws: WebSocketConnection) -> None:
        super().__init__(session_id, "websocket")
        self._ws = ws
        self._first: Event | None = None

    async def start(self, text: str) -> None:
        """Send the turn and wait for its first event; a refusal raises here."""
        try:
            await self._ws.send_message(json.dumps({"type": "turn", "input": text}))
        except ConnectionClosed as exc:
            raise _closed(exc.reason) from None
        self._first = await self._next_event()

    async def _receive(self) -> Event | None:
        if self._first is not None:
            event, self._first = self._first, None
            return event
        return await self._next_event()

    def _is_last(self, event: Event) -> bool:
        return event.is_end or ends_turn(event)

    async def _next_event(self) -> Event:
        while True:
            try:
                message = await self._ws.get_message()
            except ConnectionClosed as exc:
                raise _closed(exc.reason) from None
            if not isinstance(message, str):
                raise ProtocolError("the server sent a binary WebSocket message")
            try:
                value: Any = json.loads(message)
            except ValueError as exc:
                raise ProtocolError(f"the server sent a message that is not JSON ({exc})") from None
            kind = value.get("type") if isinstance(value, dict) else None
            if isinstance(kind, str) and kind.startswith(_CONTROL_PREFIX):
                if kind == _CONTROL_ERROR:
                    error = from_error_object(value.get("error"))
                    raise error or ProtocolError(f"malformed {_CONTROL_ERROR} message: {message}")
                continue  # trioserve.pong, or a control message of a later server
            return Event.from_json(value, message)


def ends_turn(event: Event) -> bool:
    """True for an ``error`` event the server sends as a turn's last one.

    These are the cases docs/wire-protocol.md lists with "the stream ends":
    the adapter exited before ``session.ended`` (``data.exitCode``), could
    not be started, or printed an oversized line, and a server bug before
    anything was sent.  Over SSE the end of the stream says the same; over
    WebSocket this is the only sign.
    """
    if not event.is_error:
        return False
    if "exitCode" in event.data:
        return True
    message = event.data.get("message")
    if not isinstance(message, str):
        return False
    return (
        message.startswith("adapter failed to start")
        or message.endswith("adapter stopped")
        or message == "internal error"
    )


def _closed(reason: CloseReason | None) -> TrioserveClientError:
    if reason is None:
        return StreamInterrupted("the WebSocket connection was closed")
    error = from_close(reason.code, reason.reason)
    if error is not None:
        return error
    detail = f": {reason.reason}" if reason.reason else ""
    return StreamInterrupted(
        f"the WebSocket connection closed with code {reason.code} ({reason.name}){detail} "
        "before the turn's last event",
        close_code=reason.code,
    )
