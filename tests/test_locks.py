"""``Mutex``: a free lock taken with no trip to the scheduler, a held one waited for."""

from __future__ import annotations

from functools import partial

import trio
import trio.testing

from trioserve.locks import Mutex


async def test_a_free_mutex_is_taken_without_yielding() -> None:
    mutex = Mutex()
    with trio.testing.assert_no_checkpoints():  # trio.Lock's acquire yields here
        async with mutex:
            assert mutex.locked()
    assert not mutex.locked()
    with trio.testing.assert_checkpoints():  # trio.Lock's does
        async with trio.Lock():
            pass


async def test_a_held_mutex_is_waited_for_in_turn_and_a_wait_can_be_cancelled() -> None:
    mutex, order = Mutex(), []
    gave_up = trio.CancelScope()

    async def take(name: str) -> None:
        async with mutex:
            order.append(name)

    async def give_up() -> None:
        with gave_up:
            async with mutex:
                order.append("never")

    async with trio.open_nursery() as nursery, mutex:
        for start in (partial(take, "a"), give_up, partial(take, "b")):
            nursery.start_soon(start)  # each waits before the next starts
            await trio.testing.wait_all_tasks_blocked()
        assert order == []  # all three wait
        gave_up.cancel()
        await trio.testing.wait_all_tasks_blocked()
    assert order == ["a", "b"]
    assert gave_up.cancelled_caught and not mutex.locked()
