"""An ASGI application answering one of the app's requests: a protocol SDK's server, mounted.

A protocol whose official package serves its HTTP binding as an ASGI
application on anyio (the MCP SDK's streamable HTTP) runs under Trio as it
is; ``asgi_response`` lets a quart route hand it the request *after* the
route's guard ran (``Host``, ``Origin``, the API key and its tenant), so
the face is guarded, logged and counted like any other route.

The route reads the request body first (quart's ``MAX_CONTENT_LENGTH``
applies), then the application runs as a task in ``nursery`` (the face's,
which lives as long as the server serves) with ``receive`` giving it that
body and then, once the response is over or its client left, the
``http.disconnect`` an ASGI server sends.  Its ``http.response.start`` is
awaited and becomes the quart response's status and headers; its body
messages are the response body, streamed as they come (a bounded channel:
a client that reads slowly holds the application's ``send``).

Guarantees under cancellation: however the response ends before the
application finished it -- the client left (quart-trio cancels the
request, or the body is closed), the body was dropped unsent, or the
stream's key was revoked (``end``) -- the application's task is cancelled
and its ``receive`` answers ``http.disconnect``; ``on_close`` is called
once in every case.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

import trio
from quart import Response
from werkzeug.datastructures import Headers

log = logging.getLogger("trioserve.http")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
    Awaitable[None],
]

#: Response messages held between the application and a slow client.
_BUFFERED: Final = 16


class _Exchange:
    """One request handed to the application: its body in, its messages out."""

    def __init__(self, body: bytes) -> None:
        self.body: bytes | None = body
        self.left = trio.Event()  # the response is over, or its client left
        self.scope = trio.CancelScope()
        self.send_out, self.receive_out = trio.open_memory_channel[Message](_BUFFERED)

    async def receive(self) -> Message:
        if self.body is not None:
            body, self.body = self.body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self.left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if self.left.is_set():
            return  # the response is over: nothing more reaches anyone
        await self.send_out.send(message)

    async def run(self, app: ASGIApp, scope: Scope) -> None:
        with self.scope:
            try:
                await app(scope, self.receive, self.send)
            except Exception:  # a bug of the application: its request ends without an answer
                log.exception("%s %s failed", scope.get("method"), scope.get("path"))
            finally:
                self.send_out.close()


class ASGIBody:
    """The response body: the application's body messages, until the last one.

    ``end(reason)`` (a revoked key) stops it; see the module doc for what
    every way of ending does.
    """

    def __init__(self, exchange: _Exchange, on_close: Callable[[], None]) -> None:
        self._exchange = exchange
        self._on_close: Callable[[], None] | None = on_close
        self._complete = False

    def __aiter__(self) -> ASGIBody:
        return self

    async def __anext__(self) -> bytes:
        if self._complete or self._exchange.left.is_set():
            self._close()
            raise StopAsyncIteration
        try:
            while True:
                try:
                    message = await self._exchange.receive_out.receive()
                except trio.EndOfChannel:
                    break
                if message.get("type") != "http.response.body":
                    continue
                chunk = bytes(message.get("body", b""))
                if not message.get("more_body", False):
                    self._complete = True
                if chunk:
                    return chunk
                if self._complete:
                    break
        except BaseException:
            self._close()
            raise
        self._close()
        raise StopAsyncIteration

    def end(self, reason: str) -> None:
        """End the response now (its key was revoked); the application is cancelled."""
        log.info("stream closed: %s", reason)
        self._close()

    async def aclose(self) -> None:
        self._close()

    def _close(self) -> None:
        exchange = self._exchange
        exchange.left.set()
        if not self._complete:
            exchange.scope.cancel()
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()

    def __del__(self) -> None:
        # The response was dropped without being sent (the client left first).
        with contextlib.suppress(Exception):
            self._close()


async def asgi_response(
    app: ASGIApp,
    scope: Scope,
    body: bytes,
    nursery: trio.Nursery,
    on_close: Callable[[], None] = lambda: None,
) -> tuple[Response, ASGIBody]:
    """Run ``app`` on one request (``scope``, its whole ``body``) as a task in ``nursery``.

    Returns the quart response of what the application answered, and its
    body (whose ``end`` stops it).  An application that ends without
    answering (a bug) is a ``500``.
    """
    exchange = _Exchange(body)
    nursery.start_soon(exchange.run, app, scope)
    response_body = ASGIBody(exchange, on_close)
    try:
        start: Message | None = None
        async for message in exchange.receive_out:
            if message.get("type") == "http.response.start":
                start = message
                break
    except BaseException:
        response_body._close()
        raise
    if start is None:
        response_body._close()
        raise RuntimeError(f"{scope.get('method')} {scope.get('path')}: no response")
    headers = Headers()
    for name, value in start.get("headers", ()):
        if name.lower() != b"content-length":  # the body is streamed: the server frames it
            headers.add(name.decode("latin-1"), value.decode("latin-1"))
    response = Response(response_body, status=int(start["status"]), headers=headers)
    response.timeout = None
    return response, response_body
