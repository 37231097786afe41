"""A TCP proxy that cuts a connection mid-stream, to test what re-opens it."""

from __future__ import annotations

import contextlib

import trio


class CuttingProxy:
    """Forwards TCP connections to ``port``; cuts the first one after ``cut_after`` bytes.

    The cut closes both sides abruptly once that many bytes went from the
    server to the client on one connection (``cut_after=0``: the server's
    answer is dropped whole).  With ``after_head`` the answer's head goes
    through and the cut comes at the first byte after it (an event stream's
    or a WebSocket's first event).  With ``cut_at`` the cut comes instead right after
    the first chunk from the server that brings ``cut_at`` on its connection (an
    event stream's first event of a kind).  A connection the server
    refuses is closed at once.  ``requests`` holds the first
    bytes each client sent (its request head).  ``stop_accepting`` closes
    the listener: later connections are refused, as if the server were gone.
    """

    def __init__(
        self,
        port: int,
        cut_after: int = 0,
        *,
        after_head: bool = False,
        cut_at: bytes | None = None,
    ) -> None:
        self.port = port
        self.cut_at = cut_at
        self.cut_after = cut_after
        self.after_head = after_head
        self.cuts = 0
        self.requests: list[bytes] = []
        self._accepting = trio.CancelScope()
        self.url = ""

    async def run(self, nursery: trio.Nursery) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"

        async def accept() -> None:
            with self._accepting:
                async with listeners[0] as listener:
                    while True:
                        stream = await listener.accept()
                        nursery.start_soon(self._forward, stream)

        nursery.start_soon(accept)

    def stop_accepting(self) -> None:
        self._accepting.cancel()

    async def _forward(self, client: trio.SocketStream) -> None:
        index = len(self.requests)
        self.requests.append(b"")
        try:
            server = await trio.open_tcp_stream("127.0.0.1", self.port)
        except OSError:  # the server is gone: so is the client's connection
            await client.aclose()
            return
        async with client, server, trio.open_nursery() as nursery:

            async def upstream() -> None:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    async for chunk in client:
                        if len(self.requests[index]) < 4096:
                            self.requests[index] += chunk
                        await server.send_all(chunk)
                nursery.cancel_scope.cancel()

            async def downstream() -> None:
                sent = 0
                limit = None if self.after_head else self.cut_after
                seen = b""
                tail = b""
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    async for chunk in server:
                        if self.cut_at is not None:
                            found = self.cut_at in tail + chunk
                            tail = (tail + chunk)[-len(self.cut_at) :]
                            await client.send_all(chunk)
                            if found and not self.cuts:
                                self.cuts += 1
                                break
                            continue
                        if limit is None:  # looking for the end of the head
                            seen += chunk
                            if (end := seen.find(b"\r\n\r\n")) >= 0:
                                limit = end + 4
                        beyond = limit is not None and sent + len(chunk) > limit - (
                            not self.after_head
                        )
                        if not self.cuts and beyond:
                            assert limit is not None
                            await client.send_all(chunk[: limit - sent])
                            self.cuts += 1
                            break  # the cut: both sockets close now
                        sent += len(chunk)
                        await client.send_all(chunk)
                nursery.cancel_scope.cancel()

            nursery.start_soon(upstream)
            nursery.start_soon(downstream)
