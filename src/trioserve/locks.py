"""``Mutex``: a lock taken with no trip to the scheduler when it is free.

``trio.Lock``'s ``acquire`` is a checkpoint even when the lock is free: the
task yields and waits for the scheduler's next pass.  On the hot paths (each
socket write of a response, each turn's admission) the lock is nearly
always free, and that pass costs more than the work it guards.  A
``Mutex`` takes a free lock at once; a held one is waited for as
``trio.Lock`` waits (cancellable, first come first served).  Taking a free
one is not a checkpoint: code that must be one checkpoints by itself.
"""

from __future__ import annotations

from types import TracebackType

import trio


class Mutex:
    """``async with mutex:``, as ``trio.Lock`` but not a checkpoint when free."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = trio.Lock()

    async def __aenter__(self) -> None:
        try:
            self._lock.acquire_nowait()
        except trio.WouldBlock:
            await self._lock.acquire()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()
