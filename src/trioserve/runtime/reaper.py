"""The reaper: a tiny watchdog process that kills adapters if the server dies.

The server starts one reaper at start-up with a pipe on its stdin and
tells it ``+PID`` when an adapter starts and ``-PID`` when it has been
reaped.  If the server dies without warning (``kill -9``, an OOM kill), the
kernel closes the pipe; the reaper reads end-of-file and SIGKILLs the
process group of every adapter still registered, then exits.  On a normal
shutdown every adapter is already gone and the reaper just exits.

(``PR_SET_PDEATHSIG`` cannot do this job here: trio forks adapters from a
worker thread, and the signal would fire when that *thread* exits.)

Run as ``python -m trioserve.runtime.reaper``; it ignores SIGINT and SIGTERM and
lives in its own session, so a Ctrl-C meant for the server does not stop it.
The program imports only ``os``, ``signal``, ``sys`` and ``contextlib``: trio, ``subprocess``
and ``typing`` (which imports ``re``), which only the server's side needs, are
imported there, so the reaper stays at the interpreter's own RSS (about
9 MiB; it was 25 MiB with trio).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: ``typing`` imports ``re`` (1.7 MiB)
if TYPE_CHECKING:
    import subprocess
    from types import TracebackType


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    groups: set[int] = set()
    for line in sys.stdin.buffer:
        op, pid = line[:1], line[1:].strip()
        if not pid.isdigit():
            continue
        if op == b"+":
            groups.add(int(pid))
        elif op == b"-":
            groups.discard(int(pid))
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    return 0


class Reaper:
    """The server's side: start the reaper, register adapters, stop it.

    ``add`` and ``remove`` are synchronous writes of a few bytes to a pipe
    the reaper drains continuously; they never wait in practice.  If the
    reaper cannot be started (or has died), they do nothing: adapters are
    still stopped normally, only the crash guarantee is lost (logged once).
    """

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._fd: int | None = None

    def start(self) -> None:
        import subprocess

        read_end, write_end = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "trioserve.runtime.reaper"],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
        except OSError:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        self._fd = write_end

    def _write(self, data: bytes) -> None:
        if self._fd is None:
            return
        try:
            os.write(self._fd, data)
        except OSError:
            os.close(self._fd)
            self._fd = None

    def add(self, pid: int) -> None:
        self._write(b"+%d\n" % pid)

    def remove(self, pid: int) -> None:
        self._write(b"-%d\n" % pid)

    async def aclose(self) -> None:
        """Close the pipe and reap the reaper (shielded, bounded)."""
        import trio

        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            await trio.to_thread.run_sync(proc.wait, abandon_on_cancel=True)
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    async def __aenter__(self) -> Reaper:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


if __name__ == "__main__":
    sys.exit(main())
