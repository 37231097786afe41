"""The starts under way in one process: a session whose turn the store is being asked to take.

A turn is the session's *running* turn here (``SessionManager._turns``) only
once the store has accepted it (``create_turn``, or ``begin_turn`` for a
queued turn).  While the store is asked, the session is *starting*
(``Starts.start``): no other turn of it starts in this process (single
flight), yet the turn is nobody's to stop, interrupt or follow, because
the store may still refuse it: ``SessionBusy`` when another process runs
the session's turn (``--workers``, replicas on PostgreSQL), a cap, a store
error.  Whoever acts on the session's running turn (a cancel, an
interrupting turn, the end of the session) first waits for the start to
settle (``Starts.settled``), then sees the turn that started or none, and
then asks the store, which reaches the process that runs it.

Before this, a cancel that came while a worker's pump was trying a queued
turn (refused: the other worker ran the session's turn) stopped the turn
that never ran, answered 202, and the other worker's turn ran on: the
queued turns behind it waited forever (issue 20).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import trio

from trioserve.sessions._turns import Turn


class Starts:
    """The sessions whose turn is being started here; see the module doc."""

    def __init__(self) -> None:
        self._done: dict[str, trio.Event] = {}

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._done

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._done))

    def __bool__(self) -> bool:
        return bool(self._done)

    @contextmanager
    def start(self, session_id: str) -> Iterator[None]:
        """The session is starting for the ``with`` block (one start at a time per session:
        the caller has checked that none runs or starts)."""
        if session_id in self._done:
            raise RuntimeError(f"session {session_id}: a turn is already being started")
        done = self._done[session_id] = trio.Event()
        try:
            yield
        finally:
            del self._done[session_id]
            done.set()

    async def settled(self, session_id: str, running: Mapping[str, Turn]) -> Turn | None:
        """The session's running turn in ``running`` once no start of one is under way."""
        while (done := self._done.get(session_id)) is not None:
            await done.wait()
        return running.get(session_id)
