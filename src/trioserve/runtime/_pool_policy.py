"""What the warm pool decides: load times, which process a turn gets, how many to keep.

The warm pool (``_pool.py``) holds processes and runs a keeper task for
each; the decisions it makes about them are here, as functions of what it
holds and what it has measured, with no I/O but ``/proc`` reads.

**Loading and ready.**  A process is *loading* from its spawn until it has
finished loading: until it blocks reading its stdin and its CPU time stops
growing (``trioserve.runtime._procinfo.LoadWatch``, which falls back to
"quiet for ``QUIET`` seconds" where /proc says nothing).  Then it is
*ready*.  The time from spawn to ready is the command's *load time*; the
pool keeps the median of the last ones (wall and CPU) in ``LoadTimes``.

**Which process a turn gets** (``choose``).  A ready one if there is one,
the one that has been ready longest.  Otherwise the loading one that will
be ready soonest, if that is sooner than a cold start (the load time): for
a load that is CPU work (its main thread ran or waited to run for a third
of it or more, ``/proc/PID/schedstat``, or its process tree used that much
CPU), by the share of the load's CPU time it has had so far; otherwise by
its age, but never sooner than that CPU share says (a process asleep since
its spawn, stuck before its load, is not nearly loaded however old it is,
even when a busy machine made the loads look like sleeping).  One no
later than a cold start (just started) is taken too if it is running and
can get its priority back: a cold start would only load beside it.
Otherwise (it sleeps, is stuck) none is taken, and the turn starts its
own, cold.

**Not stealing from the turn** (``may_start``, ``to_pause``).  When loading
is not CPU work, while turns wait for their first event on a machine with
fewer free cores than running turns, no new process starts.  When it is CPU
work (or not measured yet), the loads never outnumber the *core budget*: the CPUs less the turns
past their first event (``core_budget``; at least one, a load niced 10 gets
only what the turns leave).  Loads are the pool's loading processes, those
about to start and the turns waiting for their first event (each waits for
a load, its own or the one it took).  More loads than cores would only make
each one, and so the next ready process, later.  When a turn must wait for
a loading process and the loads are over the budget, the pool's other
loading processes are paused (SIGSTOP) until it has its first event, the
newest first: the turn waits about one load time, never more.

The "sooner than cold" test uses the *uncontended* load time
(``LoadTimes.uncontended``): the fastest recent load, and for CPU work no
more than its CPU time.  The median of loads that ran beside others grows
with the pool's own contention and would make it wait for loading
processes longer than a cold start takes.

**Size** (``TurnRate``).  ``floor`` processes at least, ``ceiling`` at
most.  The target follows the recent turn rate: the number of ``take``
calls in the last load time (a turn arriving every load time needs one
process loading while another serves it; two per load time need two, and
so on), clamped to ``floor..ceiling``.

**Standing down.**  An adapter that loads at once gains nothing from the
pool: a turn that starts it waits a millisecond or two, while every
process the pool keeps costs the server its keeper, its load watch and
two renices (about 1 ms of CPU a turn with the bench's C adapter).  When
the pool finds a new process already reading its stdin at its first look,
within ``INSTANT`` of its spawn (a compiled program, not an interpreter),
``INSTANT_LOADS`` times in a row, it *stands down*: it stops its
processes, keeps none and lets every turn start its own.  A late first
look (a busy machine) does not count: it cannot tell a fast load.
"""

from __future__ import annotations

import itertools
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import trio

from trioserve.runtime._child import ExecProcess
from trioserve.runtime._process import StderrTail
from trioserve.runtime._procinfo import LoadWatch, read_stat

#: Where /proc cannot tell: loaded once its CPU time has not grown for this long.
QUIET = 0.25
#: Load times kept per command (their median is the load time).
_LOADS_KEPT = 16
#: What a spawn adds to a load's CPU time, for the uncontended load time.
_SPAWN_COST = 0.02
#: CPU time a loading process shows before any of its load: the kernel counts in
#: 10 ms ticks, and a wrapper (a shell, an interpreter's start) runs first.
_CPU_NOISE = 0.03
#: Until a load time is known: the window of the turn rate, the first-event wait.
DEFAULT_LOAD = 1.0


@dataclass(eq=False)
class Warm:
    """A process the pool holds, loading or ready (its keeper's record of it)."""

    proc: ExecProcess
    spawned_at: float
    watch: LoadWatch
    ready_at: float | None = None
    tail: StderrTail = field(default_factory=StderrTail)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    released: trio.Event = field(default_factory=trio.Event)
    stderr_done: trio.Event = field(default_factory=trio.Event)
    taken: bool = False
    paused: bool = False  # SIGSTOPped while a turn waits for another load


#: A process reading its stdin at the pool's first look, this soon after its spawn,
#: loaded at once; after ``INSTANT_LOADS`` of those in a row the pool stands down.
INSTANT = 0.01
INSTANT_LOADS = 3
#: The backoff after a process died while idle: 0.1 s, doubling, at most 30 s.
_BACKOFF_FIRST = 0.1
_BACKOFF_MAX = 30.0


@dataclass(frozen=True)
class PoolStats:
    """The pool's figures, for ``/readyz`` (and metrics)."""

    ready: int  # loaded, waiting for a turn
    loading: int  # started, still loading (paused ones too)
    paused: int  # loading, stopped while a turn waits for another load
    target: int  # processes the pool keeps now
    floor: int  # --warm-adapters
    ceiling: int  # --warm-adapters-max
    load_seconds: float | None  # median spawn-to-ready time, once measured
    load_cpu_seconds: float | None  # the CPU time of those loads (median)
    turns_per_load: int  # turns that asked in the last load time
    standing_down: bool  # the adapter loads at once: the pool keeps none


def state_of(warm: Warm) -> str:
    if warm.ready_at is not None:
        return "ready"
    return "paused" if warm.paused else "loading"


def backoff(failures: int) -> float:
    return float(min(_BACKOFF_FIRST * 2 ** (failures - 1), _BACKOFF_MAX))


class LoadTimes:
    """The last load times of the pool's command: median wall and CPU seconds."""

    def __init__(self, keep: int = _LOADS_KEPT) -> None:
        self._wall: deque[float] = deque(maxlen=keep)
        self._cpu: deque[float] = deque(maxlen=keep)
        self._wanted: deque[float] = deque(maxlen=keep)

    def add(self, wall: float, cpu: float, wanted: float | None = None) -> None:
        """A load: its wall and CPU seconds, and how long it ran or waited to run."""
        self._wall.append(wall)
        self._cpu.append(cpu)
        # The CPU it used it wanted, whatever schedstat says: that counts the leader's
        # thread only (a shell's child may do the work), and on a VM not the time a
        # hypervisor steals from it while it runs.  Without schedstat, the CPU time.
        self._wanted.append(cpu if wanted is None else max(wanted, cpu))

    @property
    def cpu_work(self) -> bool:
        """Whether loading is CPU work: it wanted the CPU a third of the time or more.

        (A CPU-bound load wants it nearly all along; the rest of its measured
        time is spawning and noticing it is ready.  One that sleeps or waits
        for I/O wants it a few percent of the time.)
        """
        wall = self.wall
        return wall is not None and statistics.median(self._wanted) >= wall / 3

    @property
    def uncontended(self) -> float | None:
        """The load time on a core of its own: the fastest recent load, for CPU work at
        most its CPU time (and a little for the spawn)."""
        if not self._wall:
            return None
        fastest = min(self._wall)
        cpu = self.cpu
        if self.cpu_work and cpu is not None:
            return min(fastest, cpu + _SPAWN_COST)
        return fastest

    @property
    def count(self) -> int:
        return len(self._wall)

    @property
    def wall(self) -> float | None:
        return statistics.median(self._wall) if self._wall else None

    @property
    def cpu(self) -> float | None:
        return statistics.median(self._cpu) if self._cpu else None

    def load_time(self) -> float:
        """The load time, or ``DEFAULT_LOAD`` until one is measured."""
        return self.wall or DEFAULT_LOAD


class TurnRate:
    """When turns asked for a process; how many the pool should keep for that rate."""

    def __init__(self) -> None:
        self._asked: deque[float] = deque(maxlen=1024)

    def asked(self, now: float) -> None:
        self._asked.append(now)

    def recent(self, now: float, window: float) -> int:
        """How many turns asked in the last ``window`` seconds."""
        since = now - window
        return sum(1 for _ in itertools.takewhile(lambda t: t >= since, reversed(self._asked)))


def wanted(recent_turns: int, floor: int, ceiling: int) -> int:
    """The pool's size for the recent turns, clamped to ``floor..ceiling``."""
    return min(ceiling, max(floor, recent_turns))


def choose(held: Sequence[Warm], loads: LoadTimes, now: float, *, may_renice: bool) -> Warm | None:
    """The ready process that has waited longest, else a loading one worth waiting for."""
    alive = [w for w in held if w.proc.poll() is None]  # the dead: keepers reap them
    ready = [w for w in alive if w.ready_at is not None]
    if ready:
        return min(ready, key=ready_order)
    cold = loads.uncontended
    if not alive:
        return None
    if cold is None:  # nothing measured yet: the oldest has a head start
        return alive[0]
    remaining = {w: _remaining(w, loads, now, cold) for w in alive}
    soonest = min(alive, key=remaining.__getitem__)
    if remaining[soonest] < cold:
        return soonest
    # No sooner, no later (just started): it saves a load beside it, if it
    # is running (not stuck) and gets full priority back.
    stat = read_stat(soonest.proc.pid)
    running = stat is not None and stat.state == "R"
    return soonest if running and may_renice else None


def _remaining(warm: Warm, loads: LoadTimes, now: float, load: float) -> float:
    """Seconds until ``warm`` has loaded: by the share of the load's CPU time it has had
    and, unless loading is CPU work, by its age too (the later of the two)."""
    by_cpu = 0.0
    cpu = loads.cpu
    if cpu is not None and cpu > _CPU_NOISE:  # no further along than its share of the CPU
        stat = read_stat(warm.proc.pid)
        used = max(warm.watch.cpu_seconds, stat.cpu_seconds if stat is not None else 0.0)
        by_cpu = load * max(0.0, 1.0 - max(0.0, used - _CPU_NOISE) / (cpu - _CPU_NOISE))
    if loads.cpu_work:
        return by_cpu
    return max(by_cpu, load - (now - warm.spawned_at))


def may_start(
    *, free_cores: float, running: int, awaiting: int, loading: int, cpu_work: bool, cpus: int
) -> bool:
    """Whether a new process may start loading now (see "Not stealing" in the module doc).

    ``awaiting``: turns before their first event; ``loading``: adapters
    loading now (the pool's, those about to start, the awaiting turns').
    """
    if cpu_work:  # the core budget counts the waiting turns' loads; ours run at nice 10
        return loading < core_budget(cpus, running - awaiting)
    return not (awaiting and free_cores < running)  # the turns' first events come first


def core_budget(cpus: int, busy: int) -> int:
    """How many CPU-bound loads may run at once: the CPUs less ``busy`` turns (those past
    their first event), at least one (niced, it takes what the turns leave)."""
    return max(1, cpus - max(0, busy))


def to_pause(loading: Sequence[Warm], *, cpus: int, running: int, awaiting: int) -> set[Warm]:
    """The pool's loading processes to pause while turns wait for their first event.

    ``loading``: the pool's loading processes, oldest first; ``running``: turns
    in flight; ``awaiting``: those of them before their first event.  With no
    turn waiting nothing is paused; otherwise the loads (the waiting turns' and
    the pool's) are cut to the core budget, the newest paused first.
    """
    if not awaiting:
        return set()
    room = max(0, core_budget(cpus, running - awaiting) - awaiting)
    return set(loading[room:])


def ready_order(warm: Warm) -> float:
    return warm.ready_at if warm.ready_at is not None else float("inf")
