"""A Trio-native client for trioserve (see docs/client.md).

::

    from trioserve.client import Client, SessionBusyError

    async with Client("http://127.0.0.1:8080") as client:
        session = await client.create_session({"name": "Ada"})
        async with client.turn(session.id, "hi", transport="websocket") as events:
            async for event in events:
                print(event.type, event.data)

HTTP and SSE go through ``httpx.AsyncClient``, WebSocket through
trio-websocket.  Results are typed (``Session``, ``Event``); refusals raise
``APIError`` subclasses carrying ``code``, ``reason``, ``message`` and
``retry_after``; see ``Client`` for what is guaranteed under cancellation.
"""

from .core import Client
from .errors import (
    APIError,
    BadRequestError,
    ConnectError,
    DrainingError,
    NotFoundError,
    PayloadTooLargeError,
    ProtocolError,
    RateLimitedError,
    RequestTimeout,
    ServerError,
    SessionBusyError,
    StreamInterrupted,
    TransportError,
    TrioserveClientError,
)
from .models import Event, Session
from .sse import ServerSentEvent, SSEParser
from .turns import Transport, TurnStream

__all__ = [
    "APIError",
    "BadRequestError",
    "Client",
    "ConnectError",
    "DrainingError",
    "Event",
    "NotFoundError",
    "PayloadTooLargeError",
    "ProtocolError",
    "RateLimitedError",
    "RequestTimeout",
    "SSEParser",
    "ServerError",
    "ServerSentEvent",
    "Session",
    "SessionBusyError",
    "StreamInterrupted",
    "Transport",
    "TransportError",
    "TrioserveClientError",
    "TurnStream",
]
