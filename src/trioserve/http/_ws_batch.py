"""WebSocket messages in batches: a batch of a turn's events in one socket write.

quart's ``websocket.send`` hands hypercorn one ASGI ``websocket.send`` per
message, and hypercorn frames and writes each on its own: a turn's batch of
events (a pipe read of its adapter) became as many socket writes.  A
``TextBatch`` carries a batch's messages through quart as one ``str`` (their
text joined, so whatever counts the characters sent still counts them
all); hypercorn's ``WSStream.app_send``, patched by ``apply``, frames each
message as its own text frame, as it would have, and writes them at once.
Any other message goes the usual way.
"""

from __future__ import annotations

from typing import Any

from hypercorn.protocol.events import Data
from hypercorn.protocol.ws_stream import ASGIWebsocketState, WSStream
from wsproto.events import TextMessage
from wsproto.utilities import LocalProtocolError


class TextBatch(str):
    """Text messages sent together: the ``str`` is their text joined, ``texts`` them."""

    texts: list[str]

    def __new__(cls, texts: list[str]) -> TextBatch:
        batch = super().__new__(cls, "".join(texts))
        batch.texts = texts
        return batch


_app_send = WSStream.app_send


async def _app_send_batches(self: Any, message: Any) -> None:
    """``WSStream.app_send``, with a ``TextBatch`` framed message by message and sent
    in one write."""
    if message is not None and message["type"] == "websocket.send":
        text = message.get("text")
        if type(text) is TextBatch and not self.closed:
            if self.state != ASGIWebsocketState.CONNECTED:
                await _app_send(self, message)  # hypercorn's refusal, as for any message
                return
            try:
                data = b"".join([self.connection.send(TextMessage(data=t)) for t in text.texts])
            except LocalProtocolError:  # closing: as hypercorn does, nothing is sent
                return
            await self.send(Data(stream_id=self.stream_id, data=data))
            return
    await _app_send(self, message)


def apply() -> None:
    """Install the batching (idempotent)."""
    WSStream.app_send = _app_send_batches  # type: ignore[method-assign]
