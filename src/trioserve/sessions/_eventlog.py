"""Reading a session's event log: replay from a cursor, then follow live.

A reader holds a cursor, the seq of the last event it delivered, and asks
for what comes after it: first from the store (the log of earlier turns,
and whatever of the running turn is no longer in memory), then from the
running turn's ``Feed``.  Events reach the feed only once the store has
them, so the two sources never disagree: whatever the interleaving, a
reader delivers each seq once, in order, without a gap.

The readers here are async generators of *batches* (lists of events); an
empty batch means nothing happened for ``idle`` seconds, so a transport can
send a heartbeat.  They hold no resources between batches: a consumer may
stop at any time (and is cancelled at any ``await``) without cleanup.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Final, Protocol

import trio

from trioserve.errors import CursorExpired, InvalidRequest
from trioserve.sessions._turns import Turn
from trioserve.stores.base import LoggedEvent, Store

#: Events read from the store per call: at most this many, stopping at 1 MiB.
REPLAY_BATCH: Final = 1000
REPLAY_BATCH_BYTES: Final = 1024 * 1024


class LogSource(Protocol):
    """What a reader needs from the session manager."""

    @property
    def store(self) -> Store: ...

    @property
    def draining(self) -> bool: ...

    def running_turn(self, session_id: str) -> Turn | None: ...

    def activity(self, session_id: str) -> trio.Event:
        """Set when a turn of the session starts, the session ends, or the server drains."""
        ...


async def check_cursor(store: Store, session_id: str, after: int, turn_id: str | None) -> None:
    """Refuse a cursor the log cannot serve, before anything is sent.

    ``SessionNotFound``/``TurnNotFound`` for an unknown session or turn,
    ``InvalidRequest`` for a cursor past the end of the log, ``CursorExpired``
    when events after the cursor were dropped by the retention.
    """
    bounds = await store.log_bounds(session_id)
    if after > bounds.last:
        raise InvalidRequest(
            f"cursor {after} is past the end of session {session_id}'s log (last seq {bounds.last})"
        )
    last = bounds.last
    if turn_id is not None:
        turn = await store.get_turn(session_id, turn_id)
        if turn.first_seq is None:
            return  # nothing logged yet
        after = max(after, turn.first_seq - 1)
        last = turn.last_seq if turn.last_seq is not None else last
    if after < min(last, bounds.earliest - 1):
        raise CursorExpired(
            f"events after seq {after} of session {session_id} are no longer retained; "
            f"the log starts at seq {bounds.earliest}",
            earliest_seq=bounds.earliest,
        )


async def read_stored(
    store: Store,
    session_id: str,
    after: int,
    *,
    before: int | None = None,
    turn_id: str | None = None,
) -> AsyncIterator[list[LoggedEvent]]:
    """The logged events after seq ``after`` (and before ``before``) as the store has them."""
    while batch := await store.read_events(
        session_id,
        after=after,
        before=before,
        turn_id=turn_id,
        limit=REPLAY_BATCH,
        max_bytes=REPLAY_BATCH_BYTES,
    ):
        after = batch[-1].seq
        yield batch


async def follow_turn(
    store: Store, turn: Turn, after: int, *, idle: float = math.inf
) -> AsyncIterator[list[LoggedEvent]]:
    """The events of ``turn`` after seq ``after``, live, until the turn has finished."""
    feed = turn.feed
    pos = max(after, feed.first_seq - 1)
    while True:
        batch = feed.after(pos)
        if batch is None:  # fallen behind the feed's window: the store has them
            batch = await store.read_events(
                turn.session_id,
                after=pos,
                before=feed.published + 1,
                limit=REPLAY_BATCH,
                max_bytes=REPLAY_BATCH_BYTES,
            )
        if batch:
            pos = batch[-1].seq
            yield batch
            continue
        if feed.finished:
            return
        with trio.move_on_after(idle) as waited:
            await feed.wait(pos)
        if waited.cancelled_caught:
            yield []


async def read_log(
    source: LogSource,
    session_id: str,
    after: int,
    *,
    turn_id: str | None = None,
    follow: bool = False,
    idle: float = math.inf,
) -> AsyncIterator[list[LoggedEvent]]:
    """The session's logged events after seq ``after``, then the running turn live.

    Without ``follow`` it ends after the running turn (or after the replay
    if none runs); with ``follow`` it goes on with every later turn until
    the session is terminal or the server drains.  ``turn_id`` limits it to
    one turn.  Call ``check_cursor`` first.
    """
    store = source.store
    pos = after
    while True:
        # Taken before looking: a turn that starts from here on sets it.
        activity = source.activity(session_id)
        turn = source.running_turn(session_id)
        if turn is not None and turn_id is not None and turn.id != turn_id:
            turn = None
        before = turn.feed.first_seq if turn is not None else None
        if before is None or pos < before - 1:  # else nothing stored comes before the turn
            async for batch in read_stored(store, session_id, pos, before=before, turn_id=turn_id):
                pos = batch[-1].seq
                yield batch
        if turn is not None:
            async for batch in follow_turn(store, turn, pos, idle=idle):
                if batch:
                    pos = batch[-1].seq
                yield batch
        if not follow or turn_id is not None:
            return
        if turn is None:
            if source.draining or (await store.get(session_id)).status.terminal:
                return
            with trio.move_on_after(idle) as waited:
                await activity.wait()
            if waited.cancelled_caught:
                yield []
