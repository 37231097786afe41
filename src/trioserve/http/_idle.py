"""Idle connections: closed at the keep-alive deadline without dropping a request, and
closed longest-idle first when ``--max-connections`` needs a slot.

**A request sent as the keep-alive ran out was dropped.**  hypercorn's
keep-alive timer closes a connection that has had no request in progress
for ``keep_alive_timeout``, whether or not a request is waiting in its
socket: one that arrived just before the deadline, or that the read loop
had not been scheduled to read yet (under load), was lost, and its client
saw the connection closed before any response (httpx's ``ReadError``, a
proxy's ``502``), with no way to tell whether it ran.  ``Idle.expired`` now
looks at the socket at the deadline (``poll``, nothing
read): if bytes are waiting, the read loop serves them (a request that
starts stops the timer) and the connection gets another period; only a
connection with nothing waiting is closed.

**The close itself is the read loop's.**  The timer only asks
(``Idle.close``): it cancels the read loop's wait for data, and the read
loop, which alone takes bytes from the socket, closes the connection if
that wait ended with nothing taken and nothing waiting.  A timer that
closed the socket itself dropped a request the read loop had taken from the
socket but not yet handed to the protocol (one scheduling step: a
pipelined request on a loaded server).  What is left is a request whose
first byte arrives after the read loop's last look, which only the peer
that closes first can avoid: hence a ``--keep-alive`` above the idle
timeout of what sits in front.

**A request that begins as the deadline passes is served.**  The protocol
marks the connection busy at once, but stopping the timer takes a
scheduling step, and on a loaded server the timer's own step (its deadline
passed) can come first: it found nothing in the socket (the request had
been read) and closed the connection under the request it was serving.
``close`` is now nothing while a request is in progress.

**One timer for all connections.**  hypercorn restarts a connection's
keep-alive timer as a new task after every response and cancels it as
every request begins (``TrioSingleTask``: a lock, a ``nursery.start``, a
cancelled task), up to five times a request: 14 % of a create's
instructions, and a task for every idle connection.  ``KeepAlive`` is one
task for the server: a heap of the connections' deadlines, which ``mark``
pushes (a connection serving a request has none).

**At the connection cap, idle connections are cheap.**  An idle keep-alive
connection (or one whose request head is still incomplete) holds a
descriptor and nothing else; ``evict_longest_idle`` closes the one idle
longest, with nothing waiting in its socket, so a new connection is served
instead of refused, and its client reconnects when it needs to.  A
connection serving a request is never evicted.
"""

from __future__ import annotations

import heapq
import itertools
import select
from collections.abc import Awaitable, Callable, Iterable
from math import inf
from typing import Protocol

import trio

__all__ = ["Idle", "KeepAlive", "evict_longest_idle"]


class KeepAlive:
    """The keep-alive timers of a server's connections: one task (``run``) and a heap of
    deadlines, which each connection's ``Idle`` pushes as it changes (an entry that is
    not its ``Idle``'s deadline any more is dropped when it comes up)."""

    def __init__(self, period: float) -> None:
        self.period = period
        #: The server drains (``run``'s ``draining()`` returned): idle connections close now.
        self.draining = False
        self._due: list[tuple[float, int, Idle]] = []
        self._order = itertools.count()  # ties: no Idle is ever compared
        self._open: set[Idle] = set()
        self._sleep = trio.CancelScope()

    def add(self, idle: Idle) -> None:
        self._open.add(idle)

    def discard(self, idle: Idle) -> None:
        self._open.discard(idle)
        idle.due = inf

    def schedule(self, idle: Idle, when: float) -> None:
        """``idle``'s timer runs out at ``when`` (``inf``: it has none)."""
        idle.due = when
        if when < inf:
            heapq.heappush(self._due, (when, next(self._order), idle))
            if when < self._sleep.deadline:
                self._sleep.deadline = when

    async def run(self, draining: Callable[[], Awaitable[object]]) -> None:
        """Until cancelled: each connection's ``expired`` when its deadline passes, and
        once ``draining()`` returns, each idle connection's at once."""
        while True:
            deadline = self._due[0][0] if self._due else inf
            with trio.CancelScope(deadline=deadline) as self._sleep:
                if self.draining:
                    await trio.sleep_forever()
                else:
                    await draining()
                    self.draining = True
                    for idle in list(self._open):
                        idle.reschedule()
                    continue
            now = trio.current_time()
            while self._due and self._due[0][0] <= now:
                when, _, idle = heapq.heappop(self._due)
                if idle.due == when and idle in self._open:
                    idle.due = inf
                    idle.expired()


class Idle:
    """A connection's idleness: since when, its keep-alive wait, and eviction.

    ``mark(idle)`` follows the protocol (hypercorn's ``Updated`` events).
    """

    def __init__(self, sock: trio.socket.SocketType, timers: KeepAlive) -> None:
        self._sock = sock
        self._timers = timers
        #: Since when no request has been in progress (``None``: one is).
        self.since: float | None = trio.current_time()
        self.evicted = False  # to be closed for another connection (``evict``)
        self.due = inf  # when the timer runs out (``KeepAlive.schedule``)
        self._from: float | None = self.since  # the start of the period the timer waits out
        self._grace = False  # a period for bytes that came, even while draining
        #: The timer asked for the close (``close``); a request that starts clears it.
        #: Till then the timer waits for news: it has no deadline.
        self.closing = False
        #: The read loop's wait for data (it sets a new scope for each read).
        self.receiving = trio.CancelScope()
        #: A request is in progress (``mark``): the connection is not idle, whatever a
        #: timer that has not heard of it yet asks.
        self.serving = False
        timers.add(self)
        self.reschedule()

    def mark(self, idle: bool) -> None:
        self.since = self._from = trio.current_time() if idle else None
        self.serving = not idle
        if not idle:
            self.closing = False  # a request came: it is served
        self._grace = False
        self.reschedule()

    def rearm(self) -> None:
        """The read loop serves what came as the timer closed the connection: the timer
        waits a new period."""
        self.closing = self._grace = False
        self._from = trio.current_time()
        self.reschedule()

    def reschedule(self) -> None:
        """Tell the timers when this connection's runs out, as things stand."""
        self._timers.schedule(self, self._deadline())

    def release(self) -> None:
        """The connection is closed: no timer."""
        self._timers.discard(self)

    def close(self) -> None:
        """Ask the read loop to close the connection: its wait for data (now or next) is
        cancelled, and it closes if that wait took nothing and nothing is waiting.

        Not while a request is in progress: one that began as the deadline passed is
        marked at once, but the timer may have been woken by its deadline already."""
        if self.serving:
            return
        self.closing = True
        self.receiving.cancel()

    def read_scope(self) -> trio.CancelScope:
        """The read loop's scope for its next wait for data: cancelled at once if the
        close was asked for while it was busy."""
        self.receiving = trio.CancelScope()
        if self.closing:
            self.receiving.cancel()
        return self.receiving

    def expired(self) -> None:
        """The timer ran out (``KeepAlive``): ask the read loop to close the connection
        (``close``) if it is idle, or evicted, with nothing waiting in its socket.  Bytes
        waiting there get another period to be read, also while the server drains (a
        request that starts stops the timer: ``mark``)."""
        if self.serving or self.closing:  # a request began as the deadline passed
            return
        if self.input_waiting():  # a request came: it is served, not evicted
            self.evicted = False
            self._from = trio.current_time()
            self._grace = True
            self.reschedule()
            return
        self.close()

    def _deadline(self) -> float:
        """When the timer's wait ends, as things stand."""
        if self.serving or self.closing:
            return inf
        if self.evicted:
            return -inf
        assert self._from is not None
        if self._timers.draining and not self._grace:
            return -inf
        return self._from + self._timers.period

    def evict(self) -> bool:
        """Close the connection now (its timer asks at once), to admit another, if it is
        idle with nothing waiting in its socket; whether it will be closed."""
        if self.since is None or self.evicted or self.input_waiting():
            return False
        self.evicted = True
        self.since = None  # no longer a candidate
        self.reschedule()
        return True

    def input_waiting(self) -> bool:
        """Whether the client has sent what the read loop has not taken yet (bytes, or its
        EOF), looked at without reading."""
        fd = self._sock.fileno()
        if fd < 0:
            return False
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))


class HasIdle(Protocol):
    @property
    def idle(self) -> Idle: ...


def evict_longest_idle(connections: Iterable[HasIdle]) -> bool:
    """Evict the connection idle longest that can be (``Idle.evict``); whether one was."""
    idle = [c.idle for c in connections if c.idle.since is not None]
    return any(state.evict() for state in sorted(idle, key=_since))


def _since(state: Idle) -> float:
    return inf if state.since is None else state.since
