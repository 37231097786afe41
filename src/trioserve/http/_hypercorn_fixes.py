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
"""

from __future__ import annotations

import logging
import re
import sys
from http import HTTPStatus
from time import time
from typing import Any, Final

import h11
import trio
from hypercorn.events import Closed
from hypercorn.protocol.events import Body, EndBody, Response, StreamClosed
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.protocol.http_stream import ASGIHTTPState, HTTPStream
from hypercorn.protocol.ws_stream import FrameTooLargeError, WSStream
from wsproto.connection import ConnectionState
from wsproto.events import CloseConnection, Message, Ping
from wsproto.frame_protocol import CloseReason

from trioserve.protocol import ErrorDetail, ErrorEnvelope

log = logging.getLogger("trioserve.http")

#: How long finishing a response may take once its last byte is written.
RECYCLE_DEADLINE: Final = 5.0
_MESSAGE_MAX: Final = 200  # characters of h11's own description of a bad request
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
            await self.send(StreamClosed(stream_id=self.stream_id))


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
        message = _head_too_large(self.config.h11_max_incomplete_size)
    elif isinstance(error, h11.RemoteProtocolError):
        detail = _BYTEARRAY.sub(r"\1", str(error))[:_MESSAGE_MAX]
        message = f"malformed HTTP/1.1 request: {detail}"
    else:
        message = "malformed HTTP/1.1 request"
    await _refuse(self, status_code, reason_for(status_code), message)


def _head_too_large(limit: int) -> str:
    return f"request head (request line and headers) larger than {limit} bytes"


async def _refuse(self: Any, status_code: int, reason: str, message: str) -> None:
    body = envelope(status_code, reason, message)
    headers = error_headers(body) + list(self.config.response_headers("h11"))
    phrase = HTTPStatus(status_code).phrase.encode()
    await self._send_h11_event(
        h11.Response(status_code=status_code, headers=headers, reason=phrase)
    )
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


def head_size(request: h11.Request) -> int:
    """The bytes of ``request``'s head as h11 parsed it (without optional whitespace)."""
    line = len(request.method) + len(request.target) + len(request.http_version) + 9
    fields = sum(len(name) + len(value) + 3 for name, value in request.headers.raw_items())
    return line + fields + 2


async def _create_stream(self: Any, request: h11.Request) -> None:
    names = {name.lower() for name, _ in request.headers}
    limit = self.config.h11_max_incomplete_size
    if head_size(request) > limit:
        await _refuse(self, 431, reason_for(431), _head_too_large(limit))
    elif b"content-length" in names and b"transfer-encoding" in names:
        await _refuse(
            self,
            400,
            "bad_request",
            "a request may not have both Content-Length and Transfer-Encoding",
        )
    else:
        await _create_stream_unchecked(self, request)
        return
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


def apply() -> None:
    """Install the fixes (idempotent)."""
    WSStream._handle_events = _handle_events  # type: ignore[method-assign]
    H11Protocol._maybe_recycle = _maybe_recycle  # type: ignore[method-assign]
    H11Protocol._send_error_response = _send_error_response  # type: ignore[method-assign]
    H11Protocol._create_stream = _create_stream  # type: ignore[method-assign]
    H11Protocol._check_protocol = _check_protocol  # type: ignore[method-assign]
    HTTPStream._send_error_response = _stream_error_response  # type: ignore[method-assign]
    H11Protocol._send_h11_event = _send_with_reason  # type: ignore[method-assign]
