"""Streams of events, as flows: a turn's, over SSE or over WebSocket.

``EventStream`` is the state shared by what ``turn()`` yields and what
``events()`` yields (``log.LogReader``): the last event, its seq, whether
the iteration is over.  Its ``step`` flow delivers the next event; the
async and the blocking clients iterate by running it (``aio.TurnStream``,
``blocking.SyncTurnStream``).  The two transports differ in how a turn's
end is seen:

- SSE: the stream ends (EOF) after ``session.ended``, or after the ``error``
  that explains why the adapter stopped without one.  EOF after any other
  event is a cut stream: ``StreamInterrupted``.  The EOF also says the
  server has freed the session; leaving after the last event waits for it.
  The turn's id is the ``Trioserve-Turn-Id`` response header.
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
from typing import Any, Generic, Literal, TypeVar

import httpx

from trioserve.client.effects import Body, CloseResponse, Flow, NextChunk
from trioserve.client.errors import (
    ProtocolError,
    StreamInterrupted,
    TrioserveClientError,
    from_error_object,
)
from trioserve.client.models import Event
from trioserve.client.sse import SSEParser
from trioserve.client.websocket import WebSocket
from trioserve.protocol import (
    CONTROL_ERROR,
    CONTROL_PREFIX,
    ERROR,
    RESUME_END,
    SESSION_ENDED,
    TURN_END,
    TURN_ID_HEADER,
    TURN_QUEUED,
)

Transport = Literal["sse", "websocket"]
#: The driver running a stream's flows (``AsyncDriver``, ``SyncDriver``); only kept here.
D = TypeVar("D")


class EventStream(Generic[D]):
    """Events in order; ``async for`` (``Client``) or ``for`` (``SyncClient``) over it.

    Iteration raises ``ProtocolError`` for something that is not an event,
    ``StreamInterrupted`` when the stream is cut before its end, and over
    WebSocket the ``APIError`` a close code stands for; after an exception
    the iteration is over.  Each step is a plain cancellable wait: see the
    subclasses for what a cancelled one leaves behind.
    """

    def __init__(self, driver: D, session_id: str, transport: Transport) -> None:
        self._driver = driver
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

    def step(self) -> Flow[Event | None]:
        """The next event, or ``None`` at the end of the iteration."""
        if self._finished:
            return None
        try:
            event = yield from self._receive()
        except TrioserveClientError:
            self._finished = True
            raise
        if event is None:
            self._finished = True
            return None
        self.last_event = event
        if event.seq is not None:
            self.last_seq = event.seq
        if self._is_last(event):
            self._finished = True
        return event

    def _receive(self) -> Flow[Event | None]:
        raise NotImplementedError

    def _is_last(self, event: Event) -> bool:
        return False


class SSESource:
    """The events of a ``text/event-stream`` response, one by one.

    ``next`` returns ``None`` at the end of the stream (a clean EOF) and
    raises ``StreamInterrupted`` when the response breaks (the connection
    dropped, the chunked body was cut, a read timed out).  A read cancelled
    half-way leaves the response unreadable (httpx closes its connection):
    ``cancelled`` is then True and the next ``next`` raises
    ``StreamInterrupted``.
    """

    def __init__(self, body: Body) -> None:
        self.body = body
        self._parser = SSEParser()
        self._ready: deque[Event] = deque()
        #: The stream reached its end, cleanly or not.
        self.eof = False
        #: A read was cancelled (or interrupted): the response cannot be read on.
        self.cancelled = False

    def next(self) -> Flow[Event | None]:
        while not self._ready:
            if self.eof:
                return None
            chunk = yield from self._chunk()
            if not chunk:
                self.eof = True
                self._parser.close()
                return None
            for frame in self._parser.feed(chunk):
                self._ready.append(Event.parse(frame.data, last_event_id=frame.last_event_id))
        return self._ready.popleft()

    def read_to_end(self) -> Flow[None]:
        """Read and drop the rest of the stream; a broken one ends it too."""
        try:
            while not self.eof and (yield from self._chunk()):
                pass
        except StreamInterrupted:
            pass
        self.eof = True

    def _chunk(self) -> Flow[bytes]:
        if self.cancelled:
            raise StreamInterrupted("the stream was closed by a cancelled read")
        try:
            chunk: bytes = yield NextChunk(self.body)
        except httpx.HTTPError as exc:
            self.eof = True
            raise StreamInterrupted(f"the stream broke: {exc or type(exc).__name__}") from exc
        except BaseException:
            self.cancelled = True
            raise
        return chunk

    def close(self) -> Flow[None]:
        """Close the response (its connection is not reused unless it was read to the end)."""
        yield CloseResponse(self.body)


class WSChannel:
    """trioserve's messages over a WebSocket: events, and the control messages that matter.

    ``next`` returns an ``Event``, or a ``trioserve.turn.end`` /
    ``trioserve.resume.end`` message as a dict.  A ``trioserve.error``
    raises the ``APIError`` it carries; ``trioserve.pong`` and control
    messages of a later server are skipped; a close raises what its code
    stands for.  A cancelled ``next`` loses nothing.
    """

    cancelled = False

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws
        self._first: Event | dict[str, Any] | None = None

    def send(self, message: dict[str, Any]) -> Flow[None]:
        yield from self.ws.send(json.dumps(message))

    def request(self, message: dict[str, Any]) -> Flow[None]:
        """Send ``message`` and wait for the first reply (kept for ``next``): a refusal raises."""
        yield from self.send(message)
        self._first = yield from self.next()

    def next(self) -> Flow[Event | dict[str, Any]]:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        while True:
            message = yield from self.ws.receive()
            if message is None:
                raise self.ws.closed_error()
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
                if kind == TURN_QUEUED:  # an enqueued turn's first event
                    return Event.from_json(value, message)
                continue  # trioserve.pong, or a control message of a later server
            return Event.from_json(value, message)

    def close(self) -> Flow[None]:
        yield from self.ws.close()


class TurnReader(EventStream[D]):
    """The events of one turn, in order: what ``turn()`` yields.

    Iteration stops after the turn's last event: over SSE after
    ``session.ended`` (or the ``error`` that ended the turn without one, at
    the end of the stream), over WebSocket at ``trioserve.turn.end``.

    ``turn_id`` is the turn record's id (over SSE from the response header,
    so known on entering the block; over WebSocket from
    ``trioserve.turn.end``, so known once the iteration is over).  Over
    WebSocket ``status`` and ``reason`` are the record's final ones
    (``completed``/``completed``, ``failed``/``adapter_exit``, …) once the
    iteration is over; over SSE they stay ``None``: read the record with
    ``get_turn(session_id, turn_id)``.

    A cancelled step loses nothing over WebSocket; over SSE the response's
    connection is closed by the cancellation, so the next step raises
    ``StreamInterrupted``.  Either way the stream should then be left (the
    block of ``turn()``).
    """

    def __init__(
        self,
        driver: D,
        session_id: str,
        source: SSESource | WSChannel,
        cancel: Flow[None] | None = None,
    ) -> None:
        transport: Transport = "sse" if isinstance(source, SSESource) else "websocket"
        super().__init__(driver, session_id, transport)
        self._source = source
        self._cancel = cancel
        self._saw_end = False
        self.turn_id: str | None = None
        self.status: str | None = None
        self.reason: str | None = None
        if isinstance(source, SSESource):
            self.turn_id = source.body.response.headers.get(TURN_ID_HEADER) or None

    def _receive(self) -> Flow[Event | None]:
        source = self._source
        if isinstance(source, SSESource):
            event = yield from source.next()
            if event is None:
                last = self.last_event.type if self.last_event else None
                if last not in (SESSION_ENDED, ERROR):
                    raise StreamInterrupted(
                        "the turn's stream ended before its last event (the server went away?)"
                    )
            elif event.is_end:
                self._saw_end = True
            return event
        while True:
            item = yield from source.next()
            if isinstance(item, Event):
                self._saw_end = self._saw_end or item.is_end
                return item
            if item.get("type") == TURN_END:
                self._turn_end(item)
                return None
            # A stray resume.end: this connection runs no resume; skip it.

    def _is_last(self, event: Event) -> bool:
        return self.transport == "sse" and event.is_end

    def _turn_end(self, message: dict[str, Any]) -> None:
        turn_id, status = message.get("turnId"), message.get("status")
        reason, last_seq = message.get("reason"), message.get("lastSeq")
        self.turn_id = turn_id if isinstance(turn_id, str) else self.turn_id
        self.status = status if isinstance(status, str) else None
        self.reason = reason if isinstance(reason, str) else None
        if isinstance(last_seq, int) and not isinstance(last_seq, bool):
            self.last_seq = last_seq

    def leave(self, exc: BaseException | None) -> Flow[None]:
        """What leaving the block does; the stream is closed however this ends.

        After the turn's last event (``exc`` is ``None``): over SSE read the
        stream to its end, which the server sends once it has freed the
        session and the turn slot; over WebSocket read on to
        ``trioserve.turn.end`` (for ``status`` and ``reason``; any error
        ends it quietly).  On ``KeyboardInterrupt`` (Ctrl-C) before the
        turn's end, first ask the server to cancel the turn, as ``trioserve
        chat`` does (also a turn that runs with ``on_disconnect="continue"``).
        Otherwise just close: the server cancels a turn whose client left,
        unless it runs with ``on_disconnect="continue"``.
        """
        source = self._source
        try:
            if exc is None and self._saw_end:
                if isinstance(source, SSESource):
                    yield from source.read_to_end()
                elif not self._finished:
                    try:
                        while (yield from self.step()) is not None:
                            pass
                    except TrioserveClientError:
                        pass
            elif isinstance(exc, KeyboardInterrupt) and not self._saw_end:
                yield from self._cancel_quietly()
        finally:
            yield from source.close()

    def _cancel_quietly(self) -> Flow[None]:
        try:
            if isinstance(self._source, WSChannel):
                yield from self._source.send({"type": "cancel"})
            elif self._cancel is not None:
                yield from self._cancel
        except TrioserveClientError:
            pass  # the turn had ended, or the server is gone: closing is all there is to do
