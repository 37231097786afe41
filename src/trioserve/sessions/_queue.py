"""Double texting: the turns that wait for their session (``multitask: enqueue``).

A turn accepted with ``enqueue`` while its session is busy is stored
``queued`` (``stores.turn_queue``) and held here as a ``QueuedTurn`` in its
session's first-come-first-served line.  ``TurnQueues`` keeps the lines and
runs the pump: a task that, whenever something may have changed (a turn
released its slot, a turn was queued or removed, every ``POLL_SECONDS``
while turns wait), starts the first waiting turn of every session that runs
none and is not held by an interrupting turn, through the manager's
``start`` callback.  A head that cannot start yet (no turn slot free, the
store says the session is busy: another process runs its turn) stays first
and is tried again, so a queued turn never fails for want of a slot.

A waiting turn holds no turn slot and is not the session's single flight;
it takes both when it starts, in one synchronous step (as
``SessionManager.start_turn`` does), so the caps stay exact.

Its stream (``queued_events``) opens at once: a ``trioserve.queued`` event
first (``data.position``: 1 = next; not logged, so it has no ``seq``),
then, once it starts, the turn's own events from its first; if it is
removed before it starts, a ``session.ended`` ``cancelled`` (not logged
either: the log only holds what ran), and if the server drains first, the
stream ends there (the turn stays queued in the store).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import trio

from trioserve.protocol import SESSION_ENDED, TURN_QUEUED, OnDisconnect, TurnProtocol
from trioserve.runtime import wire
from trioserve.sessions._turns import Turn, current_protocol
from trioserve.stores.base import LoggedEvent, TurnEnd, TurnRecord

log = logging.getLogger("trioserve.queue")

#: While turns wait, the pump looks again this often even when nothing woke it
#: (a turn of the session another process ran may have ended).
POLL_SECONDS: Final = 0.5


@dataclass(eq=False)
class QueuedTurn:
    """A turn accepted while its session was busy; see the module doc."""

    record: TurnRecord
    on_disconnect: OnDisconnect
    env: dict[str, str] | None
    tenant: str | None
    #: Its place in the line when it was accepted (1 = next).
    position: int
    #: The turn once it has started (``None`` while it waits).
    turn: Turn | None = None
    #: How it ended without starting (removed, its session ended), if it did.
    dropped: TurnEnd | None = None
    #: Its client left while it was being started: stop it once it has.
    left_early: bool = False
    #: Told when its client leaves while it waits (``on_disconnect: cancel``).
    on_left: Callable[[QueuedTurn], None] | None = None
    #: The face its request came to (``Turn.protocol``, once it runs).
    protocol: TurnProtocol = field(default_factory=current_protocol)
    _changed: trio.Event = field(default_factory=trio.Event)

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def session_id(self) -> str:
        return self.record.session_id

    @property
    def end(self) -> TurnEnd | None:
        """How it ended, once it has (started or not)."""
        return self.turn.end if self.turn is not None else self.dropped

    def started(self, turn: Turn) -> None:
        self.turn = turn
        if self.left_early:
            turn.client_left()
        self._changed.set()

    def ended_unstarted(self, end: TurnEnd) -> None:
        self.dropped = end
        self._changed.set()

    def stop_waiting(self) -> None:
        """Wake its readers without an outcome (the server drains)."""
        self._changed.set()

    def client_left(self) -> None:
        """The client that sent it is gone: as ``Turn.client_left`` once it runs; while it
        waits, with ``onDisconnect: cancel``, it leaves the line."""
        if self.turn is not None:
            self.turn.client_left()
        elif self.on_disconnect == "cancel":
            self.left_early = True
            if self.on_left is not None:
                self.on_left(self)

    async def wait(self) -> None:
        """Return once it has started or ended, or the server drains."""
        await self._changed.wait()


class TurnQueues:
    """Every session's line of waiting turns, and the pump that starts them."""

    def __init__(self, max_per_session: int) -> None:
        self.max_per_session = max_per_session
        self._lines: dict[str, deque[QueuedTurn]] = {}
        #: Sessions an interrupting turn holds: the pump starts none of their turns.
        self._held: dict[str, int] = {}
        self._wake = trio.Event()
        self.closed = False

    def __bool__(self) -> bool:
        """Whether any turn waits."""
        return bool(self._lines)

    def __len__(self) -> int:
        """How many turns wait, in every line."""
        return sum(len(line) for line in self._lines.values())

    def waiting(self, session_id: str) -> int:
        line = self._lines.get(session_id)
        return 0 if line is None else len(line)

    def __iter__(self) -> Iterator[QueuedTurn]:
        for line in list(self._lines.values()):
            yield from list(line)

    def find(self, session_id: str, turn_id: str) -> QueuedTurn | None:
        for queued in self._lines.get(session_id, ()):
            if queued.id == turn_id:
                return queued
        return None

    def add(self, queued: QueuedTurn) -> None:
        """Put ``queued`` last in its session's line (its ``position`` says where)."""
        self._lines.setdefault(queued.session_id, deque()).append(queued)
        self.wake()

    def remove(self, queued: QueuedTurn) -> bool:
        """Take ``queued`` out of its line; ``False`` if it was not in it."""
        line = self._lines.get(queued.session_id)
        if line is None or queued not in line:
            return False
        line.remove(queued)
        if not line:
            del self._lines[queued.session_id]
        self.wake()
        return True

    def hold(self, session_id: str) -> None:
        self._held[session_id] = self._held.get(session_id, 0) + 1

    def unhold(self, session_id: str) -> None:
        left = self._held.get(session_id, 0) - 1
        if left > 0:
            self._held[session_id] = left
        else:
            self._held.pop(session_id, None)
        self.wake()

    def wake(self) -> None:
        """The pump looks at the lines again (with none, it has nothing to look at)."""
        if self._lines or self.closed:
            self._wake.set()

    def close(self) -> None:
        """The server drains: nothing starts from now on; the waiting turns' readers end."""
        self.closed = True
        for queued in self:
            queued.stop_waiting()
        self.wake()

    def heads(self, running: Callable[[str], bool]) -> list[QueuedTurn]:
        """The first waiting turn of each session that runs none and is not held."""
        return [
            line[0]
            for session_id, line in self._lines.items()
            if line and session_id not in self._held and not running(session_id)
        ]

    async def run(
        self,
        running: Callable[[str], bool],
        start: Callable[[QueuedTurn], Awaitable[None]],
        refresh: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """The pump (a task of the manager's nursery, until cancelled); ``refresh`` (a
        shared store) first drops the waiting turns other processes ended or started."""
        while not self.closed:
            self._wake = trio.Event()
            if refresh is not None and self._lines:
                await refresh()
            for queued in self.heads(running):
                await start(queued)
            if self.closed:
                return
            timeout = POLL_SECONDS if self._lines else math.inf
            with trio.move_on_after(timeout):
                await self._wake.wait()


def frame(queued: QueuedTurn, kind: str, data: dict[str, Any]) -> LoggedEvent:
    """A stream-only event of ``queued``'s (not logged: seq 0, no SSE ``id:``)."""
    return LoggedEvent(0, queued.id, kind, wire.synthesize(kind, queued.session_id, data).raw)


async def queued_events(
    queued: QueuedTurn,
    follow: Callable[[Turn], AsyncIterator[list[LoggedEvent]]],
    *,
    idle: float = math.inf,
) -> AsyncIterator[list[LoggedEvent]]:
    """``queued``'s stream: see the module doc (``[]``: idle for ``idle`` seconds)."""
    position = {"position": queued.position, "turnId": queued.id}
    yield [frame(queued, TURN_QUEUED, position)]
    while not queued._changed.is_set():
        with trio.move_on_after(idle):
            await queued.wait()
        if not queued._changed.is_set():
            yield []
    if queued.turn is not None:
        async for batch in follow(queued.turn):
            yield batch
    elif queued.dropped is not None:
        data = {"reason": "cancelled", "message": f"turn {queued.id} removed from the queue"}
        if queued.dropped.reason != "cancelled":
            data["message"] = f"turn {queued.id} removed from the queue: {queued.dropped.reason}"
        yield [frame(queued, SESSION_ENDED, data)]
