"""Reading a session's log when its turn may run in another process (a shared store).

With ``--workers`` or replicas on one PostgreSQL database, the turn a client
follows may run in another process: this one has no ``Feed`` for it, only
the store.  The readers here read what the store has after the cursor, then
wait on the store's wake-up hook (``Store.wait_appended``: ``NOTIFY`` on
PostgreSQL) bounded by ``POLL_SECONDS``, and read again, until the turn's
record says it has finished (its last events are appended in the same step
as its end, so one more read gets them all).  A turn running in this
process is followed through its feed, as ``_eventlog.read_log`` does.

The guarantees are the single-process reader's: each seq once, in order,
without a gap, whichever process wrote it (the store orders the log), and
nothing a client saw is lost when the writer dies: a survivor closes its
turn after the lease (``_leases``) with an ``error`` and a ``session.ended``
that readers here deliver like any event.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Final

import trio

from trioserve.protocol import TurnStatus
from trioserve.sessions._eventlog import LogSource, follow_turn, read_stored
from trioserve.stores.base import LoggedEvent, Store, TurnRecord

#: The longest a reader waits for a wake-up before it looks at the store again
#: (a turn that ends without a new event, a session ended elsewhere).
POLL_SECONDS: Final = 1.0


async def running_in_store(
    store: Store, session_id: str, turn_id: str | None = None
) -> TurnRecord | None:
    """The session's running turn as the store has it (``turn_id``'s only, when given)."""
    running = await store.list_turns(session_id, status=TurnStatus.RUNNING, limit=1)
    if not running or (turn_id is not None and running[0].id != turn_id):
        return None
    return running[0]


async def follow_remote(
    store: Store, record: TurnRecord, after: int, *, idle: float = math.inf
) -> AsyncIterator[list[LoggedEvent]]:
    """The events of ``record``'s turn after seq ``after``, live from the store, to its end."""
    session_id, pos = record.session_id, after
    quiet_since = trio.current_time()
    while True:
        delivered = False
        async for batch in read_stored(store, session_id, pos, turn_id=record.id):
            pos, delivered = batch[-1].seq, True
            yield batch
        if delivered:
            quiet_since = trio.current_time()
        current = await store.get_turn(session_id, record.id)
        if current.status.finished:
            async for batch in read_stored(store, session_id, pos, turn_id=record.id):
                pos = batch[-1].seq
                yield batch
            return
        left = quiet_since + idle - trio.current_time()
        with trio.move_on_after(max(0.0, min(POLL_SECONDS, left))):
            await store.wait_appended(session_id, pos)
        if trio.current_time() - quiet_since >= idle:
            quiet_since = trio.current_time()
            yield []


async def read_log_shared(
    source: LogSource,
    session_id: str,
    after: int,
    *,
    turn_id: str | None = None,
    follow: bool = False,
    idle: float = math.inf,
) -> AsyncIterator[list[LoggedEvent]]:
    """``_eventlog.read_log`` for a shared store: a running turn may be another process's.

    Without ``follow`` it ends after the running turn, wherever it runs (or
    after the replay if none runs); with ``follow`` it goes on with every
    later turn until the session is terminal or the server drains.
    """
    store = source.store
    pos = after
    quiet_since = trio.current_time()
    while True:
        activity = source.activity(session_id)  # taken before looking, as read_log does
        turn = source.running_turn(session_id)
        if turn is not None and turn_id is not None and turn.id != turn_id:
            turn = None
        if turn is not None:  # ours: stored part, then its feed
            before = turn.feed.first_seq
            if pos < before - 1:
                stored = read_stored(store, session_id, pos, before=before, turn_id=turn_id)
                async for batch in stored:
                    pos = batch[-1].seq
                    yield batch
            async for batch in follow_turn(store, turn, pos, idle=idle):
                if batch:
                    pos = batch[-1].seq
                yield batch
            quiet_since = trio.current_time()
        else:
            remote = await running_in_store(store, session_id, turn_id)
            async for batch in read_stored(store, session_id, pos, turn_id=turn_id):
                pos = batch[-1].seq
                quiet_since = trio.current_time()
                yield batch
            if remote is not None:
                async for batch in follow_remote(store, remote, pos, idle=idle):
                    if batch:
                        pos = batch[-1].seq
                    yield batch
                quiet_since = trio.current_time()
                if follow and turn_id is None:
                    continue
        if not follow or turn_id is not None:
            return
        if source.draining or (await store.get(session_id)).status.terminal:
            return
        if turn is None:
            left = quiet_since + idle - trio.current_time()
            with trio.move_on_after(max(0.0, min(POLL_SECONDS, left))):
                await _either(activity.wait, partial(store.wait_appended, session_id, pos))
            if trio.current_time() - quiet_since >= idle:
                quiet_since = trio.current_time()
                yield []


async def _either(*waits: Callable[[], Awaitable[object]]) -> None:
    """Return once any of ``waits`` has returned."""
    async with trio.open_nursery() as nursery:
        for wait in waits:
            nursery.start_soon(_then_cancel, wait, nursery.cancel_scope)


async def _then_cancel(wait: Callable[[], Awaitable[object]], scope: trio.CancelScope) -> None:
    await wait()
    scope.cancel()
