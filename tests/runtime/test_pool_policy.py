"""The warm pool's decisions on their own (no processes): sizing, starting, load times."""

from __future__ import annotations

from typing import cast

import pytest

from trioserve.runtime._child import ExecProcess
from trioserve.runtime._pool_policy import (
    DEFAULT_LOAD,
    LoadTimes,
    TurnRate,
    Warm,
    choose,
    core_budget,
    may_start,
    to_pause,
    wanted,
)
from trioserve.runtime._procinfo import LoadWatch


def test_the_turn_rate_counts_the_asks_inside_the_window() -> None:
    rate = TurnRate()
    for t in (1.0, 2.0, 2.5, 3.0):
        rate.asked(t)
    assert rate.recent(3.0, 1.0) == 3  # 2.0, 2.5, 3.0
    assert rate.recent(3.0, 0.4) == 1
    assert rate.recent(10.0, 1.0) == 0


@pytest.mark.parametrize(
    ("recent", "floor", "ceiling", "size"),
    [(0, 1, 4, 1), (3, 1, 4, 3), (9, 1, 4, 4), (2, 2, 2, 2)],
)
def test_the_size_follows_the_rate_within_floor_and_ceiling(
    recent: int, floor: int, ceiling: int, size: int
) -> None:
    assert wanted(recent, floor, ceiling) == size


@pytest.mark.parametrize(
    ("free", "running", "awaiting", "loading", "cpu_work", "allowed"),
    [
        (0.5, 2, 1, 1, False, False),  # turns wait for first events, fewer free cores
        (2.0, 2, 1, 1, False, True),  # enough free cores for the running turns
        (0.0, 2, 0, 1, False, True),  # no turn waits: not held back by cores
        (4.0, 0, 0, 2, True, False),  # CPU-bound loads: one per core already
        (4.0, 0, 0, 1, True, True),
        (4.0, 0, 0, 5, False, True),  # loads that sleep: any number
    ],
)
def test_a_new_process_starts_only_when_it_steals_from_no_turn(
    free: float, running: int, awaiting: int, loading: int, cpu_work: bool, allowed: bool
) -> None:
    decision = may_start(
        free_cores=free,
        running=running,
        awaiting=awaiting,
        loading=loading,
        cpu_work=cpu_work,
        cpus=2,
    )
    assert decision is allowed


def test_load_times_keep_the_median_and_say_whether_loading_is_cpu_work() -> None:
    loads = LoadTimes(keep=3)
    assert loads.wall is None and not loads.cpu_work
    assert loads.load_time() == DEFAULT_LOAD
    for wall, cpu in ((1.0, 0.9), (3.0, 0.8), (2.0, 1.0), (2.2, 0.95)):
        loads.add(wall, cpu)
    assert loads.count == 3  # the oldest dropped
    assert loads.wall == 2.2 and loads.cpu == 0.95 and loads.load_time() == 2.2
    assert loads.cpu_work  # wanted the CPU 0.95 of 2.2 s: over a third
    sleepy = LoadTimes()
    sleepy.add(2.0, 0.1, wanted=0.2)
    assert not sleepy.cpu_work
    # schedstat saw the leader want the CPU 0.3 of 1.5 s, but the load used 0.52 s of
    # it (a child's, or time a hypervisor stole from the running thread): CPU work.
    stolen = LoadTimes()
    stolen.add(1.5, 0.52, wanted=0.3)
    assert stolen.cpu_work


@pytest.mark.parametrize(
    ("cpus", "busy", "budget"),
    [(2, 0, 2), (2, 1, 1), (2, 2, 1), (2, 5, 1), (8, 3, 5)],
)
def test_the_core_budget_is_the_cpus_less_the_busy_turns_at_least_one(
    cpus: int, busy: int, budget: int
) -> None:
    assert core_budget(cpus, busy) == budget


@pytest.mark.parametrize(
    ("running", "awaiting", "loading", "cpu_work", "allowed"),
    [
        (1, 0, 1, True, False),  # one busy turn on two cores: one load at a time
        (1, 0, 0, True, True),
        (2, 1, 1, True, False),  # a busy turn and a waiting one: the waiting turn's load
        (3, 0, 0, True, True),  # every core busy: still one (niced) load
        (3, 0, 1, True, False),
        (3, 0, 4, False, True),  # loads that sleep: no core bound
    ],
)
def test_busy_turns_take_cores_from_the_loads(
    running: int, awaiting: int, loading: int, cpu_work: bool, allowed: bool
) -> None:
    decision = may_start(
        free_cores=2.0,
        running=running,
        awaiting=awaiting,
        loading=loading,
        cpu_work=cpu_work,
        cpus=2,
    )
    assert decision is allowed


def test_the_loads_over_the_budget_are_paused_newest_first_only_while_turns_wait() -> None:
    held = [object(), object(), object()]  # stand-ins: to_pause only slices the sequence
    loading = cast("list[Warm]", held)
    assert to_pause(loading, cpus=2, running=0, awaiting=0) == set()
    # One turn waits for a load on two idle cores: one pool load runs beside it.
    assert to_pause(loading, cpus=2, running=1, awaiting=1) == set(held[1:])
    # One busy turn too: the waiting turn's load has the only core left.
    assert to_pause(loading, cpus=2, running=2, awaiting=1) == set(held)
    assert to_pause(loading, cpus=3, running=1, awaiting=1) == {held[2]}
    assert to_pause(loading[:2], cpus=3, running=1, awaiting=1) == set()


def test_the_uncontended_load_time_is_the_fastest_and_at_most_the_cpu_time() -> None:
    loads = LoadTimes()
    assert loads.uncontended is None
    for wall, cpu in ((1.4, 0.85), (1.1, 0.86), (1.6, 0.84)):
        loads.add(wall, cpu)  # loads beside each other: slower than their CPU time
    assert loads.wall == 1.4
    assert loads.uncontended == pytest.approx(0.85 + 0.02)
    sleepy = LoadTimes()
    for wall in (2.0, 1.5, 3.0):
        sleepy.add(wall, 0.1, wanted=0.1)
    assert sleepy.uncontended == 1.5  # not CPU work: the fastest load


@pytest.mark.parametrize("free", [0.0, 0.5, 2.0])
def test_cpu_bound_loads_follow_the_budget_not_the_free_cores_reading(free: float) -> None:
    # A turn waits for its load (a core); the other core is the pool's, at nice 10, however
    # busy /proc/stat says the machine is (other work outranks a niced load anyway).
    assert may_start(free_cores=free, running=1, awaiting=1, loading=1, cpu_work=True, cpus=2)
    assert not may_start(free_cores=free, running=1, awaiting=1, loading=2, cpu_work=True, cpus=2)
    # Loads that sleep still wait for the turns' first events when the cores are short.
    assert may_start(free_cores=free, running=1, awaiting=1, loading=1, cpu_work=False, cpus=2) is (
        free >= 1
    )


class _Gone:
    """A process stand-in /proc knows nothing of (no such pid): alive to ``poll``."""

    pid = 2**22 + 1  # above the kernel's pid_max

    def poll(self) -> None:
        return None


@pytest.mark.parametrize(("used", "taken"), [(0.0, False), (0.02, False), (0.15, True)])
def test_a_loading_process_is_sooner_than_cold_only_with_real_progress(
    used: float, taken: bool
) -> None:
    # CPU-bound loads of 0.3 s.  A process that shows a tick or two of CPU
    # (a shell that started it, held up before the load) is no sooner than
    # a cold start: the turn starts cold rather than wait for it.
    loads = LoadTimes()
    for _ in range(3):
        loads.add(0.35, 0.3)
    watch = LoadWatch(_Gone.pid, None, quiet=0.25, now=0.0)
    watch.cpu_seconds = used
    warm = Warm(proc=cast("ExecProcess", _Gone()), spawned_at=0.0, watch=watch)
    chosen = choose([warm], loads, now=0.1, may_renice=True)
    assert (chosen is warm) is taken


@pytest.mark.parametrize(
    ("cpu", "used", "age", "taken"),
    [
        (0.53, 0.0, 2.5, False),  # older than a load, none of its CPU: stuck, not nearly done
        (0.53, 0.5, 2.5, True),  # older, and its CPU nearly used: nearly loaded
        (0.02, 0.0, 2.5, True),  # loads that hardly use the CPU: its age tells
    ],
)
def test_a_load_that_looked_like_sleeping_still_needs_its_cpu(
    cpu: float, used: float, age: float, taken: bool
) -> None:
    # On a busy machine a CPU-bound load can look like sleeping (it waited on
    # the disk, or its ready was seen late): 0.53 s of CPU in 1.8 s.  A held
    # process that has slept since its spawn (a wrapper waiting on something)
    # is no sooner than cold however old it is: the turn starts its own.
    loads = LoadTimes()
    loads.add(1.8, cpu, wanted=cpu)
    assert not loads.cpu_work
    watch = LoadWatch(_Gone.pid, None, quiet=0.25, now=0.0)
    watch.cpu_seconds = used
    warm = Warm(proc=cast("ExecProcess", _Gone()), spawned_at=0.0, watch=watch)
    chosen = choose([warm], loads, now=age, may_renice=True)
    assert (chosen is warm) is taken
