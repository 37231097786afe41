"""The warm pool: adapter processes started ahead of their turns.

A real runtime adapter spends most of a short turn starting up (a Node
adapter loads its libraries for 1.6 s before it reads its stdin).  The pool
keeps ``size`` processes of the adapter command started and blocked on their
stdin; a turn takes one (``take``), writes its CompiledSpec to it and owns it
from then on, exactly as if it had started it.  A replacement starts at once.

Each process has a *keeper* task in the pool's nursery that starts it,
collects what it prints on stderr while it waits (the turn's stderr tail
begins with it), and watches it:

- taken by a turn: the keeper lets go of it (its stderr reader stops before
  ``take`` returns, so the turn is the only reader) and starts the next one;
- it died while idle: it is reaped and a new one started, after a backoff
  that grows while processes keep dying (a broken adapter does not spin);
- idle longer than ``max_idle``: stopped like any adapter and replaced;
- the pool closes (drain, shutdown): stopped and reaped, shielded.

The pool never holds more than ``size`` processes (a keeper replaces its
process only once the old one is gone), so with the turn cap the server
never runs more than ``max_concurrent_turns + size`` adapters.  Every pid is
registered with the guard (the reaper) while the pool holds it.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import trio

from .adapter import ProcessGuard, Started, StderrTail, StopPolicy, spawn, stop_process

log = logging.getLogger("trioserve.pool")

#: The backoff after a process died while idle: 0.1 s, doubling, at most 30 s.
_BACKOFF_FIRST = 0.1
_BACKOFF_MAX = 30.0
_EXIT_DRAIN = 1.0  # after a process died: time for its stderr to reach EOF


@dataclass(eq=False)
class _Warm:
    proc: trio.Process
    tail: StderrTail = field(default_factory=StderrTail)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    released: trio.Event = field(default_factory=trio.Event)
    stderr_done: trio.Event = field(default_factory=trio.Event)
    taken: bool = False


class WarmPool:
    """``size`` adapter processes kept started; see the module doc."""

    def __init__(
        self,
        command: Sequence[str],
        size: int,
        *,
        max_idle: float = 600.0,
        stop_grace: float = 5.0,
        guard: ProcessGuard | None = None,
    ) -> None:
        self.command = list(command)
        self.size = size
        self.max_idle = max_idle
        self._stop_grace = stop_grace
        self._guard = guard
        self._ready: deque[_Warm] = deque()
        self._closed = False
        self._changed = trio.Event()

    @property
    def ready(self) -> int:
        """How many processes are started and waiting for a turn."""
        return len(self._ready)

    def pids(self) -> list[int]:
        return [warm.proc.pid for warm in self._ready]

    async def run(self) -> None:
        """Keep the pool full until ``close``; returns once every process is stopped."""
        async with trio.open_nursery() as nursery:
            for _ in range(self.size):
                nursery.start_soon(self._keep)

    def close(self) -> None:
        """Start no more processes and stop the waiting ones (their keepers reap them)."""
        self._closed = True
        for warm in self._ready:
            warm.scope.cancel()

    async def take(self) -> Started | None:
        """A started process for a turn, or ``None`` (the turn starts its own).

        The caller owns the process from here on: it must stop and reap it
        (``run_adapter`` does).
        """
        while self._ready:
            warm = self._ready.popleft()
            if warm.proc.poll() is not None:
                continue  # died while idle; its keeper reaps it
            warm.taken = True
            warm.scope.cancel()
            with trio.CancelScope(shield=True):  # one scheduling round: the keeper lets go
                await warm.released.wait()
            self._notify()
            return Started(warm.proc, warm.tail.tail())
        return None

    async def wait_ready(self, count: int | None = None) -> None:
        """Wait until ``count`` (default: all) processes are waiting; for tests and benches."""
        wanted = self.size if count is None else count
        while self.ready < wanted:
            await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _keep(self) -> None:
        """Keep one process started, replacing it whenever it goes; see the module doc."""
        failures = 0
        while not self._closed:
            try:
                proc = await spawn(self.command)
            except OSError as exc:
                failures += 1
                if failures == 1:
                    log.warning("warm adapter failed to start: %s", exc.strerror or exc)
                await trio.sleep(_backoff(failures))
                continue
            if self._guard is not None:
                self._guard.add(proc.pid)
            warm = _Warm(proc)
            died = False
            try:
                self._ready.append(warm)
                self._notify()
                died = await self._hold(warm)
            finally:
                if not warm.taken:
                    await self._discard(warm)
            if warm.taken:
                failures = 0
            elif died:
                failures += 1
                code = proc.returncode
                stderr = warm.tail.tail().decode(errors="replace").strip()[-500:]
                log.warning(
                    "warm adapter pid %d exited while idle (status %s)%s",
                    proc.pid,
                    code,
                    f"; stderr: {stderr}" if stderr else "",
                )
                await trio.sleep(_backoff(failures))

    async def _hold(self, warm: _Warm) -> bool:
        """Wait while ``warm`` is idle; True if it died meanwhile."""
        died = False
        try:
            with warm.scope:
                if self.max_idle > 0:
                    warm.scope.deadline = trio.current_time() + self.max_idle
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_collect_stderr, warm)
                    await warm.proc.wait()
                    died = True
                    with trio.move_on_after(_EXIT_DRAIN):  # its last words, for the log
                        await warm.stderr_done.wait()
                    nursery.cancel_scope.cancel()
        finally:
            warm.released.set()  # its stderr has no reader now
        return died

    async def _discard(self, warm: _Warm) -> None:
        """Stop and reap a process no turn took (shielded: it must not outlive the pool)."""
        if warm in self._ready:
            self._ready.remove(warm)
            self._notify()
        with trio.CancelScope(shield=True):
            await stop_process(warm.proc, StopPolicy(grace=self._stop_grace))
        if self._guard is not None:
            self._guard.remove(warm.proc.pid)


async def _collect_stderr(warm: _Warm) -> None:
    stderr = warm.proc.stderr
    assert stderr is not None
    try:
        while chunk := await stderr.receive_some(65536):
            warm.tail.feed(chunk)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        warm.stderr_done.set()


def _backoff(failures: int) -> float:
    return float(min(_BACKOFF_FIRST * 2 ** (failures - 1), _BACKOFF_MAX))
