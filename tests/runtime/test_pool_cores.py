"""The warm pool and the cores (issue 23), over real CPU-burning processes: CPU-bound
loads never outnumber the core budget (the CPUs less the turns past their first
event); a turn that takes a loading process gets its priority back and has the other
loads over the budget paused (SIGSTOP) until its first event, then resumed; the
default maximum is one process per core."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from tests.helpers import FAKE_ADAPTER
from trioserve.runtime._handle import ProcessHandle, stop_process
from trioserve.runtime._pool import WarmPool
from trioserve.runtime._process import Started
from trioserve.runtime._procinfo import read_stat


@asynccontextmanager
async def running_pool(pool: WarmPool) -> AsyncIterator[WarmPool]:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pool.run)
        try:
            yield pool
        finally:
            pool.close()


async def release(started: Started | None) -> None:
    assert started is not None
    await stop_process(started.proc, ProcessHandle(grace=1.0))


def state_of(pid: int) -> str:
    stat = read_stat(pid)
    assert stat is not None, f"pid {pid} is gone"
    return stat.state


async def until(check: object, what: str) -> None:
    """Wait (a safety-net deadline, not a measurement) until ``check()`` is true."""
    assert callable(check)
    with trio.fail_after(60):
        while not check():
            await trio.sleep(0.01)
    assert check(), what


async def test_cpu_bound_loads_never_outnumber_the_cores_less_the_busy_turns() -> None:
    # Two CPUs, one turn past its first event: one load at a time, never two.
    busy = [1]
    command = [*FAKE_ADAPTER, "--startup-burn", "0.3"]
    pool = WarmPool(command, 1, max_size=3, cpus=2, turns=lambda: busy[0], stop_grace=1.0)
    async with running_pool(pool):
        most = 0
        with trio.fail_after(60):
            await pool.wait_ready()
        assert pool.loads.cpu_work
        taken = [await pool.take() for _ in range(3)]
        assert pool.target == 3
        with trio.fail_after(60):
            while pool.ready < 3:
                most = max(most, pool.loading)
                await trio.sleep(0.005)
        assert most == 1, "the busy turn holds one of the two cores"
        busy[0] = 0  # the turn ended: two loads at once may run
        taken += [await pool.take() for _ in range(3)]
        with trio.fail_after(60):
            while pool.ready < 3:
                most = max(most, pool.loading)
                assert pool.loading <= 2
                await trio.sleep(0.005)
        for started in taken:
            if started is not None:
                await release(started)


async def test_before_the_first_load_is_measured_loads_count_as_cpu_work() -> None:
    # Four processes wanted at once on one core: they load one after the other.
    command = [*FAKE_ADAPTER, "--startup-burn", "0.2"]
    pool = WarmPool(command, 4, cpus=1, turns=lambda: 0, stop_grace=1.0)
    async with running_pool(pool):
        with trio.fail_after(60):
            while pool.ready < 4:
                assert pool.loading <= 1
                await trio.sleep(0.005)


async def test_a_turn_waiting_for_a_load_pauses_the_others_until_its_first_event() -> None:
    running = [0]
    command = [*FAKE_ADAPTER, "--startup-burn", "30"]  # loads that outlast the test
    pool = WarmPool(command, 2, cpus=2, turns=lambda: running[0], stop_grace=1.0)
    async with running_pool(pool):
        await until(lambda: pool.loading == 2, "two loads, one per core")
        first, other = pool.pids()
        assert pool.states() == {first: "loading", other: "loading"}
        # One turn past its first event holds a core; a second takes a loading process.
        running[0] = 2
        first_event = trio.Event()
        started = await pool.take(first_event.wait)
        assert started is not None and started.proc.pid == first  # the oldest load
        stat = read_stat(first)
        if os.geteuid() == 0:  # may raise priorities back
            assert stat is not None and stat.nice == os.getpriority(os.PRIO_PROCESS, 0)
        # One core for the turn's load: the pool's other load is stopped.
        assert pool.states() == {other: "paused"} and pool.paused == 1
        await until(lambda: state_of(other) == "T", "the other load is stopped")
        assert state_of(first) != "T", "the turn's own load runs on"
        assert pool.stats().paused == 1
        # No new process starts while the turn waits (no core for it).
        await trio.sleep(0.3)
        assert pool.pids() == [other]
        # Its first event: the other load runs again.
        first_event.set()
        await until(lambda: pool.paused == 0, "resumed after the first event")
        await until(lambda: state_of(other) != "T", "the other load runs again")
        assert pool.states()[other] == "loading"
        await release(started)
    assert state_of_gone(other)


async def test_a_paused_load_is_stopped_cleanly_when_the_pool_closes() -> None:
    running = [0]
    command = [*FAKE_ADAPTER, "--startup-burn", "30"]
    pool = WarmPool(command, 2, cpus=2, turns=lambda: running[0], stop_grace=1.0)
    async with running_pool(pool):
        await until(lambda: pool.loading == 2, "two loads")
        running[0] = 2
        never = trio.Event()
        started = await pool.take(never.wait)  # never has its first event
        assert started is not None
        (other,) = pool.pids()
        await until(lambda: state_of(other) == "T", "the other load is stopped")
    # The pool closed: its paused process got SIGCONT before the SIGINT, and is gone.
    assert state_of_gone(other)
    await release(started)


def state_of_gone(pid: int) -> bool:
    stat = read_stat(pid)
    return stat is None or stat.state == "Z"


async def test_the_default_maximum_is_one_process_per_core() -> None:
    pool = WarmPool(FAKE_ADAPTER, 1, cpus=3)
    assert (pool.floor, pool.ceiling) == (1, 3)
    assert WarmPool(FAKE_ADAPTER, 4, cpus=2).ceiling == 4
    assert WarmPool(FAKE_ADAPTER, 1, max_size=1, cpus=4).ceiling == 1
