"""A WebSocket client for tests: connect to a session's ``/ws``, send and receive JSON messages."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
from trio_websocket import WebSocketConnection, open_websocket_url

from tests.helpers.server import Server


def ws_url(server: Server, session_id: str) -> str:
    return server.url.replace("http://", "ws://", 1) + f"/v1/sessions/{session_id}/ws"


@asynccontextmanager
async def connect(server: Server, session_id: str) -> AsyncIterator[WebSocketConnection]:
    async with open_websocket_url(ws_url(server, session_id), disconnect_timeout=5) as ws:
        yield ws


async def send(ws: WebSocketConnection, message: dict[str, Any]) -> None:
    await ws.send_message(json.dumps(message))


async def receive(ws: WebSocketConnection) -> dict[str, Any]:
    with trio.fail_after(10):
        message = await ws.get_message()
    assert isinstance(message, str), message
    value: dict[str, Any] = json.loads(message)
    return value
