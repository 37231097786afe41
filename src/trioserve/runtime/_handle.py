"""The handle of an adapter process: how it is stopped, and a way to ask for it.

``stop_process`` is the one way an adapter ends (a turn's, or a warm one no
turn took): SIGINT to its process group, the stop grace, SIGKILL to the
group, reaped -- shielded from cancellation, with its own deadlines.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Iterator
from typing import Protocol

import trio

log = logging.getLogger("trioserve.adapter")

_KILL_WAIT = 5.0  # how long to wait for a SIGKILLed child to be reaped


class AdapterProcess(Protocol):
    """What a turn uses of its adapter process: one it exec'd or one the fork server
    forked (a ``runtime._child.ChildProcess`` either way)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    @property
    def stdin(self) -> trio.abc.SendStream | None: ...

    @property
    def stdout(self) -> trio.abc.ReceiveStream | None: ...

    @property
    def stderr(self) -> trio.abc.ReceiveStream | None: ...

    async def wait(self) -> int: ...


class ProcessHandle:
    """The handle of a turn's adapter process: how to stop it, and a way to ask for it.

    It exists before the process does (a turn is stopped before its adapter
    started: the stop applies once it runs).  ``interrupt()`` (from any task)
    sends SIGINT to the adapter's group at once and its output is still read,
    so the adapter's own last events (often a ``session.ended`` ``cancelled``)
    still arrive; if it has not exited ``grace`` seconds later it gets
    SIGKILL.  ``force()`` (a forced shutdown) cuts the grace to nothing:
    SIGKILL at once, on purpose, so it is not reported as an adapter that
    ignored SIGINT; ``drop_grace()`` does the same without signalling now (the
    turn's task is being cancelled: the stop comes with it).
    """

    def __init__(self, grace: float = 5.0) -> None:
        self._grace = grace
        self._interrupted_at: float | None = None
        self._forced = False
        self._scope: trio.CancelScope | None = None
        self._pid: int | None = None

    @property
    def grace(self) -> float:
        return self._grace

    @property
    def interrupted(self) -> bool:
        """Whether ``interrupt`` (or ``force``) was called."""
        return self._interrupted_at is not None

    @property
    def forced(self) -> bool:
        return self._forced

    def interrupt(self) -> None:
        """SIGINT now (once the process runs), SIGKILL after the grace."""
        if self._interrupted_at is None:
            self._interrupted_at = trio.current_time()
            if self._pid is not None:
                _signal_group(self._pid, signal.SIGINT)
        if self._scope is not None:
            self._scope.deadline = self._interrupted_at + self._grace

    def force(self) -> None:
        """Stop at once: no grace (SIGKILL right after SIGINT)."""
        self.drop_grace()
        self.interrupt()

    def drop_grace(self) -> None:
        """When the process is stopped, SIGKILL it at once (a deliberate, logged as such)."""
        self._forced = True
        self._grace = 0.0

    def remaining(self) -> float:
        """What is left of the grace (all of it before any interrupt)."""
        if self._interrupted_at is None:
            return self._grace
        return max(0.0, self._interrupted_at + self._grace - trio.current_time())

    @contextlib.contextmanager
    def running(self, pid: int, scope: trio.CancelScope | None = None) -> Iterator[None]:
        """While the body runs, process ``pid`` is this handle's; an interrupt ends the
        body ``grace`` seconds later (cancels ``scope``, one the caller is in, else one
        around the body).  An interrupt that came earlier applies now.
        """
        self._pid = pid
        with contextlib.nullcontext(scope) if scope is not None else trio.CancelScope() as own:
            self._scope = own
            if self._interrupted_at is not None:
                self._interrupted_at = None
                self.interrupt()
            try:
                yield
            finally:
                self._scope = None

    def reaped(self) -> None:
        """The process is reaped: its pid may be reused, no more signals to it."""
        self._pid = None


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def stop_process(proc: AdapterProcess, handle: ProcessHandle) -> bool:
    """Stop and reap ``proc`` and its group; True if it had to be signalled."""
    signalled = proc.returncode is None  # else it exited by itself, and is reaped
    if signalled:
        with trio.CancelScope(shield=True):
            if not handle.interrupted:
                _signal_group(proc.pid, signal.SIGINT)
            with trio.move_on_after(handle.remaining()):
                await proc.wait()
            if proc.returncode is None:
                if handle.forced:
                    log.info("adapter pid %d force-stopped (SIGKILL)", proc.pid)
                else:
                    log.warning("adapter pid %d ignored SIGINT; sending SIGKILL", proc.pid)
                _signal_group(proc.pid, signal.SIGKILL)
                with trio.move_on_after(_KILL_WAIT):
                    await proc.wait()
    # Anything the adapter left behind in its group goes too.
    _signal_group(proc.pid, signal.SIGKILL)
    return signalled
