"""Streams of events as async iterators: a turn's, over SSE or over WebSocket.

``EventStream`` is the shape shared by what ``Client.turn`` yields
(``TurnStream``) and what ``Client.events`` yields (``LogStream``, in
``.log``).  The two transports differ in how a turn's end is seen:

- SSE: the stream ends (EOF) after ``session.ended``, or after the ``error``
  that explains why the adapter stopped without one.  EOF after any other
  event is a cut stream: ``StreamInterrupted``.  The EOF also says the
  server has freed the session; ``SSETurn.read_to_end`` waits for it.  The
  turn's id is the ``Trioserve-Turn-Id`` response header.
- WebSocket: the connection outlives the turn; after the turn's last event
  the server sends ``{"type":"trioserve.turn.end","turnId","status",
  "reason","lastSeq"}`` (also when the adapter crashed and no
  ``session.ended`` came), which ends the iteration and fills in the turn's
  id, status and reason.  A close before then is mapped to the exception
  its code stands for (4404, 4503, 1001, 1009, 1011), or
  ``StreamInterrupted``.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, Literal

import httpx
import trio
from trio_websocket import CloseReason, ConnectionClosed, WebSocketConnection

from trioserve.client.errors import (
    ProtocolError,
    StreamInterrupted,
    TrioserveClientError,
    from_close,
    from_error_object,
)
from trioserve.client.models import Event
from trioserve.client.sse import SSEParser
from trioserve.protocol import (
    CONTROL_ERROR,
    CONTROL_PREFIX,
    ERROR,
    RESUME_END,
    SESSION_ENDED,
    TURN_END,
    TURN_ID_HEADER,
    OnDisconnect,
)

Transport = Literal["sse", "websocket"]


class EventStream:
    """Events in order: ``async for event in stream``.

    Iteration raises ``ProtocolError`` for something that is not an event,
    ``StreamInterrupted`` when the stream is cut before its end, and over
    WebSocket the ``APIError`` a close code stands for; after an exception
    the iteration is over.  Each ``__anext__`` is a plain cancellable wait:
    see the subclasses for what a cancelled one leaves behind.
    """

    def __init__(self, session_id: str, transport: Transport) -> None:
        self.session_id = session_id
        self.transport: Transport = transport
        #: The last event yielded, if any.
        self.last_event: Event | None = None
        #: The seq of the last event yielded (the cursor to resume after);
        #: ``None`` before the first.
        self.last_seq: int | None = None
        self._finished = False

    @property
    def finished(self) -> bool:
        """True once the iteration is over (its end was reached, or it raised)."""
        return self._finished

    def __aiter__(self) -> EventStream:
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
        if event.seq is not None:
            self.last_seq = event.seq
        if self._is_last(event):
            self._finished = True
        return event

    async def _receive(self) -> Event | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _is_last(self, event: Event) -> bool:
        return False


class TurnStream(EventStream):
    """The events of one turn, in order: what ``Client.turn`` yields.

    Iteration stops after the turn's last event: over SSE after
    ``session.ended`` (or the ``error`` that ended the turn without one, at
    the end of the stream), over WebSocket at ``trioserve.turn.end``.

    ``turn_id`` is the turn record's id (over SSE from the response header,
    so known on entering the block; over WebSocket from
    ``trioserve.turn.end``, so known once the iteration is over).  Over
    WebSocket ``status`` and ``reason`` are the record's final ones
    (``completed``/``completed``, ``failed``/``adapter_exit``, …) once the
    iteration is over; over SSE they stay ``None``: read the record with
    ``Client.get_turn(session_id, turn_id)``.

    A cancelled ``__anext__`` loses nothing over WebSocket; over SSE the
    response's connection is closed by the cancellation, so the next call
    raises ``StreamInterrupted``.  Either way the stream should then be
    left (the ``async with`` block of ``Client.turn``).
    """

    def __init__(self, session_id: str, transport: Transport) -> None:
        super().__init__(session_id, transport)
        self.turn_id: str | None = None
        self.status: str | None = None
        self.reason: str | None = None


class SSEReader:
    """The events of a ``text/event-stream`` response, one by one.

    ``next()`` returns ``None`` at the end of the stream (a clean EOF) and
    raises ``StreamInterrupted`` when the response breaks (the connection
    dropped, the chunked body was cut, a read timed out).  A read cancelled
    half-way leaves the connection closed (httpx closes it): ``cancelled``
    is then True and the next ``next()`` raises ``StreamInterrupted``.
    """

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._chunks: AsyncIterator[bytes] = response.aiter_bytes()
        self._parser = SSEParser()
        self._ready: deque[Event] = deque()
        #: The stream reached its end, cleanly or not.
        self.eof = False
        #: A read was cancelled: the response cannot be read on.
        self.cancelled = False

    async def next(self) -> Event | None:
        while not self._ready:
            if self.eof:
                return None
            if self.cancelled:
                raise StreamInterrupted("the stream was closed by a cancelled read")
            try:
                chunk = await anext(self._chunks)
            except StopAsyncIteration:
                self.eof = True
                self._parser.close()
                return None
            except httpx.HTTPError as exc:
                self.eof = True
                raise StreamInterrupted(f"the stream broke: {exc or type(exc).__name__}") from exc
            except trio.Cancelled:
                self.cancelled = True
                raise
            for frame in self._parser.feed(chunk):
                self._ready.append(Event.parse(frame.data, last_event_id=frame.last_event_id))
        return self._ready.popleft()

    async def read_to_end(self) -> None:
        """Read and drop the rest of the stream; a broken one ends it too."""
        if self.eof or self.cancelled:
            return
        try:
            async for _ in self._chunks:
                pass
        except httpx.HTTPError:
            pass
        except trio.Cancelled:
            self.cancelled = True
            raise
        self.eof = True

    async def aclose(self) -> None:
        """Close the response (its connection is not reused unless it was read to the end)."""
        close = getattr(self._chunks, "aclose", None)
        try:
            if close is not None:
                await close()
        finally:
            await self.response.aclose()


class SSETurn(TurnStream):
    """A turn read from a ``text/event-stream`` response."""

    def __init__(self, session_id: str, response: httpx.Response) -> None:
        super().__init__(session_id, "sse")
        self.turn_id = response.headers.get(TURN_ID_HEADER) or None
        self._reader = SSEReader(response)
        self._saw_end = False

    async def _receive(self) -> Event | None:
        event = await self._reader.next()
        if event is None:
            last = self.last_event.type if self.last_event else None
            if last not in (SESSION_ENDED, ERROR):
                raise StreamInterrupted(
                    "the turn's stream ended before its last event (the server went away?)"
                )
        return event

    def _is_last(self, event: Event) -> bool:
        if event.is_end:
            self._saw_end = True
        return event.is_end

    async def read_to_end(self) -> None:
        """After the turn's last event, read the stream to its end (EOF).

        The server ends the stream once the turn has released the session
        and its turn slot, which can be a little after ``session.ended``
        (the adapter has 1 s to exit before it is stopped).  Waiting for it
        means a turn started next is not refused as busy.  Does nothing if
        ``session.ended`` was not reached (then closing cancels the turn).
        """
        if self._saw_end:
            await self._reader.read_to_end()

    async def aclose(self) -> None:
        await self._reader.aclose()


class WSReader:
    """Messages of a trioserve WebSocket: events, and the control messages that matter.

    ``next()`` returns an ``Event``, or a ``trioserve.turn.end`` /
    ``trioserve.resume.end`` message as a dict.  A ``trioserve.error``
    raises the ``APIError`` it carries; ``trioserve.pong`` and control
    messages of a later server are skipped; a close raises what its code
    stands for.  A cancelled ``next()`` loses nothing.
    """

    def __init__(self, ws: WebSocketConnection) -> None:
        self.ws = ws
        self._first: Event | dict[str, Any] | None = None

    async def send(self, message: dict[str, Any]) -> None:
        try:
            await self.ws.send_message(json.dumps(message))
        except ConnectionClosed as exc:
            raise closed_error(exc.reason) from None

    async def request(self, message: dict[str, Any]) -> None:
        """Send ``message`` and wait for the first reply (kept for ``next``): a refusal raises."""
        await self.send(message)
        self._first = await self.next()

    async def next(self) -> Event | dict[str, Any]:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        while True:
            try:
                message = await self.ws.get_message()
            except ConnectionClosed as exc:
                raise closed_error(exc.reason) from None
            if not isinstance(message, str):
                raise ProtocolError("the server sent a binary WebSocket message")
            try:
                value: Any = json.loads(message)
            except ValueError as exc:
                raise ProtocolError(f"the server sent a message that is not JSON ({exc})") from None
            kind = value.get("type") if isinstance(value, dict) else None
            if isinstance(kind, str) and kind.startswith(CONTROL_PREFIX):
                if kind == CONTROL_ERROR:
                    error = from_error_object(value.get("error"))
                    raise error or ProtocolError(f"malformed {CONTROL_ERROR} message: {message}")
                if kind in (TURN_END, RESUME_END):
                    return dict(value)
                continue  # trioserve.pong, or a control message of a later server
            return Event.from_json(value, message)


class WebSocketTurn(TurnStream):
    """A turn run over one WebSocket connection."""

    def __init__(self, session_id: str, ws: WebSocketConnection) -> None:
        super().__init__(session_id, "websocket")
        self._reader = WSReader(ws)
        self._saw_end = False

    async def start(self, text: str, on_disconnect: OnDisconnect | None = None) -> None:
        """Send the turn and wait for its first message; a refusal raises here."""
        message: dict[str, Any] = {"type": "turn", "input": text}
        if on_disconnect is not None:
            message["onDisconnect"] = on_disconnect
        await self._reader.request(message)

    async def _receive(self) -> Event | None:
        while True:
            item = await self._reader.next()
            if isinstance(item, Event):
                if item.is_end:
                    self._saw_end = True
                return item
            if item.get("type") == TURN_END:
                self._turn_end(item)
                return None
            # A stray resume.end: this connection runs no resume; skip it.

    def _turn_end(self, message: dict[str, Any]) -> None:
        turn_id, status = message.get("turnId"), message.get("status")
        reason, last_seq = message.get("reason"), message.get("lastSeq")
        self.turn_id = turn_id if isinstance(turn_id, str) else self.turn_id
        self.status = status if isinstance(status, str) else None
        self.reason = reason if isinstance(reason, str) else None
        if isinstance(last_seq, int) and not isinstance(last_seq, bool):
            self.last_seq = last_seq

    async def read_to_end(self) -> None:
        """After ``session.ended``, read on to ``trioserve.turn.end`` (for status and reason).

        The server sends it right after the turn's last event, so this is
        quick (bound it with a timeout all the same); any error ends it
        silently.  Does nothing unless ``session.ended`` was yielded and the
        iteration is not over yet.
        """
        if not self._saw_end or self._finished:
            return
        try:
            async for _ in self:
                pass
        except TrioserveClientError:
            pass


def closed_error(reason: CloseReason | None) -> TrioserveClientError:
    """The exception for a WebSocket closed before the end of what it was delivering."""
    if reason is None:
        return StreamInterrupted("the WebSocket connection was closed")
    error = from_close(reason.code, reason.reason)
    if error is not None:
        return error
    detail = f": {reason.reason}" if reason.reason else ""
    return StreamInterrupted(
        f"the WebSocket connection closed with code {reason.code} ({reason.name}){detail} "
        "before the end of the stream",
        close_code=reason.code,
    )
