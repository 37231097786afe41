"""An adapter process this server is the parent of: its pid, its three pipes, its exit.

``exec_process`` starts one with ``subprocess.Popen`` on the Trio thread
itself, in its own session (its pid is its process group's), its stdio on
pipes.  ``trio.lowlevel.open_process`` calls the same ``Popen`` from a worker
thread: the handoff to the thread and back cost 0.15-0.2 ms of CPU a turn
(docs/benchmarks.md, go-peer), more than the spawn itself, for a wait the
Trio thread does not have: ``Popen`` uses ``vfork`` here (no ``preexec_fn``,
no user or group change), so it is back as soon as the child has exec'd,
0.2 ms for a small adapter whatever this process's size.  asyncio calls
``Popen`` on its event loop's thread the same way.  A ``Popen`` that fails
(no such program, not executable, a bad ``cwd``) raises ``OSError`` with no
child left and no pipe open.

``ChildProcess`` is what a turn uses of it (``AdapterProcess``): ``pid``,
``returncode``, ``wait()`` (``wait_exited``: on a pidfd, so no thread and no
``SIGCHLD``; where there is no ``pidfd_open`` -- before Linux 5.3, or under
valgrind, which lacks it -- in a worker thread blocked in ``waitid``, as trio
does, and elsewhere by looking every ``_POLL`` seconds; the fork server's own
exit is waited for the same way) and the three streams.  The fork server's
children (``runtime._forker``) are ``ChildProcess``es too, reaped with
``waitpid``; an ``ExecProcess`` is reaped through its ``Popen``, which must
know of its end (else ``subprocess`` would later reap its pid on its own, a
pid that may be another child's by then).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import trio

_FAILED = 255  # the exit code of a child someone else reaped: how it ended is lost
_POLL = 0.01  # seconds between looks at a child's exit where there is no pidfd


def _pidfd_open(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux, or before 5.3
        return None


class ChildProcess:
    """A child of this process, with its stdin, stdout and stderr pipes (ours ends)."""

    def __init__(self, pid: int, stdin: int, stdout: int, stderr: int) -> None:
        self.pid = pid
        self._returncode: int | None = None
        self._exit: trio.Event | None = None  # set when the one waiting for the exit stops
        self.stdin = trio.lowlevel.FdStream(stdin)
        self.stdout = trio.lowlevel.FdStream(stdout)
        self.stderr = trio.lowlevel.FdStream(stderr)

    @property
    def returncode(self) -> int | None:
        """Its exit code once it has ended (reaped on the way), else ``None``."""
        if self._returncode is None:
            self._returncode = self._reap(block=False)
        return self._returncode

    def poll(self) -> int | None:
        return self.returncode

    async def wait(self) -> int:
        """Its exit code once it has ended.  One caller waits for the exit
        (``wait_exited``); the others wait for that one (not trio's lock, which costs
        each wait a pass of the scheduler)."""
        while self.returncode is None:
            if self._exit is not None:
                await self._exit.wait()  # the waiter's: ended or cancelled, look again
                continue
            self._exit = exit_ = trio.Event()
            try:
                await wait_exited(self.pid, self._ended)
            finally:
                self._exit = None
                exit_.set()
            if self._returncode is None:
                self._returncode = self._reap(block=True)
        assert self._returncode is not None
        return self._returncode

    def _ended(self) -> bool:
        return self.returncode is not None

    def _reap(self, *, block: bool) -> int | None:
        """Reap it (``block``: it has exited); its exit code, ``None`` if it runs on."""
        try:
            pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return _FAILED
        return None if pid == 0 else os.waitstatus_to_exitcode(status)


async def wait_exited(pid: int, ended: Callable[[], bool]) -> None:
    """Return once our child ``pid`` has exited, not reaping it (its owner does), or at
    once if ``ended()`` (which may reap it: a look at its exit code).

    On a pidfd opened for the wait (the pid stays the child's until it is reaped,
    and only its owner reaps it); where there is no ``pidfd_open`` in a worker
    thread blocked in ``waitid``, as trio does, and elsewhere by asking ``ended``
    every ``_POLL`` seconds.
    """
    if ended():
        return
    pidfd = _pidfd_open(pid)
    if pidfd is not None:
        try:
            await trio.lowlevel.wait_readable(pidfd)
        finally:
            trio.lowlevel.notify_closing(pidfd)
            os.close(pidfd)
    elif hasattr(os, "waitid"):
        # Cancelled, the thread stays until the child exits: its owner stops it.
        await trio.to_thread.run_sync(_wait_exited, pid, abandon_on_cancel=True)
    else:
        while not ended():  # noqa: ASYNC110 (nothing to wait on)
            await trio.sleep(_POLL)


def _wait_exited(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):  # reaped already
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)


class ExecProcess(ChildProcess):
    """A child ``exec_process`` started: reaped through its ``Popen``."""

    def __init__(self, popen: subprocess.Popen[bytes], stdin: int, stdout: int, stderr: int):
        self._popen = popen
        super().__init__(popen.pid, stdin, stdout, stderr)

    def _reap(self, *, block: bool) -> int | None:
        return self._popen.wait() if block else self._popen.poll()


def exec_process(
    command: Sequence[str], env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> ExecProcess:
    """Start ``command`` in a new session, its stdio on pipes (see the module doc)."""
    pipes = [os.pipe() for _ in range(3)]  # (read, write) each, close-on-exec
    theirs = (pipes[0][0], pipes[1][1], pipes[2][1])
    ours = (pipes[0][1], pipes[1][0], pipes[2][0])
    try:
        popen = subprocess.Popen(
            list(command),
            stdin=theirs[0],
            stdout=theirs[1],
            stderr=theirs[2],
            start_new_session=True,
            env=dict(env) if env is not None else None,
            cwd=cwd,
        )
    except BaseException:
        for fd in ours:
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    return ExecProcess(popen, *ours)
