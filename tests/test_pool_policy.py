"""The warm pool's decisions on their own (no processes): sizing, starting, load times."""

from __future__ import annotations

import pytest

from trioserve.runtime._pool_policy import DEFAULT_LOAD, LoadTimes, TurnRate, may_start, wanted


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
