"""A turn's feed and log writer on their own: numbering, hold-back, the memory window."""

from __future__ import annotations

import random
from typing import Any

import pytest
import trio

from trioserve.errors import StoreError
from trioserve.protocol import SessionStatus, TurnStatus
from trioserve.runtime import _wire as wire
from trioserve.runtime._lifecycle import TurnState
from trioserve.sessions._feed import Feed
from trioserve.sessions._turns import Turn, TurnLog
from trioserve.stores import LoggedEvent, MemoryStore, Session, TurnEnd, TurnRecord, utcnow


def entry(seq: int, size: int = 10, kind: str = "message") -> LoggedEvent:
    return LoggedEvent(seq, "t_1", kind, b"x" * size)


def test_feed_serves_what_follows_a_cursor() -> None:
    feed = Feed(first_seq=5)
    assert feed.after(4) == []
    feed.publish([entry(5), entry(6), entry(7)])
    assert [e.seq for e in feed.after(4) or []] == [5, 6, 7]
    assert [e.seq for e in feed.after(6) or []] == [7]
    assert feed.after(7) == []


def test_feed_window_drops_old_events_and_says_so() -> None:
    feed = Feed(first_seq=1, window_bytes=100)
    feed.publish([entry(seq, size=30) for seq in range(1, 11)])
    kept = feed.after(9)
    assert [e.seq for e in kept or []] == [10]
    assert feed.after(0) is None, "evicted events must be read from the store"
    assert [e.seq for e in feed.after(7) or []] == [8, 9, 10]
    # One event larger than the window is still kept.
    feed.publish([entry(11, size=1000)])
    assert [e.seq for e in feed.after(10) or []] == [11]


@pytest.mark.parametrize("seed", range(20))
def test_feed_window_keeps_the_fewest_newest_events_that_fill_it(seed: int) -> None:
    """Batches of any size, events of any size, far past the window: the feed keeps
    exactly the newest events whose bytes fit the window (at least one), and says
    ``None`` for a cursor before them."""
    rng = random.Random(seed)
    window = rng.choice([1, 100, 5_000])
    feed, seq, sizes = Feed(first_seq=1, window_bytes=window), 1, dict[int, int]()
    for _ in range(60):
        batch = [
            entry(s, size=rng.choice([1, 7, 30, 800, 6_000]))
            for s in range(seq, seq + rng.randint(1, 1_500))
        ]
        feed.publish(batch)
        sizes |= {e.seq: len(e.raw) for e in batch}
        seq += len(batch)
        kept, total = seq - 1, sizes[seq - 1]
        while kept > 1 and total + sizes[kept - 1] <= window:
            kept -= 1
            total += sizes[kept]
        assert [e.seq for e in feed.after(kept - 1) or []] == list(range(kept, seq))
        assert feed.after(kept - 2) is None or kept == 1


async def test_feed_wait_wakes_on_publish_and_finish() -> None:
    feed = Feed(first_seq=1)
    woke: list[str] = []

    async def waiter() -> None:
        await feed.wait(0)
        woke.append("published")
        await feed.wait(1)
        woke.append("finished")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        feed.publish([entry(1)])
        await trio.testing.wait_all_tasks_blocked()
        assert woke == ["published"]
        feed.finish()
    assert woke == ["published", "finished"]


async def _turn(store: MemoryStore) -> Turn:
    now = utcnow()
    await store.create(Session("s_1", "a", "exec", SessionStatus.ACTIVE, now, now))
    record = TurnRecord("t_1", "s_1", "hi", TurnStatus.RUNNING, now)
    await store.create_turn(record)
    return Turn(record, Feed(first_seq=1), TurnState("s_1"))


def _completed() -> TurnEnd:
    return TurnEnd(TurnStatus.COMPLETED, "completed", utcnow())


async def test_turn_log_numbers_stores_then_publishes_and_holds_the_last_event() -> None:
    store = MemoryStore()
    turn = await _turn(store)
    log = TurnLog(store, turn)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(log.run)
        await log.send(wire.synthesize("session.started", "s_1", {}))
        await log.send(wire.synthesize("message", "s_1", {"n": 1}))
        await log.send(wire.synthesize("session.ended", "s_1", {"reason": "completed"}))
        await trio.testing.wait_all_tasks_blocked()
        stored = await store.read_events("s_1")
        assert [e.seq for e in stored] == [1, 2, 3]
        # Stored, but session.ended waits until the turn has let go.
        assert [e.type for e in turn.feed.after(0) or []] == ["session.started", "message"]
        nursery.cancel_scope.cancel()
    await log.close(_completed())
    log.finish()
    assert [e.seq for e in turn.feed.after(0) or []] == [1, 2, 3]
    assert turn.feed.finished
    record = await store.get_turn("s_1", "t_1")
    assert (record.status, record.first_seq, record.last_seq) == (TurnStatus.COMPLETED, 1, 3)
    assert all(e.raw.startswith(b'{"seq":%d,' % e.seq) for e in stored)


async def test_turn_log_keeps_a_batch_whose_write_was_cancelled() -> None:
    store = MemoryStore()
    turn = await _turn(store)
    log = TurnLog(store, turn)
    log.add(wire.synthesize("message", "s_1", {"n": 1}))
    with trio.CancelScope() as scope:
        scope.cancel()
        await log.close(_completed())  # cancelled before the store acted
    assert await store.read_events("s_1") == []
    turn.stop("cancelled")
    await log.close(log.end_turn())
    stored = await store.read_events("s_1")
    assert [e.type for e in stored] == ["message", "session.ended"]
    record = await store.get_turn("s_1", "t_1")
    assert (record.status, record.reason) == (TurnStatus.CANCELLED, "cancelled")


class FailingEnd(MemoryStore):
    """A store whose disk fills up just when a turn's last events are written."""

    async def append_events(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("end") is not None:
            raise StoreError("disk full")
        await super().append_events(*args, **kwargs)


async def test_readers_still_see_the_end_when_the_last_write_fails() -> None:
    store = FailingEnd()
    turn = await _turn(store)
    log = TurnLog(store, turn)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(log.run)
        await log.send(wire.synthesize("message", "s_1", {"n": 1}))
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    log.add(wire.synthesize("session.ended", "s_1", {"reason": "completed"}))
    with pytest.raises(StoreError):
        await log.close(_completed())
    log.finish()
    assert [e.type for e in turn.feed.after(0) or []] == ["message", "session.ended"]
    assert turn.feed.finished
    assert [e.seq for e in await store.read_events("s_1")] == [1], "only the first was stored"
