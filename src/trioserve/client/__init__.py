"""A client for trioserve: the same API under asyncio, Trio and blocking code (docs/client.md).

::

    from trioserve.client import Client, SyncClient

    async with Client("http://127.0.0.1:8080") as client:      # asyncio.run or trio.run
        session = await client.create_session({"name": "Ada"})
        async with client.turn(session.id, "hi") as events:
            async for event in events:
                print(event.type, event.data)

    with SyncClient("http://127.0.0.1:8080") as client:        # plain blocking code
        session = client.create_session({"name": "Ada"})
        with client.turn(session.id, "hi", transport="websocket") as events:
            for event in events:
                print(event.type, event.data)

Results are typed (``Session``, ``Turn``, ``Event``); refusals raise
``APIError`` subclasses carrying ``code``, ``reason``, ``message`` and
``retry_after``.  The wire logic (requests, retries, SSE, WebSocket, the
log stream's reconnection) is written once, as flows without I/O
(``effects.py``); ``Client`` runs them on anyio, ``SyncClient`` on blocking
sockets.
"""

from trioserve.client.async_client import AsyncEventStream, Client, LogStream, TurnStream
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
from trioserve.client.http import Retry
from trioserve.client.log import LogReader, Reconnect
from trioserve.client.models import Approval, Event, Session, SessionPage, Turn
from trioserve.client.sse import ServerSentEvent, SSEParser
from trioserve.client.sync_client import SyncClient, SyncEventStream, SyncLogStream, SyncTurnStream
from trioserve.client.turns import EventStream, Transport, TurnReader
from trioserve.protocol import Multitask, OnDisconnect

__all__ = [
    "APIError",
    "Approval",
    "AsyncEventStream",
    "BadRequestError",
    "Client",
    "ConnectError",
    "CursorExpiredError",
    "DrainingError",
    "Event",
    "EventStream",
    "LogReader",
    "LogStream",
    "Multitask",
    "NotFoundError",
    "OnDisconnect",
    "PayloadTooLargeError",
    "ProtocolError",
    "RateLimitedError",
    "Reconnect",
    "RequestTimeout",
    "Retry",
    "SSEParser",
    "ServerError",
    "ServerSentEvent",
    "Session",
    "SessionBusyError",
    "SessionPage",
    "StreamInterrupted",
    "SyncClient",
    "SyncEventStream",
    "SyncLogStream",
    "SyncTurnStream",
    "Transport",
    "TransportError",
    "TrioserveClientError",
    "Turn",
    "TurnReader",
    "TurnStream",
    "UnauthorizedError",
]
