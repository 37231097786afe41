"""A fix for hypercorn (0.17-0.19) that trioserve's WebSocket endpoint relies on.

When a client sends a WebSocket message over ``websocket_max_message_size``,
hypercorn sends the close frame 1009 but then stops reading the events of
that chunk and never clears its message buffer: every later frame raises
the same error again, so the client's closing handshake is never read.
The TCP connection stays open until the client gives up (trio-websocket
never does), and the application is never told the socket is gone.

``apply()`` replaces ``WSStream._handle_events`` with the same loop, except
that once a close frame has been sent, further data frames are dropped and
the loop carries on, so the client's close is answered and the connection
ends as after any other close.
"""

from __future__ import annotations

from typing import Any

from hypercorn.protocol.events import StreamClosed
from hypercorn.protocol.ws_stream import FrameTooLargeError, WSStream
from wsproto.connection import ConnectionState
from wsproto.events import CloseConnection, Message, Ping
from wsproto.frame_protocol import CloseReason


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


def apply() -> None:
    """Install the fix (idempotent)."""
    WSStream._handle_events = _handle_events  # type: ignore[method-assign]
