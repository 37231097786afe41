"""A Trio-native client for trioserve (see docs/client.md).

::

    from trioserve.client import Client, SessionBusyError

    async with Client("http://127.0.0.1:8080") as client:
        session = await client.create_session({"name": "Ada"})
        async with client.turn(session.id, "hi", transport="websocket") as events:
            async for event in events:
                print(event.type, event.data)
        # Later, or from another process: the session's log, re-opened if cut.
        async with client.events(session.id, after=0) as events:
            async for event in events:
                print(event.seq, event.type)

HTTP and SSE go through ``httpx.AsyncClient``, WebSocket through
trio-websocket.  Results are typed (``Session``, ``Turn``, ``Event``);
refusals raise ``APIError`` subclasses carrying ``code``, ``reason``,
``message`` and ``retry_after``; see ``Client`` for what is guaranteed under
cancellation.
"""

from trioserve.client.core import Client
from trioserve.client.errors import (
    APIError,
    BadRequestError,
    ConnectError,
    CursorExpiredError,
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
    UnauthorizedError,
)
from trioserve.client.log import LogStream, Reconnect
from trioserve.client.models import Event, Session, SessionPage, Turn
from trioserve.client.sse import ServerSentEvent, SSEParser
from trioserve.client.turns import EventStream, Transport, TurnStream
from trioserve.protocol import OnDisconnect

__all__ = [
    "APIError",
    "BadRequestError",
    "Client",
    "ConnectError",
    "CursorExpiredError",
    "DrainingError",
    "Event",
    "EventStream",
    "LogStream",
    "NotFoundError",
    "OnDisconnect",
    "PayloadTooLargeError",
    "ProtocolError",
    "RateLimitedError",
    "Reconnect",
    "RequestTimeout",
    "SSEParser",
    "ServerError",
    "ServerSentEvent",
    "Session",
    "SessionBusyError",
    "SessionPage",
    "StreamInterrupted",
    "Transport",
    "TransportError",
    "TrioserveClientError",
    "Turn",
    "TurnStream",
    "UnauthorizedError",
]
