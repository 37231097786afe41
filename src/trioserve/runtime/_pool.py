"""The warm pool: adapter processes started ahead of their turns.

A real runtime adapter spends most of a short turn starting up (a Node
adapter loads its libraries for about a second of CPU before it reads its
stdin).  The pool keeps adapter processes started; a turn takes one
(``take``), writes its CompiledSpec to it and owns it from then on, exactly
as if it had started it.

What it decides (which process a turn gets, how many it keeps, when a new
one may start) is in ``_pool_policy.py``, with the reasons.  The pool's
processes start at nice ``nice`` (lower priority) and get the server's own
priority back when a turn takes them (when the server may raise
priorities: CAP_SYS_NICE or RLIMIT_NICE; otherwise they keep it).  While
turns wait for their first event (at most twice the load time), the pool
may hold back new processes; and a turn that took a *ready* process holds
back every new one until its first event is out (at most
``WARM_FIRST_EVENT``): its adapter has loaded, so that event is
milliseconds away, and a spawn (fork, exec, the new process's start) on
the same cores would only delay it.  A process above the floor that has waited
``max_idle`` is stopped and not replaced unless the rate still wants it,
so the pool shrinks back to its floor.

Each process has a *keeper* task in the pool's nursery that starts it,
collects what it prints on stderr while it waits (the turn's stderr tail
begins with it), watches it load, and watches it:

- taken by a turn: the keeper lets go of it (its stderr reader stops before
  ``take`` returns, so the turn is the only reader) and starts the next one;
- it died while idle: it is reaped and a new one started, after a backoff
  that grows while processes keep dying (a broken adapter does not spin);
- idle longer than ``max_idle``: stopped like any adapter, and replaced
  unless the pool is shrinking;
- the pool closes (drain, shutdown): stopped and reaped, shielded.

A keeper holds one process at a time and replaces it only once the old one
is gone, and there are never more than ``ceiling`` keepers, so with the turn
cap the server never runs more than ``max_concurrent_turns + ceiling``
adapters.  Every pid is registered with the guard (the reaper) while the
pool holds it.

For an adapter that loads at once the pool stands down (``_pool_policy``).

(Over 400 lines on purpose: the keepers are methods that read and change
the pool's own state, its held processes, target and counters; in a module
of their own they would reach into the pool's private fields.  What can be
decided apart from that state is in ``_pool_policy.py``.)
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

import trio

from trioserve.runtime._child import ExecProcess, exec_process
from trioserve.runtime._handle import ProcessHandle, stop_process
from trioserve.runtime._pool_policy import (
    INSTANT,
    INSTANT_LOADS,
    QUIET,
    LoadTimes,
    PoolStats,
    TurnRate,
    Warm,
    backoff,
    choose,
    may_start,
    ready_order,
    state_of,
    to_pause,
    wanted,
)
from trioserve.runtime._process import ProcessGuard, Started
from trioserve.runtime._procinfo import (
    CpuMeter,
    LoadWatch,
    PipeId,
    cpu_wanted,
    set_nice,
    signal_group,
)

log = logging.getLogger("trioserve.pool")

_EXIT_DRAIN = 1.0  # after a process died: time for its stderr to reach EOF
#: How often a loading process is looked at: first after 10 ms, doubling to 50 ms.
_CHECK_FIRST = 0.01
_CHECK_INSTANT = 0.002  # the first look for a load at once (``INSTANT``): 2 ms, doubling
_CHECK_MAX = 0.05
#: While a process may not start: how often the free cores are looked at again.
_RECHECK = 0.1
#: A process started this recently is not in the free-core reading yet.
_SPAWN_UNSEEN = 0.2
#: The longest a turn on a ready process holds back new processes (its first event).
WARM_FIRST_EVENT = 0.05
#: The nice value of a process the pool starts.
NICE = 10


class WarmPool:
    """Adapter processes started ahead of their turns; see the module doc."""

    def __init__(
        self,
        command: Sequence[str],
        size: int,
        *,
        max_size: int | None = None,
        max_idle: float = 600.0,
        stop_grace: float = 5.0,
        guard: ProcessGuard | None = None,
        turns: Callable[[], int] | None = None,
        cpus: int | None = None,
        nice: int = NICE,
    ) -> None:
        self.command = list(command)
        self._meter = CpuMeter(cpus)
        self.floor = size
        # By default the pool may grow to one process per core: two cores load two at
        # once (a turn every half load time); more would only load beside each other.
        self.ceiling = max(size, max_size if max_size is not None else self._meter.cpus)
        self.target = size
        self.max_idle = max_idle
        self.nice = nice
        self.loads = LoadTimes()
        #: Set once the first load time is known.
        self.first_load = trio.Event()
        self._stop_grace = stop_grace
        self._guard = guard
        self._turns = turns
        self._held: list[Warm] = []  # loading and ready, in spawn order
        self._rate = TurnRate()  # when turns called take
        self._awaiting: set[trio.CancelScope] = set()  # turns before their first event
        self._warm_first: dict[trio.CancelScope, float] = {}  # those on a ready process: until
        self._spawns: deque[float] = deque(maxlen=64)  # when processes were let start
        self._starting = 0  # let start, not held yet
        self._closed = False
        self._changed = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._base_nice = os.getpriority(os.PRIO_PROCESS, 0)
        self._may_renice = True
        #: Set once the adapter has loaded at once ``INSTANT_LOADS`` times in a row.
        self.standing_down = False
        self._instant = 0  # loads at once in a row

    # -- what it holds -----------------------------------------------------------

    @property
    def ready(self) -> int:
        """How many processes have loaded and wait for a turn."""
        return sum(1 for warm in self._held if warm.ready_at is not None)

    @property
    def loading(self) -> int:
        """How many processes are started and still loading."""
        return len(self._held) - self.ready

    def pids(self) -> list[int]:
        """Every process the pool holds, loading or ready."""
        return [warm.proc.pid for warm in self._held]

    def ready_pids(self) -> list[int]:
        """The ready processes, the one ready longest first (the next ``take`` gets it)."""
        ready = sorted((w for w in self._held if w.ready_at is not None), key=ready_order)
        return [warm.proc.pid for warm in ready]

    @property
    def paused(self) -> int:
        """How many loading processes are paused while turns wait for their first event."""
        return sum(1 for warm in self._held if warm.paused)

    def states(self) -> dict[int, str]:
        """``pid: "ready" | "loading" | "paused"`` for every process the pool holds."""
        return {w.proc.pid: state_of(w) for w in self._held}

    def stats(self) -> PoolStats:
        return PoolStats(
            ready=self.ready,
            loading=self.loading,
            paused=self.paused,
            target=self.target,
            floor=self.floor,
            ceiling=self.ceiling,
            load_seconds=self.loads.wall,
            load_cpu_seconds=self.loads.cpu,
            turns_per_load=self._recent_turns(trio.current_time()),
            standing_down=self.standing_down,
        )

    # -- lifecycle -----------------------------------------------------------------

    async def run(self) -> None:
        """Keep the pool filled until ``close``; returns once every process is stopped."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for _ in range(self.target):
                nursery.start_soon(self._keep)

    def close(self) -> None:
        """Start no more processes and stop the waiting ones (their keepers reap them)."""
        self._closed = True
        for warm in self._held:
            warm.scope.cancel()
        for scope in self._awaiting:
            scope.cancel()
        self._notify()

    async def wait_ready(self, count: int | None = None) -> None:
        """Wait until ``count`` (default: the target) processes are ready; for tests and benches."""
        while self.ready < (self.target if count is None else count):
            await self._changed.wait()

    # -- turns -------------------------------------------------------------------

    async def take(
        self, first_event: Callable[[], Awaitable[object]] | None = None
    ) -> Started | None:
        """A started process for a turn, or ``None`` (the turn starts its own).

        ``first_event`` returns once the turn has its first event (or has
        ended); until then the pool may hold back new processes (see the
        module doc).  The caller owns the process from here on: it must stop
        and reap it (``run_adapter`` does).
        """
        if self.standing_down:
            return None
        now = trio.current_time()
        self._rate.asked(now)
        self._grow(now)
        scope = None
        if first_event is not None and self._nursery is not None and not self._closed:
            scope = trio.CancelScope(deadline=now + 2 * self.loads.load_time())
            self._awaiting.add(scope)
            self._nursery.start_soon(self._await_first_event, scope, first_event)
        warm = choose(self._held, self.loads, now, may_renice=self._may_renice)
        if warm is not None and warm.ready_at is not None and scope is not None:
            self._warm_first[scope] = now + WARM_FIRST_EVENT  # before its keeper may go on
        if warm is None:
            log.debug("turn starts its adapter cold (%d loading)", self.loading)
            return None
        if log.isEnabledFor(logging.DEBUG):
            state = "loading" if warm.ready_at is None else "ready"
            log.debug(
                "turn takes pid %d (%s, %.2f s old)", warm.proc.pid, state, now - warm.spawned_at
            )
        self._held.remove(warm)
        warm.taken = True
        self._resume(warm)
        warm.scope.cancel()
        with trio.CancelScope(shield=True):  # one scheduling round: the keeper lets go
            await warm.released.wait()
        if self.nice and self._may_renice and not set_nice(warm.proc.pid, self._base_nice):
            self._may_renice = False
            log.info(
                "warm adapters keep nice %d in their turns: the server may not raise"
                " priorities (it needs CAP_SYS_NICE or an RLIMIT_NICE of %d)",
                self._base_nice + self.nice,
                20 - self._base_nice,
            )
        self._notify()
        return Started(warm.proc, warm.tail.tail())

    async def _await_first_event(
        self, scope: trio.CancelScope, first_event: Callable[[], Awaitable[object]]
    ) -> None:
        try:
            with scope:
                await first_event()
        finally:
            self._awaiting.discard(scope)
            self._warm_first.pop(scope, None)
            self._notify()

    # -- sizing --------------------------------------------------------------------

    def _recent_turns(self, now: float) -> int:
        """How many turns called ``take`` in the last load time."""
        return self._rate.recent(now, self.loads.load_time())

    def _wanted(self, now: float) -> int:
        return wanted(self._recent_turns(now), self.floor, self.ceiling)

    def _grow(self, now: float) -> None:
        if self._stopping or self._nursery is None:
            return
        while self.target < self._wanted(now):
            self.target += 1
            self._nursery.start_soon(self._keep)
        self._notify()

    @property
    def _stopping(self) -> bool:
        """Closed, or standing down: no new process starts."""
        return self._closed or self.standing_down

    async def _may_start(self) -> None:
        """Wait until a new process may start loading (see "Not stealing" in the module doc)."""
        while not self._stopping:
            now = trio.current_time()
            until = max(self._warm_first.values(), default=now)
            if until > now:  # a turn on a ready process: its first event first
                with trio.move_on_at(until):
                    await self._changed.wait()
                continue
            free = self._meter.free_cores(now)
            # Processes started since the meter's last reading are not in it yet.
            free -= sum(1 for t in self._spawns if t > now - _SPAWN_UNSEEN)
            running = self._turns() if self._turns is not None else len(self._awaiting)
            if may_start(
                free_cores=free,
                running=running,
                awaiting=len(self._awaiting),
                loading=self.loading + self._starting + len(self._awaiting),
                cpu_work=self.loads.cpu_work or not self.loads.count,
                cpus=self._meter.cpus,
            ):
                self._spawns.append(now)
                self._starting += 1  # until it is held (or failed to start)
                return
            with trio.move_on_after(_RECHECK):
                await self._changed.wait()

    # -- keepers -------------------------------------------------------------------

    def _notify(self) -> None:
        self._balance()
        self._changed.set()
        self._changed = trio.Event()

    def _balance(self) -> None:
        """Pause the loads over the core budget while turns wait; resume the rest."""
        loading = [w for w in self._held if w.ready_at is None and w.proc.returncode is None]
        pause: set[Warm] = set()
        if not self._closed and (self.loads.cpu_work or not self.loads.count):
            awaiting = len(self._awaiting)
            running = self._turns() if self._turns is not None else awaiting
            pause = to_pause(loading, cpus=self._meter.cpus, running=running, awaiting=awaiting)
        for warm in loading:
            if warm in pause and not warm.paused:
                warm.paused = signal_group(warm.proc.pid, signal.SIGSTOP)
                log.debug("warm adapter pid %d paused: a turn waits for a load", warm.proc.pid)
            elif warm not in pause:
                self._resume(warm)

    def _resume(self, warm: Warm) -> None:
        if warm.paused:
            warm.paused = False
            signal_group(warm.proc.pid, signal.SIGCONT)
            warm.watch.resumed(trio.current_time())

    async def _keep(self) -> None:
        """Keep one process started, replacing it whenever it goes; see the module doc."""
        failures = 0
        while not self._stopping:
            await self._may_start()
            try:
                if self._stopping:
                    break
                now = trio.current_time()  # the load time counts the spawn
                proc = exec_process(self.command)
            except OSError as exc:
                failures += 1
                if failures == 1:
                    log.warning("warm adapter failed to start: %s", exc.strerror or exc)
                await trio.sleep(backoff(failures))
                continue
            finally:
                self._starting -= 1
            log.debug("warm adapter pid %d started (%d loading)", proc.pid, self.loading + 1)
            if self.nice:
                set_nice(proc.pid, self._base_nice + self.nice)
            if self._guard is not None:
                self._guard.add(proc.pid)
            warm = Warm(proc, now, LoadWatch(proc.pid, _pipe_of(proc), quiet=QUIET, now=now))
            ending = "closed"
            try:
                if not self._stopping:  # closed or stood down while it started: not held
                    self._held.append(warm)
                    self._notify()
                    ending = await self._hold(warm)
            finally:
                if not warm.taken:
                    await self._discard(warm)
            if ending == "taken":
                failures = 0
            elif ending == "died":
                failures += 1
                code = proc.returncode
                stderr = warm.tail.tail().decode(errors="replace").strip()[-500:]
                log.warning(
                    "warm adapter pid %d exited while idle (status %s)%s",
                    proc.pid,
                    code,
                    f"; stderr: {stderr}" if stderr else "",
                )
                await trio.sleep(backoff(failures))
            elif ending == "expired" and self.target > self._wanted(trio.current_time()):
                self.target -= 1  # shrinking: this keeper goes
                self._notify()
                return

    async def _hold(self, warm: Warm) -> str:
        """Watch ``warm`` until it is taken, dies, expires or the pool closes; say which."""
        ending = "closed"
        try:
            with warm.scope:
                if self.max_idle > 0:
                    warm.scope.deadline = warm.spawned_at + self.max_idle
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_collect_stderr, warm)
                    nursery.start_soon(self._watch_load, warm)
                    await warm.proc.wait()
                    ending = "died"
                    with trio.move_on_after(_EXIT_DRAIN):  # its last words, for the log
                        await warm.stderr_done.wait()
                    nursery.cancel_scope.cancel()
            if warm.taken:
                ending = "taken"
            elif warm.scope.cancelled_caught and not self._closed:
                ending = "expired"
        finally:
            warm.released.set()  # its stderr has no reader now
        return ending

    async def _watch_load(self, warm: Warm) -> None:
        """Mark ``warm`` ready once it has loaded, and learn the load time."""
        at_once, wait = False, _CHECK_INSTANT
        while not at_once:  # a look or two within INSTANT of the spawn
            await trio.sleep(wait)
            now, wait = trio.current_time(), wait * 2
            if now - warm.spawned_at > INSTANT:
                break
            at_once = not warm.paused and warm.watch.reading()
        interval = _CHECK_FIRST
        while not at_once:
            await trio.sleep(interval)
            interval = min(interval * 2, _CHECK_MAX)
            now = trio.current_time()
            if not warm.paused and warm.watch.check(now):
                break
        warm.ready_at = now
        log.debug("warm adapter pid %d ready after %.2f s", warm.proc.pid, now - warm.spawned_at)
        wanted = cpu_wanted(warm.proc.pid)
        self.loads.add(now - warm.spawned_at, warm.watch.cpu_seconds, wanted)
        if not self.first_load.is_set():
            log.info(
                "warm adapter loaded in %.2f s (%.2f s of CPU)",
                now - warm.spawned_at,
                warm.watch.cpu_seconds,
            )
            self.first_load.set()
        self._instant = self._instant + 1 if at_once else 0
        if self._instant >= INSTANT_LOADS and not self._stopping:
            self._stand_down(now - warm.spawned_at)
        self._notify()

    def _stand_down(self, load: float) -> None:
        """Keep no process: the adapter loads at once (``_pool_policy``, "Standing down")."""
        message = "warm pool stands down: the adapter reads its stdin %.1f ms after it starts"
        log.info(message + " (%d times), as soon as a warm one would", load * 1000, self._instant)
        self.standing_down = True
        self.target = 0
        for warm in self._held:  # their keepers stop and reap them
            warm.scope.cancel()
        self._held.clear()

    async def _discard(self, warm: Warm) -> None:
        """Stop and reap a process no turn took (shielded: it must not outlive the pool)."""
        if warm in self._held:
            self._held.remove(warm)
            self._notify()
        self._resume(warm)  # a stopped process would not see the SIGINT
        with trio.CancelScope(shield=True):
            await stop_process(warm.proc, ProcessHandle(self._stop_grace))
        if self._guard is not None:
            self._guard.remove(warm.proc.pid)


def _pipe_of(proc: ExecProcess) -> PipeId | None:
    """The pipe on the process's stdin (its other end is ours)."""
    with contextlib.suppress(OSError):
        return PipeId.of(proc.stdin.fileno())
    return None


async def _collect_stderr(warm: Warm) -> None:
    stderr = warm.proc.stderr
    assert stderr is not None
    try:
        while chunk := await stderr.receive_some(65536):
            warm.tail.feed(chunk)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        warm.stderr_done.set()
