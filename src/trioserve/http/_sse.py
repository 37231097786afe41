"""Server-Sent Events framing of logged events (docs/wire-protocol.md)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from itertools import repeat
from operator import attrgetter, mod
from typing import Final

import trio
from quart import Response

from trioserve.stores.base import LoggedEvent


def sse_frames(events: Sequence[LoggedEvent]) -> bytes:
    """The SSE frames of ``events`` as one chunk: ``event:``, ``data:``, ``id: <seq>``, blank.

    The ``id:`` line comes last, so a client that reads the reference's two
    lines positionally still finds them first.  An event that is not logged
    (seq 0: a queued turn's ``trioserve.queued``) has no ``id:`` line, so a
    client's ``Last-Event-ID`` stays the last logged event's.  A batch of
    logged events is framed by ``map`` (in C): it can hold tens of thousands
    (a reader behind its turn), so its columns are taken one by one, not by
    ``zip(*events)``, whose cost an event triples past a few thousand.
    """
    if not events:
        return b""
    seqs = list(map(_SEQ, events))
    if all(seqs):
        types = list(map(_TYPE, events))
        names = {name: name.encode() for name in set(types)}  # a batch has few types
        frames = zip(map(names.__getitem__, types), map(_RAW, events), seqs, strict=True)
        return b"".join(map(mod, repeat(_FRAME), frames))  # ``mod``: no argument tuple a call
    return b"".join(
        [
            b"event: %b\ndata: %b\nid: %d\n\n" % (e.type.encode(), e.raw, e.seq)
            if e.seq
            else b"event: %b\ndata: %b\n\n" % (e.type.encode(), e.raw)
            for e in events
        ]
    )


_FRAME: Final = b"event: %b\ndata: %b\nid: %d\n\n"
_SEQ, _TYPE, _RAW = attrgetter("seq"), attrgetter("type"), attrgetter("raw")


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
    the server ended it (``end``), or the response was dropped unsent --
    each ``on_close`` is called once.  ``frames`` makes a batch's chunk
    (a face's own events: ``_agui.py``), and ``coda`` the one chunk sent after
    the last batch.
    """

    def __init__(
        self,
        batches: AsyncIterator[list[LoggedEvent]],
        *on_close: Callable[[], None],
        frames: Callable[[list[LoggedEvent]], bytes] = sse_frames,
        prelude: bytes = b"",
        coda: Callable[[], Awaitable[bytes]] | None = None,
    ) -> None:
        self._batches = batches
        #: The first chunk, sent at once (a face's start-of-run message).
        self._prelude = prelude
        self._on_close = on_close
        self._frames = frames
        #: The last chunk, once the events ran out (a face's end-of-run message).
        self._coda = coda
        self._waiting: trio.CancelScope | None = None
        self._ending: str | None = None
        self._ended = False
        #: Whether ``end`` may be called while it waits for a batch (a stream of a key
        #: that a reload can revoke); if not, it waits without a cancel scope.
        self.revocable = True

    def __aiter__(self) -> SSEBody:
        return self

    def end(self, reason: str) -> None:
        """End the stream now (its key was revoked): a comment saying ``reason``, then
        the end of the body; the events are no longer read."""
        if self._ending is None:
            self._ending = reason
        if self._waiting is not None:
            self._waiting.cancel()

    async def __anext__(self) -> bytes:
        if self._prelude and self._ending is None:
            prelude, self._prelude = self._prelude, b""
            return prelude
        if self._ending is None:
            if not self.revocable:
                return await self._next()
            with trio.CancelScope() as self._waiting:
                try:
                    return await self._next()
                finally:
                    self._waiting = None
        if self._ended:
            raise StopAsyncIteration
        self._ended = True
        aclose = getattr(self._batches, "aclose", None)
        if aclose is not None:
            await aclose()
        self._close()
        return b": closed: " + (self._ending or "").encode() + b"\n\n"

    async def _next(self) -> bytes:
        """The next batch's chunk (or the coda, once the batches ran out)."""
        try:
            batch = await anext(self._batches)
        except StopAsyncIteration:
            coda, self._coda = self._coda, None
            if coda is not None:
                return await coda()
            self._close()
            raise
        return self._frames(batch) if batch else KEEP_ALIVE

    async def aclose(self) -> None:
        self._close()

    def _close(self) -> None:
        on_close, self._on_close = self._on_close, ()
        for call in on_close:
            call()

    def __del__(self) -> None:
        # The response was dropped without being sent (the client left first).
        with contextlib.suppress(Exception):
            self._close()


def sse_response(body: SSEBody, headers: dict[str, str] | None = None) -> Response:
    response = Response(body, status=200, headers={**SSE_HEADERS, **(headers or {})})
    response.timeout = None
    return response
