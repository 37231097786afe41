"""The lines of waiting turns (``sessions._queue``): order, holds, a waiting turn's stream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import trio
import trio.testing

from trioserve.protocol import TurnStatus
from trioserve.sessions._queue import QueuedTurn, TurnQueues, queued_events
from trioserve.sessions._turns import Turn
from trioserve.stores.base import LoggedEvent, TurnEnd, TurnRecord

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def waiting(tid: str, sid: str = "s1", position: int = 1) -> QueuedTurn:
    record = TurnRecord(tid, sid, "hi", TurnStatus.QUEUED, T0)
    return QueuedTurn(record, "cancel", None, None, position)


def test_heads_are_first_come_first_served_per_idle_unheld_session() -> None:
    queues = TurnQueues(8)
    a1, a2, b1, c1 = (
        waiting("a1", "a"),
        waiting("a2", "a", 2),
        waiting("b1", "b"),
        waiting("c1", "c"),
    )
    for queued in (a1, b1, a2, c1):
        queues.add(queued)
    assert bool(queues) and queues.waiting("a") == 2 and queues.find("a", "a2") is a2
    queues.hold("c")
    assert queues.heads(running=lambda sid: sid == "b") == [a1]  # b runs a turn, c is held
    queues.unhold("c")
    assert queues.remove(a1) and not queues.remove(a1)
    assert queues.heads(running=lambda sid: False) == [a2, b1, c1]
    for queued in (a2, b1, c1):
        queues.remove(queued)
    assert not queues and queues.waiting("a") == 0


async def test_a_waiting_turns_stream_ends_as_it_leaves_the_line() -> None:
    queued = waiting("t1", position=3)
    got: list[tuple[str, dict[str, object]]] = []

    async def read() -> None:
        async for batch in queued_events(queued, follow=_never):
            for event in batch:
                assert event.seq == 0  # not logged
                got.append((event.type, json.loads(event.raw)["data"]))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        assert got == [("trioserve.queued", {"position": 3, "turnId": "t1"})]
        queued.ended_unstarted(TurnEnd(TurnStatus.CANCELLED, "cancelled", T0))
    assert got[-1][0] == "session.ended"
    assert got[-1][1]["reason"] == "cancelled"


async def test_draining_ends_a_waiting_turns_stream_without_an_end() -> None:
    queues = TurnQueues(8)
    queued = waiting("t1")
    queues.add(queued)
    batches = []
    async with trio.open_nursery() as nursery:

        async def read() -> None:
            async for batch in queued_events(queued, follow=_never):
                batches.append(batch)

        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        queues.close()
    assert [e.type for b in batches for e in b] == ["trioserve.queued"]
    assert queues.closed


async def _never(turn: Turn) -> AsyncIterator[list[LoggedEvent]]:  # it never starts
    raise AssertionError("not started")
    yield []
