"""Fixes for hypercorn (0.17-0.19) under quart-trio that trioserve relies on.

**A WebSocket message over the limit left the connection open.**  When a
client sends a WebSocket message over ``websocket_max_message_size``,
hypercorn sends the close frame 1009 but then stops reading the events of
that chunk and never clears its message buffer: every later frame raises
the same error again, so the client's closing handshake is never read.
The TCP connection stays open until the client gives up (trio-websocket
never does), and the application is never told the socket is gone.
``WSStream._handle_events`` is replaced with the same loop, except that
once a close frame has been sent, further data frames are dropped and the
loop carries on, so the client's close is answered and the connection ends
as after any other close.

**A closed WebSocket held its connection for up to the ping interval.**
hypercorn's ping task (``WSStream._send_pings``, every
``websocket_ping_interval``: ``--heartbeat``) checks whether the socket
is closed only when it wakes, and the connection's task group waits for it:
the connection, gone from the network, still counted against
``--max-connections`` and ``--max-connections-per-ip`` for up to 15 s.  The
ping loop now runs in a cancel scope that is cancelled as soon as the
stream closes.

**A WebSocket message wsproto could not parse ended the connection without a
close frame** (a text message that is not UTF-8, a malformed frame): the
client saw the connection drop instead of close 1007 (or 1002).  The close
frame with wsproto's code and reason is now sent first.

**Frames sent right after a WebSocket handshake were a bare 400 and a
traceback.**  A client that sends its first frames in the same packet as its
handshake, or before the ``101`` reaches it, had them handed to the stream
before the application accepted: hypercorn answered ``400`` while the
application was accepting, whose ``101`` then failed in h11 (a traceback in
the log). Such frames are now kept (up to ``websocket_max_message_size``)
and read once the handshake is accepted, as if they had come after it.

**HTTP/1.1 connections were never closed** (not after ``Connection:
close``, not after the keep-alive timeout).  hypercorn finishes a response
inside the application's task: the last ``send`` of the body ends in
``H11Protocol._maybe_recycle``, which first tells the application the
request is over (``http.disconnect``) and only then either closes the
connection (``Closed``) or re-arms the keep-alive timer
(``Updated(idle=True)``).  quart-trio cancels its request nursery -- the
task that is still inside that ``send`` -- as soon as it receives
``http.disconnect``, so the next checkpoint in ``_maybe_recycle`` raises
``Cancelled``: the socket is neither closed nor given an idle timer, and
stays open until the client leaves.  ``_maybe_recycle`` now runs shielded
(with its own deadline: it only writes to a buffered channel and closes or
re-arms), so it always completes; should it ever overrun, the connection is
closed.

**Refusals from the protocol layer had no body.**  Requests h11 cannot
parse (a malformed request line or header: 400; a request head over
``h11_max_incomplete_size``: 431; a transfer coding other than chunked: 501)
and the 500 hypercorn sends when the application ends without a response
were empty.  They now carry trioserve's JSON envelope
``{"error":{"code","reason","message"}}``, with ``Connection: close``.

**Request heads are checked before the application sees them**
(``_strict.py`` has the rules: methods, ``Host``, ``Authorization``,
obs-fold, chunk sizes), and the refusal is sent from here (without its
body for a ``HEAD``, whose answer has none: sending it failed in h11, a
traceback).

**A request head over the limit was accepted if it arrived complete.**  h11
checks ``h11_max_incomplete_size`` (64 KiB) only while the head is still
incomplete: a 70,000-byte head that came in two reads, the second one
completing it, was parsed and served.  The complete head is now measured
too (request line and header lines as parsed), and one over the limit is
refused with the same ``431`` and the connection closed.

**Content-Length together with Transfer-Encoding was accepted** (h11 lets
the transfer coding win, RFC 9112 §6.3), and the connection kept: behind a
proxy that frames by Content-Length, the rest of the body is a smuggled
request.  Such a request is now refused with 400 ``bad_request`` before the
application sees it, and the connection is closed (RFC 9112 §6.1).

**Status lines had no reason phrase** (``HTTP/1.1 200 ``); the reference
(Go's ``net/http``) sends ``HTTP/1.1 200 OK``.  Both are valid HTTP, but a
probe or a script matching the status line would tell them apart: every
HTTP/1.1 response now carries the standard phrase.

**HTTP/2 over cleartext is off.**  hypercorn switches an HTTP/1.1
connection to HTTP/2 on ``Upgrade: h2c`` or the HTTP/2 preface.  Every
guarantee above (and the caps in ``connections.py``) is made for HTTP/1.1,
the reference server (Go's ``net/http`` without TLS) speaks only HTTP/1.1,
and no trioserve client uses HTTP/2; so the upgrade header is ignored (as
RFC 9110 allows) and a preface is just a request for an unknown route.

**Each request message took a trip to the scheduler.**  The connection
hands a request's body and its end to the application over a memory
channel, and trio's ``send`` and ``receive`` yield even when they need not
wait: two passes of the scheduler a request on the connection's side, more
on the application's.  ``TaskGroup.spawn_app`` now gives both ends a call
that does not wait when it need not (``send_nowait``, ``receive_nowait``)
and waits as before when the channel is full or empty.  It also marks the
request's scope once ``http.disconnect`` is handed over (``DISCONNECT_SENT``):
``_request_task`` then lets the request's tasks end without a cancellation.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from time import time
from typing import Any, Final, cast

import h11
import trio
from hypercorn.config import Config
from hypercorn.events import Closed
from hypercorn.protocol.events import Body, Data, EndBody, Response, StreamClosed
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.protocol.http_stream import ASGIHTTPState, HTTPStream
from hypercorn.protocol.ws_stream import FrameTooLargeError, WSStream
from hypercorn.trio.task_group import TaskGroup, _handle
from hypercorn.typing import AppWrapper, ASGIReceiveEvent, ASGISendEvent, Scope
from wsproto.connection import ConnectionState
from wsproto.events import CloseConnection, Message, Ping
from wsproto.frame_protocol import CloseReason

from trioserve.http import _h11_writes as h11_writes
from trioserve.http import _strict as strict
from trioserve.http import _ws_batch as ws_batch
from trioserve.protocol import ErrorDetail, ErrorEnvelope

log = logging.getLogger("trioserve.http")

#: The scope's key set once ``http.disconnect`` is on its way to the application
#: (``_request_task``: a response that ends with it needs no cancellation).
DISCONNECT_SENT: Final = "trioserve.disconnect_sent"
#: How long finishing a response may take once its last byte is written.
RECYCLE_DEADLINE: Final = 5.0
_MESSAGE_MAX: Final = 200  # characters of h11's own description of a bad request
_MAX_CLOSE_REASON: Final = 123  # bytes (RFC 6455 §5.5)
_BYTEARRAY: Final = re.compile(r"bytearray\((b'.*?'|b\".*?\")\)")


def envelope(code: int, reason: str, message: str) -> bytes:
    """The JSON error envelope as a response body."""
    detail = ErrorDetail(code=code, reason=reason, message=message)
    return ErrorEnvelope(error=detail).model_dump_json(exclude_none=True).encode() + b"\n"


def reason_for(code: int) -> str:
    """The envelope's ``reason`` for a refusal made below the application."""
    reasons = {400: "bad_request", 431: "headers_too_large", 500: "internal"}
    if code in reasons:
        return reasons[code]
    try:
        return HTTPStatus(code).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        return "bad_request"


def error_headers(body: bytes) -> list[tuple[bytes, bytes]]:
    return [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]


# -- the WebSocket 1009 fix --------------------------------------------------


async def _handle_events(self: Any) -> None:
    for event in self.connection.events():
        if isinstance(event, Message):
            if self.connection.state is not ConnectionState.OPEN:
                continue  # we sent a close: the rest of the message is dropped
            try:
                self.buffer.extend(event)
            except FrameTooLargeError:
                self.buffer.clear()
                await self._send_wsproto_event(CloseConnection(code=CloseReason.MESSAGE_TOO_BIG))
                continue
            if event.message_finished:
                await self.app_put(self.buffer.to_message())
                self.buffer.clear()
        elif isinstance(event, Ping):
            await self._send_wsproto_event(event.response())
        elif isinstance(event, CloseConnection):
            if self.connection.state == ConnectionState.REMOTE_CLOSING:
                await self._send_wsproto_event(event.response())
            elif self.connection.state == ConnectionState.OPEN:
                # Not the client's close: wsproto could not parse what it sent (text
                # that is not UTF-8: 1007; a bad frame: 1002).  Say so before closing.
                reason = (event.reason or "").encode()[:_MAX_CLOSE_REASON].decode(errors="ignore")
                await self._send_wsproto_event(CloseConnection(event.code, reason))
            await self.send(StreamClosed(stream_id=self.stream_id))


_ws_handle = WSStream.handle


async def _send_pings(self: Any) -> None:
    """``WSStream._send_pings``, ended as soon as the stream closes."""
    self.pinging = trio.CancelScope()
    with self.pinging:
        while not self.closed:
            await self._send_wsproto_event(Ping())
            await trio.sleep(self.config.websocket_ping_interval)


async def _ws_handle_then_stop_pings(self: Any, event: Any) -> None:
    if _keep_early(self, event):
        return
    await _ws_handle(self, event)
    pinging = getattr(self, "pinging", None)
    if self.closed and pinging is not None:
        pinging.cancel()


def _keep_early(self: Any, event: Any) -> bool:
    """Keep data that came before the handshake was accepted (see the module doc)."""
    if not isinstance(event, Body | Data) or self.closed or self.handshake.accepted:
        return False
    early: bytearray = getattr(self, "early", bytearray())
    if len(early) + len(event.data) > self.config.websocket_max_message_size:
        return False  # hypercorn's 400: nothing is accepted yet that could take it
    early.extend(event.data)
    self.early = early
    return True


_ws_accept = WSStream._accept


async def _accept_then_read_early(self: Any, message: Any) -> None:
    await _ws_accept(self, message)
    early: bytearray | None = getattr(self, "early", None)
    if early:
        self.early = bytearray()
        self.connection.receive_data(bytes(early))
        await self._handle_events()


# -- closing connections -----------------------------------------------------

_maybe_recycle_unshielded = H11Protocol._maybe_recycle


async def _maybe_recycle(self: Any) -> None:
    with trio.CancelScope(shield=True, deadline=trio.current_time() + RECYCLE_DEADLINE) as scope:
        await _maybe_recycle_unshielded(self)
    if scope.cancelled_caught:
        log.warning("finishing a response took over %ss: closing its connection", RECYCLE_DEADLINE)
        with trio.CancelScope(shield=True, deadline=trio.current_time() + RECYCLE_DEADLINE):
            await self.send(Closed())


# -- refusals below the application ------------------------------------------


async def _send_error_response(self: Any, status_code: int) -> None:
    # Called from H11Protocol._handle_events while it handles h11's
    # RemoteProtocolError, which is therefore the exception being handled.
    error = sys.exception()
    if status_code == 431:
        message = strict.head_too_large(self.config.h11_max_incomplete_size)
    elif isinstance(error, h11.RemoteProtocolError):
        detail = _BYTEARRAY.sub(r"\1", str(error))[:_MESSAGE_MAX]
        message = f"malformed HTTP/1.1 request: {detail}"
    else:
        message = "malformed HTTP/1.1 request"
    await _refuse(self, status_code, reason_for(status_code), message)


async def _refuse(
    self: Any, status_code: int, reason: str, message: str, *, head: bool = False
) -> None:
    """Send the envelope (only its head for a ``HEAD`` request: h11 refuses a body there)."""
    # h11 knows the request's method once it has parsed the request line.
    head = head or getattr(self.connection, "_request_method", None) == b"HEAD"
    body = envelope(status_code, reason, message)
    headers = error_headers(body) + list(self.config.response_headers("h11"))
    phrase = HTTPStatus(status_code).phrase.encode()
    await self._send_h11_event(
        h11.Response(status_code=status_code, headers=headers, reason=phrase)
    )
    if not head:
        await self._send_h11_event(h11.Data(data=body))
    await self._send_h11_event(h11.EndOfMessage())


async def _stream_error_response(self: Any, status_code: int) -> None:
    """``HTTPStream._send_error_response`` with the envelope as its body."""
    message = "internal server error" if status_code == 500 else HTTPStatus(status_code).phrase
    body = envelope(status_code, reason_for(status_code), message)
    await self.send(
        Response(stream_id=self.stream_id, headers=error_headers(body), status_code=status_code)
    )
    await self.send(Body(stream_id=self.stream_id, data=body))
    await self.send(EndBody(stream_id=self.stream_id))
    self.state = ASGIHTTPState.CLOSED
    await self.config.log.access(
        self.scope, {"status": status_code, "headers": []}, time() - self.start_time
    )


# -- request framing ----------------------------------------------------------

_create_stream_unchecked = H11Protocol._create_stream


async def _create_stream(self: Any, request: h11.Request) -> None:
    problem = strict.head_problem(request, self.config.h11_max_incomplete_size)
    if problem is None:
        await _create_stream_unchecked(self, request)
        return
    await _refuse(self, *problem, head=request.method == b"HEAD")
    await self.send(Closed())


async def _check_protocol(self: Any, event: h11.Request) -> None:
    """No switch to HTTP/2 (see the module doc)."""


# -- status lines ---------------------------------------------------------------

_send_h11_event = H11Protocol._send_h11_event


_PHRASES: Final = {status.value: status.phrase.encode() for status in HTTPStatus}
_RESPONSES: Final = (h11.Response, h11.InformationalResponse)


async def _send_with_reason(self: Any, event: Any) -> None:
    if isinstance(event, _RESPONSES) and not event.reason:
        # The event was just made for this response and is no one else's: set the
        # phrase in place (dataclasses.replace would build it again, ~10 µs).
        # A status code with no standard phrase keeps none.
        object.__setattr__(event, "reason", _PHRASES.get(event.status_code, b""))
    await _send_h11_event(self, event)


# -- the application's channel --------------------------------------------------


async def _spawn_app(
    self: TaskGroup,
    app: AppWrapper,
    config: Config,
    scope: Scope,
    send: Callable[[ASGISendEvent | None], Awaitable[None]],
) -> Callable[[ASGIReceiveEvent], Awaitable[None]]:
    """hypercorn's ``spawn_app``, with calls that do not yield when they need not wait
    (see the module doc)."""
    put, get = trio.open_memory_channel[ASGIReceiveEvent](config.max_app_queue_size)

    async def receive() -> ASGIReceiveEvent:
        try:
            return get.receive_nowait()
        except trio.WouldBlock:
            return await get.receive()

    async def app_put(message: ASGIReceiveEvent) -> None:
        if message["type"] == "http.disconnect":
            cast(dict[str, Any], scope)[DISCONNECT_SENT] = True
        try:
            put.send_nowait(message)
        except trio.WouldBlock:
            await put.send(message)

    nursery = self._nursery
    assert nursery is not None
    run_sync, from_thread = trio.to_thread.run_sync, trio.from_thread.run
    nursery.start_soon(_handle, app, config, scope, receive, send, run_sync, from_thread)
    return app_put


def apply() -> None:
    """Install the fixes (idempotent), and the faster writes of ``_h11_writes``."""
    h11_writes.apply()
    WSStream._handle_events = _handle_events  # type: ignore[method-assign]
    WSStream._send_pings = _send_pings  # type: ignore[method-assign]
    WSStream.handle = _ws_handle_then_stop_pings  # type: ignore[method-assign]
    WSStream._accept = _accept_then_read_early  # type: ignore[method-assign]
    H11Protocol._maybe_recycle = _maybe_recycle  # type: ignore[method-assign]
    H11Protocol._send_error_response = _send_error_response  # type: ignore[method-assign]
    H11Protocol._create_stream = _create_stream  # type: ignore[method-assign]
    H11Protocol._check_protocol = _check_protocol  # type: ignore[method-assign]
    HTTPStream._send_error_response = _stream_error_response  # type: ignore[method-assign]
    H11Protocol._send_h11_event = _send_with_reason  # type: ignore[method-assign]
    TaskGroup.spawn_app = _spawn_app  # type: ignore[method-assign]
    strict.apply()
    ws_batch.apply()
