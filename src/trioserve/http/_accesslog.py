"""One access line per request (and per WebSocket), from an ASGI middleware.

The middleware wraps the app: it sees the status and every byte of the
response as hypercorn is handed them, so a streamed response (SSE) is
logged when its stream ends, with its whole length and duration.  What only
the app knows -- the route's template (``/v1/sessions/<session_id>``, never
the raw path), the tenant -- is read from the app's request and ``g``,
which the first ``before_request`` hook leaves in the ASGI scope; a request
that matched no route has the route ``unmatched``.

The line (logger ``trioserve.access``, info)::

    request method=GET route=/v1/sessions/<session_id> path=/v1/sessions/s_… status=200
    duration_ms=1.2 bytes=312 tenant=none turn=none

``turn`` is the ``Trioserve-Turn-Id`` of the response (a started turn).
A WebSocket's line is written when it closes: method ``WEBSOCKET``,
status ``101`` once accepted (or the refusal's status), ``bytes`` sent.
A request whose client left before any response began (it closed the
connection mid-body, or while its request was being handled) has the
status ``499`` (nginx's "client closed request"), never ``500``: the
application ends without answering because it was told the client left,
which the middleware sees go by (``http.disconnect``).  ``500`` is for an
application that ended without answering on its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from quart import g, has_websocket_context, request, websocket
from quart_trio import QuartTrio

from trioserve.observe import log_fields

log = logging.getLogger("trioserve.access")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: Where the ``Exchange`` of a request lives in its ASGI scope.
SCOPE_KEY: Final = "trioserve.exchange"
UNMATCHED: Final = "unmatched"
#: The status logged for a request whose client left before it was answered (nginx's).
CLIENT_CLOSED: Final = 499
_DISCONNECT: Final = frozenset({"http.disconnect", "websocket.disconnect"})
_TURN_HEADER: Final = b"trioserve-turn-id"
_CONTENT_TYPE: Final = b"content-type"
_SSE: Final = b"text/event-stream"


@dataclass(slots=True)
class Exchange:
    """One request (or WebSocket) as the middleware and the app saw it."""

    method: str
    path: str
    started: float
    websocket: bool = False
    route: str = UNMATCHED
    status: int = 0
    bytes: int = 0
    tenant: str | None = None
    turn: str | None = None
    stream: bool = False  # an SSE response (or an accepted WebSocket)
    client_left: bool = False  # the application was told the client left
    duration: float = 0.0
    connection: Any = None  # the app's request (or websocket), for its route
    globals: Any = None  # the app's ``g``, for the tenant

    def settle(self, now: float) -> None:
        """Fill in what the app knew: the route's template, the tenant; the duration."""
        self.duration = now - self.started
        rule = getattr(self.connection, "url_rule", None)
        if rule is not None:
            self.route = rule.rule
        if self.globals is not None:
            self.tenant = self.globals.get("tenant")


class Observer(Protocol):
    """Told when a response starts streaming and when each exchange ends (metrics)."""

    def stream_opened(self, exchange: Exchange) -> None:
        """An SSE response or an accepted WebSocket began."""

    def stream_closed(self, exchange: Exchange) -> None:
        """It ended (called before ``ended``)."""

    def ended(self, exchange: Exchange) -> None:
        """The exchange is over; its fields are final."""


class _Nobody:
    def stream_opened(self, exchange: Exchange) -> None:
        pass

    def stream_closed(self, exchange: Exchange) -> None:
        pass

    def ended(self, exchange: Exchange) -> None:
        pass


def install(app: QuartTrio, observer: Observer | None = None) -> None:
    """Log every request of ``app`` (and tell ``observer``)."""

    async def note() -> None:
        # First of the before hooks, so it runs whatever a later one answers.
        target = websocket if has_websocket_context() else request
        exchange = target.scope.get(SCOPE_KEY)
        if isinstance(exchange, Exchange):
            exchange.connection = target._get_current_object()  # type: ignore[union-attr]
            exchange.globals = g._get_current_object()

    app.before_request_funcs.setdefault(None, []).insert(0, note)
    app.before_websocket_funcs.setdefault(None, []).insert(0, note)
    app.asgi_app = _middleware(app.asgi_app, observer or _Nobody())  # type: ignore[method-assign]


def _middleware(inner: Any, observer: Observer) -> Any:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await inner(scope, receive, send)
            return
        is_ws = kind == "websocket"
        exchange = Exchange(
            "WEBSOCKET" if is_ws else str(scope.get("method", "")),
            str(scope.get("path", "")),
            time.perf_counter(),
            websocket=is_ws,
        )
        scope[SCOPE_KEY] = exchange

        async def watch(message: Message) -> None:
            kind = message["type"]
            if kind == "http.response.body" or kind == "websocket.http.response.body":
                exchange.bytes += len(message.get("body", b""))
            elif kind == "websocket.send":
                data = message.get("bytes") or message.get("text") or b""
                exchange.bytes += len(data)
            elif kind == "http.response.start" or kind == "websocket.http.response.start":
                exchange.status = int(message["status"])
                for name, value in message.get("headers", ()):
                    name = name.lower()
                    if name == _TURN_HEADER:
                        exchange.turn = value.decode("latin-1")
                    elif name == _CONTENT_TYPE and value.startswith(_SSE) and not is_ws:
                        exchange.stream = True
                if exchange.stream:
                    observer.stream_opened(exchange)
            elif kind == "websocket.accept":
                exchange.status = 101
                exchange.stream = True
                observer.stream_opened(exchange)
            elif kind == "websocket.close" and not exchange.status:
                exchange.status = 403  # closed before accepting: a 403 to the client
            await send(message)

        async def listen() -> Message:
            message = await receive()
            if message["type"] in _DISCONNECT:
                exchange.client_left = True
            return message

        try:
            await inner(scope, listen, watch)
        finally:
            exchange.settle(time.perf_counter())
            if exchange.stream:
                observer.stream_closed(exchange)
            if not exchange.status:  # the app ended without answering
                exchange.status = CLIENT_CLOSED if exchange.client_left else 500
            observer.ended(exchange)
            _log(exchange)

    return app


def _log(exchange: Exchange) -> None:
    log_fields(
        log,
        "request",
        {
            "method": exchange.method,
            "route": exchange.route,
            "path": exchange.path,
            "status": exchange.status,
            "duration_ms": round(exchange.duration * 1000, 1),
            "bytes": exchange.bytes,
            "tenant": exchange.tenant,
            "turn": exchange.turn,
        },
    )
