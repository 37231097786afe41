"""Server-Sent Events framing of logged events (docs/wire-protocol.md)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Final

from quart import Response

from trioserve.stores.base import LoggedEvent


def sse_frames(events: Iterable[LoggedEvent]) -> bytes:
    """The SSE frames of ``events`` as one chunk: ``event:``, ``data:``, ``id: <seq>``, blank.

    The ``id:`` line comes last, so a client that reads the reference's two
    lines positionally still finds them first.
    """
    return b"".join(
        [b"event: %b\ndata: %b\nid: %d\n\n" % (e.type.encode(), e.raw, e.seq) for e in events]
    )


SSE_HEADERS: Final = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
KEEP_ALIVE: Final = b": keep-alive\n\n"


class SSEBody:
    """An SSE response body over batches of logged events.

    Each batch becomes one chunk of frames; an empty batch (nothing for a
    while) becomes the comment ``: keep-alive``, which keeps proxies from
    closing the stream and finds a client that vanished by the failed
    write.  However the body ends -- its events ran out, the client left,
    or the response was dropped unsent -- ``on_close`` is called once.
    """

    def __init__(
        self, batches: AsyncIterator[list[LoggedEvent]], on_close: Callable[[], None] | None = None
    ) -> None:
        self._batches = batches
        self._on_close = on_close

    def __aiter__(self) -> SSEBody:
        return self

    async def __anext__(self) -> bytes:
        try:
            batch = await anext(self._batches)
        except StopAsyncIteration:
            self._close()
            raise
        if not batch:
            return KEEP_ALIVE
        return sse_frames(batch)

    async def aclose(self) -> None:
        self._close()

    def _close(self) -> None:
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()

    def __del__(self) -> None:
        # The response was dropped without being sent (the client left first).
        with contextlib.suppress(Exception):
            self._close()


def sse_response(body: SSEBody, headers: dict[str, str] | None = None) -> Response:
    response = Response(body, status=200, headers={**SSE_HEADERS, **(headers or {})})
    response.timeout = None
    return response
