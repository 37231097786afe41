"""``read_some``: a read of a non-blocking descriptor with one trip to the scheduler, not two.

trio's streams yield around every read: its socket after each read, also the
one it was just woken for; its pipe before each read, then again to wait if
the pipe is empty.  ``read_some`` reads at once, yields only to wait when
there is nothing to read, and returns what it read after a wait at once.
Bytes found without a wait still come after a yield (shielded: they are not
lost to a cancellation), so a peer that sends faster than it is served (a
client, an adapter) does not hold the event loop.  A cancellation is taken
before the read, as trio takes it; the end of the data (``b""``) returns at
once.  Used for a connection's socket (``http``) and an adapter's pipes
(``runtime``).
"""

from __future__ import annotations

import errno
import os
from typing import Protocol

import trio


class HasFileno(Protocol):
    def fileno(self) -> int: ...


async def read_some(source: HasFileno, max_bytes: int) -> bytes:
    """Up to ``max_bytes`` from ``source`` (non-blocking), ``b""`` at its end;
    ``trio.ClosedResourceError`` once it is closed, ``trio.BrokenResourceError`` if the
    read fails."""
    data = await read_ready(source, max_bytes)
    while data is None:
        await trio.lowlevel.wait_readable(source)
        data = _read(source, max_bytes)
    return data


async def read_ready(source: HasFileno, max_bytes: int) -> bytes | None:
    """``read_some`` if there is something to read now (or the end), else ``None`` at once
    (for a caller that prepares its wait only when it must wait)."""
    await trio.lowlevel.checkpoint_if_cancelled()
    data = _read(source, max_bytes)
    if data:
        await trio.lowlevel.cancel_shielded_checkpoint()
    return data


def _read(source: HasFileno, max_bytes: int) -> bytes | None:
    try:
        return os.read(source.fileno(), max_bytes)  # a closed one's is -1: EBADF
    except BlockingIOError:
        return None
    except OSError as exc:
        if exc.errno == errno.EBADF:
            raise trio.ClosedResourceError("it was closed") from None
        raise trio.BrokenResourceError(f"read failed: {exc}") from exc
