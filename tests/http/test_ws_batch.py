"""A batch of events as WebSocket messages: framed one by one, written at once (issue 23)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypercorn.protocol.events import Data
from hypercorn.protocol.ws_stream import ASGIWebsocketState
from wsproto.connection import Connection, ConnectionType
from wsproto.events import TextMessage

from trioserve.http._ws_batch import TextBatch, _app_send_batches


def _stream(state: ASGIWebsocketState = ASGIWebsocketState.CONNECTED) -> Any:
    sent: list[Any] = []

    async def send(event: Any) -> None:
        sent.append(event)

    return SimpleNamespace(
        closed=False,
        state=state,
        connection=Connection(ConnectionType.SERVER),
        stream_id=1,
        send=send,
        sent=sent,
    )


def _messages(data: bytes) -> list[str]:
    client = Connection(ConnectionType.CLIENT)
    client.receive_data(data)
    texts = []
    for event in client.events():
        assert isinstance(event, TextMessage) and event.message_finished
        texts.append(event.data)
    return texts


async def test_a_batch_is_its_messages_in_one_write() -> None:
    stream = _stream()
    texts = ['{"seq":1,"type":"a"}', '{"seq":2,"type":"é"}', "x" * 70_000]
    batch = TextBatch(texts)
    assert batch == "".join(texts)  # what counts the characters sent counts them all
    await _app_send_batches(stream, {"type": "websocket.send", "text": batch, "bytes": None})
    assert len(stream.sent) == 1 and isinstance(stream.sent[0], Data)
    assert _messages(stream.sent[0].data) == texts


async def test_a_closed_stream_sends_nothing() -> None:
    stream = _stream()
    stream.closed = True
    await _app_send_batches(stream, {"type": "websocket.send", "text": TextBatch(["a", "b"])})
    assert stream.sent == []
