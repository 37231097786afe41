"""A WebSocket client as flows: wsproto's state machine over a ``Socket`` effect.

wsproto (h11's sibling, which hypercorn and trio-websocket use too) does
the protocol: the handshake, framing, masking, UTF-8, close codes.  This
module only moves bytes between it and the driver, so the same code runs
under asyncio, Trio and blocking sockets (docs/client.md says why this
and not httpx-ws or trio-websocket).

No task or thread reads the socket in the background: bytes are read when
a message is asked for, and a ping that came meanwhile is answered then
(the server's pings, ``--heartbeat``, do not expect a prompt pong).  A
cancelled ``receive`` loses nothing: what was read is in wsproto's buffer
or ``_text``, and the next call goes on from there.
"""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass
from typing import Final

import httpx
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError
from wsproto.utilities import ProtocolError as WSProtocolError

from trioserve.client import errors
from trioserve.client.effects import CloseSocket, Connect, Flow, Receive, Socket, Write
from trioserve.client.errors import (
    ConnectError,
    PayloadTooLargeError,
    ProtocolError,
    RequestTimeout,
    StreamInterrupted,
    TrioserveClientError,
)

#: Largest message accepted from the server (an event can be up to the
#: server's ``--max-event-bytes``, 8 MiB by default).
WS_MAX_MESSAGE: Final = 64 * 1024 * 1024
#: How long leaving waits for the server's answer to our close frame.
WS_CLOSE_TIMEOUT: Final = 5.0
_MESSAGE_TOO_BIG: Final = 1009
#: The close code of a connection lost without a close frame (RFC 6455 7.1.5).
CLOSE_LOST: Final = 1006


@dataclass(frozen=True, slots=True)
class Closed:
    """How the connection was closed: the code and reason received (1006: no close frame)."""

    code: int
    reason: str


class WebSocket:
    """One open client connection: ``receive`` text messages, ``send`` them, ``close``."""

    def __init__(self, socket: Socket, ws: WSConnection, url: str, max_message: int) -> None:
        self.socket = socket
        self.url = url
        self._ws = ws
        self._max_message = max_message
        self._events: deque[Event] = deque()
        self._text: list[str] = []
        self._size = 0
        #: Set once the connection is closed (by either side).
        self.closed: Closed | None = None

    @classmethod
    def connect(
        cls,
        url: httpx.URL,
        headers: dict[str, str],
        *,
        timeout: float | None,
        max_message: int = WS_MAX_MESSAGE,
    ) -> Flow[WebSocket]:
        """Open a connection to ``url`` (``ws://`` or ``wss://``) and do the handshake.

        ``ConnectError`` (``RequestTimeout``) if the server cannot be reached
        in time; a refused handshake raises the ``APIError`` its answer holds.
        """
        tls = url.scheme == "wss"
        port = url.port or (443 if tls else 80)
        try:
            socket: Socket = yield Connect(url.host, port, tls, timeout)
        except TimeoutError:
            raise RequestTimeout(f"timed out connecting to {url}") from None
        except OSError as exc:
            raise ConnectError(f"cannot connect to {url}: {exc}") from None
        self = cls(socket, WSConnection(ConnectionType.CLIENT), str(url), max_message)
        try:
            yield from self._handshake(url, headers, timeout)
        except BaseException:
            yield CloseSocket(socket)
            raise
        return self

    def _handshake(
        self, url: httpx.URL, headers: dict[str, str], timeout: float | None
    ) -> Flow[None]:
        host = url.netloc.decode("ascii")
        target = url.raw_path.decode("ascii")
        extra = [(k.encode(), v.encode()) for k, v in headers.items()]
        request = Request(host=host, target=target, extra_headers=extra)
        yield from self._write(self._ws.send(request))
        rejected: RejectConnection | None = None
        body = b""
        while True:
            event = yield from self._next_event(timeout)
            if isinstance(event, AcceptConnection):
                return
            if isinstance(event, RejectConnection):
                rejected = event
                if not event.has_body:
                    break
            elif isinstance(event, RejectData):
                body += event.data
                if event.body_finished:
                    break
            elif isinstance(event, CloseConnection):
                raise ConnectError(f"{url}: the connection closed during the handshake")
        assert rejected is not None
        header_map = {k.decode().lower(): v.decode(errors="replace") for k, v in rejected.headers}
        raise errors.from_response(rejected.status_code, header_map, body)

    def send(self, text: str) -> Flow[None]:
        """Send one text message; the close's error if the connection is closed.

        A close frame that came in the same read as what was read last (a refusal
        sent with the handshake's answer, 4503 while the server drains) is read
        here: its code is the error, not an interrupted stream."""
        if self._ws.state is not ConnectionState.OPEN:
            if self.closed is None:
                close = next((e for e in self._events if isinstance(e, CloseConnection)), None)
                if close is not None:
                    self.closed = Closed(close.code, close.reason or "")
            raise self.closed_error()
        yield from self._write(self._ws.send(TextMessage(data=text)))

    def receive(self) -> Flow[str | None]:
        """The next text message; ``None`` once the connection is closed (see ``closed``).

        A binary message is a ``ProtocolError``; one over the size limit
        closes the connection (1009) and raises ``PayloadTooLargeError``.
        """
        while True:
            if self.closed is not None:
                return None
            event = yield from self._next_event(None)
            if isinstance(event, TextMessage):
                self._size += len(event.data)
                if self._size > self._max_message:
                    yield from self.close(_MESSAGE_TOO_BIG, "message too big")
                    raise PayloadTooLargeError(
                        413,
                        "payload_too_large",
                        f"the server sent a message over {self._max_message} bytes",
                        close_code=_MESSAGE_TOO_BIG,
                    )
                self._text.append(event.data)
                if event.message_finished:
                    text = "".join(self._text)
                    self._text.clear()
                    self._size = 0
                    return text
            elif isinstance(event, BytesMessage):
                raise ProtocolError("the server sent a binary WebSocket message")
            elif isinstance(event, Ping):
                if self._ws.state is ConnectionState.OPEN:  # else a close read with it is next
                    yield from self._write(self._ws.send(event.response()))
            elif isinstance(event, CloseConnection):
                self.closed = Closed(event.code, event.reason or "")
                if self._ws.state is ConnectionState.REMOTE_CLOSING:
                    yield from self._write_quietly(self._ws.send(event.response()))
                yield CloseSocket(self.socket)

    def close(self, code: int = 1000, reason: str = "") -> Flow[None]:
        """Send a close frame, wait (``WS_CLOSE_TIMEOUT``) for the server's, close the socket.

        Never raises for a connection that broke meanwhile; the socket is
        closed however this ends (also when it is cancelled).
        """
        try:
            if self._ws.state is ConnectionState.OPEN:
                yield from self._write_quietly(
                    self._ws.send(CloseConnection(code=code, reason=reason or None))
                )
            while self._ws.state is ConnectionState.LOCAL_CLOSING:
                try:
                    event = yield from self._next_event(WS_CLOSE_TIMEOUT)
                except TrioserveClientError:
                    break
                if isinstance(event, CloseConnection):
                    self.closed = self.closed or Closed(event.code, event.reason or "")
        finally:
            yield CloseSocket(self.socket)

    def closed_error(self) -> TrioserveClientError:
        """The exception for the connection having closed before the end of what it carried."""
        closed = self.closed
        if closed is None:
            return StreamInterrupted("the WebSocket connection was closed")
        error = errors.from_close(closed.code, closed.reason)
        if error is not None:
            return error
        detail = f": {closed.reason}" if closed.reason else ""
        return StreamInterrupted(
            f"the WebSocket connection closed with code {closed.code}{detail} "
            "before the end of the stream",
            close_code=closed.code,
        )

    def _next_event(self, timeout: float | None) -> Flow[Event]:
        while not self._events:
            try:
                data = yield Receive(self.socket, timeout)
            except TimeoutError:
                raise RequestTimeout(f"{self.url}: timed out waiting for the server") from None
            except OSError:
                data = b""  # a reset is a close without a close frame (1006), as EOF is
            try:
                self._ws.receive_data(data or None)
                self._events.extend(self._ws.events())
            except (WSProtocolError, LocalProtocolError) as exc:
                yield CloseSocket(self.socket)
                raise ProtocolError(f"{self.url}: {exc}") from None
        return self._events.popleft()

    def _write(self, data: bytes) -> Flow[None]:
        try:
            yield Write(self.socket, data, None)
        except OSError as exc:
            raise StreamInterrupted(f"{self.url}: the connection broke ({exc})") from None

    def _write_quietly(self, data: bytes) -> Flow[None]:
        with contextlib.suppress(OSError):
            yield Write(self.socket, data, WS_CLOSE_TIMEOUT)


def websocket_url(base: httpx.URL, path: str) -> httpx.URL:
    """``ws://…`` (``wss://`` for an https base URL) for ``path`` under the base URL's path."""
    scheme = "wss" if base.scheme == "https" else "ws"
    return base.copy_with(
        scheme=scheme, path=base.path.rstrip("/") + path, query=None, fragment=None
    )
