"""A running turn's live feed: its logged events, in memory, for any number of readers.

The turn's log writer (``_turns.TurnLog``) publishes each batch once the store
has it; readers (the client that started the turn, clients that re-attached)
follow the feed from their last seq.  It keeps a window of the newest events,
at least ``FEED_WINDOW_BYTES`` of them: a reader further behind reads the store.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from itertools import accumulate
from operator import attrgetter
from typing import Final

import trio

from trioserve.stores.base import LoggedEvent

#: The feed keeps at least this many bytes of recent events in memory;
#: a reader further behind reads the store.
FEED_WINDOW_BYTES: Final = 4 * 1024 * 1024
#: How many of the oldest events ``_trim`` sizes at a time.
_TRIM_CHUNK: Final = 512

_RAW: Final = attrgetter("raw")


class Feed:
    """The logged events of one running turn, for any number of readers.

    ``after(seq)`` gives the published events after ``seq`` from memory, or
    ``None`` when some of them have left the window (the reader then reads
    them from the store: they are all there).  ``wait(seq)`` returns once
    there is something after ``seq`` or the feed is finished.  The cost of
    ``publish`` and ``after`` depends on the events they pass, never on how
    long the turn has been running.
    """

    def __init__(self, first_seq: int, window_bytes: int = FEED_WINDOW_BYTES) -> None:
        self.first_seq = first_seq
        self.published = first_seq - 1  # the last published seq
        self.finished = False
        self._events: list[LoggedEvent] = []  # the window is self._events[self._head:]
        self._head = 0
        self._bytes = 0  # of the window
        self._window = window_bytes
        self._changed = trio.Event()

    def publish(self, events: Sequence[LoggedEvent], size: int | None = None) -> None:
        """Add stored events (``size``: their bytes, if the caller knows)."""
        if not events:
            return
        self._events.extend(events)
        self._bytes += sum(map(len, map(_RAW, events))) if size is None else size
        if self._bytes > self._window:
            self._trim()
        if self._head > 1024 and self._head * 2 > len(self._events):
            del self._events[: self._head]  # amortized: each event is moved at most once
            self._head = 0
        self.published = events[-1].seq
        self._wake()

    def finish(self) -> None:
        self.finished = True
        self._wake()

    def after(self, seq: int) -> list[LoggedEvent] | None:
        if seq >= self.published:
            return []
        if self._head >= len(self._events):
            return None
        start = seq + 1 - self._events[self._head].seq
        if start < 0:
            return None
        return self._events[self._head + start :]

    async def wait(self, seq: int) -> None:
        while self.published <= seq and not self.finished:
            await self._changed.wait()

    async def until_finished(self) -> None:
        """Return once the feed is finished: its turn has let go of its session and slot
        (ended, or parked for an approval)."""
        while not self.finished:
            await self._changed.wait()

    def _trim(self) -> None:
        """Drop the oldest events while the window holds more than its bytes, but never
        the newest.  The sizes of a chunk of the oldest are summed at a time (in C),
        and a bisection finds how many of them go: no Python step an event."""
        events, excess = self._events, self._bytes - self._window
        newest = len(events) - 1
        while excess > 0 and self._head < newest:
            chunk = events[self._head : min(newest, self._head + _TRIM_CHUNK)]
            sizes = list(accumulate(map(len, map(_RAW, chunk))))
            gone = min(bisect_left(sizes, excess) + 1, len(sizes))  # the fewest that cover it
            self._head += gone
            self._bytes -= sizes[gone - 1]
            excess -= sizes[gone - 1]

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()
