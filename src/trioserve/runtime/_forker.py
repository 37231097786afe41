"""The server's side of the fork server: start it, watch it, ask it for turn processes.

``ForkServer.run`` (a task of the manager's nursery) starts the fork server
program (``runtime.forkserver``) with one end of a ``SOCK_SEQPACKET``
socket pair, waits for its ``ready`` (a module that does not import fails
the start, naming it), then watches it: if it dies it is started again
(with backoff), and while it is down ``spawn`` answers ``None`` and the turn
exec's its adapter as before (logged once per outage).

``spawn`` makes the turn's three pipes, sends the child's ends with the
turn's environment and working directory, and gets the child's pid back.
The child is this process's own child (``CLONE_PARENT``): a
``ChildProcess`` (``runtime._child``) waits for it with a pidfd and reaps it
with ``waitpid``, so ``run_adapter`` and ``stop_process`` treat it as they
treat an adapter they exec'd (``AdapterProcess``), the guard (the reaper) knows its
pid, and its group is signalled the same way.

The fork server is started from the Trio thread with ``subprocess.Popen``
(not from a worker thread, as ``trio.lowlevel.open_process`` does): its
``PR_SET_PDEATHSIG`` then fires when this process ends, not when a thread
does.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio

from trioserve.runtime._child import ChildProcess, wait_exited
from trioserve.runtime._process import ProcessGuard
from trioserve.spec import echo_command, openai_command, python_command

log = logging.getLogger("trioserve.forkserver")

_READY_TIMEOUT = 60.0  # importing an adapter's libraries on a loaded machine
_REPLY_TIMEOUT = 10.0  # one fork
_BACKOFF_FIRST = 0.1
_BACKOFF_MAX = 5.0


class ForkServerError(Exception):
    """The fork server could not start: its adapter module does not import, or no clone."""


class ForkUnsupported(ForkServerError):
    """The fork server cannot fork here (the platform, or its probe of the raw clone):
    turns exec their adapter."""


@dataclass(frozen=True)
class ForkTarget:
    """What the fork server imports and calls: ``pkg.mod:func``, modules to preload, argv."""

    call: str
    preload: tuple[str, ...] = ()
    argv: tuple[str, ...] = ()

    def command(self, fd: int) -> list[str]:
        options = [arg for name in self.preload for arg in ("--preload", name)]
        return [
            sys.executable,
            "-m",
            "trioserve.runtime.forkserver",
            str(fd),
            self.call,
            *options,
            "--",
            *self.argv,
        ]


@dataclass
class ForkStats:
    """What ``/readyz`` and the metrics show of the fork server."""

    state: str = "starting"  # starting | ready | down | stopped | unsupported
    forks: int = 0
    fallbacks: int = 0  # turns that exec'd because it was down
    restarts: int = 0
    fork_seconds: list[float] = field(default_factory=list)  # the last forks' times

    def fork_p50(self) -> float | None:
        if not self.fork_seconds:
            return None
        return sorted(self.fork_seconds)[len(self.fork_seconds) // 2]


def fork_target(command: Sequence[str]) -> ForkTarget | None:
    """What the fork server runs for ``command``, if it is a Python adapter's: the built-in
    ``echo`` and ``openai``, or a ``runtime.type: python`` module.

    Any other command (``exec``, ``local``, a ``--runtime-command``) is exec'd (``None``).
    """
    if len(command) == 5 and list(command) == python_command(command[4]):
        return ForkTarget(command[4])
    if list(command) == echo_command():
        return ForkTarget("trioserve.runtime.echo_adapter:main")
    for preload_mcp in (False, True):
        if list(command) == openai_command(preload_mcp=preload_mcp):
            preload: tuple[str, ...] = ("trioserve.runtime.openai_adapter._adapter:warm_up",)
            if preload_mcp:
                preload += ("trioserve.runtime.openai_adapter._adapter:preload_mcp",)
            return ForkTarget(
                "trioserve.runtime.openai_adapter.__main__:main",
                preload,
                ("--preload-mcp",) if preload_mcp else (),
            )
    return None


class ForkServer:
    """One fork server for this process's turns; see the module doc."""

    def __init__(self, target: ForkTarget, *, guard: ProcessGuard | None = None) -> None:
        self.target = target
        self.stats = ForkStats()
        self._guard = guard
        self._sock: trio.socket.SocketType | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = trio.Lock()  # one request at a time on the socket
        self._fallback_logged = False
        self._closed = False
        #: The environment the fork server was started with: a turn's is sent as changes.
        self._env: dict[str, str] = {}

    @property
    def pid(self) -> int | None:
        """The fork server's pid while it runs."""
        return self._proc.pid if self._proc is not None and self._sock is not None else None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the fork server (``ForkServerError`` if it cannot), keep it up until cancelled."""
        failures = 0
        try:
            while True:
                try:
                    await self._start()
                except ForkServerError as exc:
                    if self.stats.restarts == 0 and failures == 0:
                        if not isinstance(exc, ForkUnsupported):
                            raise  # the adapter does not import: a clear error at start
                        log.warning("fork server off: %s; turns exec their adapter", exc)
                        self.stats.state = "unsupported"
                        task_status.started()
                        return
                    failures += 1
                    log.warning("fork server failed to start again: %s", exc)
                    self.stats.state = "down"
                    await trio.sleep(min(_BACKOFF_FIRST * 2 ** (failures - 1), _BACKOFF_MAX))
                    continue
                if self.stats.restarts == 0 and failures == 0:
                    task_status.started()
                failures = 0
                self.stats.state = "ready"
                self._fallback_logged = False
                code = await self._watch()
                self.stats.state = "down"
                if self._guard is not None and self._proc is not None:
                    self._guard.remove(self._proc.pid)
                self.stats.restarts += 1
                log.warning(
                    "fork server pid %s exited (status %s); starting it again,"
                    " turns exec their adapter until it is ready",
                    self._proc.pid if self._proc else "?",
                    code,
                )
                self._stop_now()
        finally:
            if self.stats.state != "unsupported":
                self.stats.state = "stopped"
            with trio.CancelScope(shield=True):
                await self._stop()

    async def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # From the Trio thread: see the module doc (PR_SET_PDEATHSIG).
            self._env = dict(os.environ)
            proc = subprocess.Popen(  # noqa: ASYNC220 - a few ms, and it must be this thread
                self.target.command(theirs.fileno()),
                env=self._env,
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            ours.close()
            raise ForkServerError(f"cannot start the fork server: {exc.strerror or exc}") from None
        finally:
            theirs.close()
        if self._guard is not None:
            self._guard.add(proc.pid)
        self._proc = proc
        sock = trio.socket.from_stdlib_socket(ours)
        try:
            with trio.move_on_after(_READY_TIMEOUT):
                answer = b""
                answer = await sock.recv(65536)
        except BaseException:
            sock.close()
            raise
        message = json.loads(answer) if answer else {}
        if "ready" not in message:
            sock.close()
            await self._reap(proc)
            reason = message.get("failed") or f"it exited (status {proc.returncode}) before ready"
            error = ForkUnsupported if message.get("unsupported") else ForkServerError
            raise error(f"fork server for {self.target.call}: {reason}")
        self._sock = sock

    async def _watch(self) -> int | None:
        """Wait until the fork server exits; its exit status."""
        assert self._proc is not None
        await _exited(self._proc)
        return self._proc.wait()

    def _stop_now(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def _stop(self) -> None:
        """Close the socket (the fork server exits at end-of-file) and reap it, bounded."""
        self._stop_now()
        if self._proc is not None:
            await self._reap(self._proc)

    async def _reap(self, proc: subprocess.Popen[bytes]) -> None:
        with trio.move_on_after(5):
            await _exited(proc)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if self._guard is not None:
            self._guard.remove(proc.pid)

    def _env_changes(self, env: Mapping[str, str]) -> dict[str, object]:
        """The turn's environment as what differs from the fork server's: a child then sets
        a variable or two, instead of rebuilding ``os.environ`` (which copies hundreds of
        KiB of pages it shares with the fork server)."""
        start = self._env
        return {
            "env": {key: value for key, value in env.items() if start.get(key) != value},
            "unset": [key for key in start if key not in env],
        }

    async def spawn(
        self,
        env: Mapping[str, str] | None,
        cwd: Path | None = None,
        *,
        guard: ProcessGuard | None = None,
    ) -> ChildProcess | None:
        """A forked process for a turn, or ``None`` if the fork server is not up.

        Its pid is registered with ``guard`` (else the server's); the caller
        owns it from here on and must stop and reap it (``run_adapter`` does).
        """
        if self._sock is None:
            self._fell_back()
            return None
        changes = self._env_changes(os.environ if env is None else env)
        request = json.dumps({**changes, "cwd": str(cwd or os.getcwd())}).encode()
        fds = [os.pipe2(os.O_CLOEXEC) for _ in range(3)]  # (read, write) each
        theirs = [fds[0][0], fds[1][1], fds[2][1]]
        ours = [fds[0][1], fds[1][0], fds[2][0]]
        started = trio.current_time()
        proc = None
        answer = None
        try:
            async with self._lock:
                answer = await self._ask(request, theirs)
            pid = answer.get("pid") if answer is not None else None
            if isinstance(pid, int):
                proc = ChildProcess(pid, *ours)
        finally:
            for fd in theirs:
                os.close(fd)
            if proc is None:
                for fd in ours:
                    os.close(fd)
        if proc is None:
            if answer is not None:
                log.warning("fork server could not fork: %s", answer.get("error"))
            self._fell_back()
            return None
        guard = guard if guard is not None else self._guard
        if guard is not None:
            guard.add(proc.pid)
        self.stats.forks += 1
        self.stats.fork_seconds = [*self.stats.fork_seconds[-99:], trio.current_time() - started]
        return proc

    async def _ask(self, request: bytes, fds: Sequence[int]) -> dict[str, object] | None:
        """Send one fork request; its answer, or ``None`` if the fork server is gone."""
        sock = self._sock
        if sock is None:
            return None
        try:
            with trio.CancelScope(shield=True), trio.move_on_after(_REPLY_TIMEOUT) as timeout:
                # Shielded: a request sent must have its answer read, or the next
                # turn would read this one's (and its child would have no owner).
                await sock.sendmsg(
                    [request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array("i", fds))]
                )
                answer = await sock.recv(65536)
        except OSError:
            answer = b""
        if timeout.cancelled_caught or not answer:
            self._stop_now()  # the watcher restarts it
            if self._proc is not None and self._proc.poll() is None:
                self._proc.kill()
            return None
        parsed = json.loads(answer)
        return parsed if isinstance(parsed, dict) else None

    def _fell_back(self) -> None:
        self.stats.fallbacks += 1
        if self.stats.state == "unsupported":
            return  # said once, at start
        if not self._fallback_logged:
            self._fallback_logged = True
            log.warning("fork server is not ready: turns exec their adapter until it is")


async def _exited(proc: subprocess.Popen[bytes]) -> None:
    """Return once ``proc`` has exited (not reaped: ``poll`` or ``wait`` does that)."""
    await wait_exited(proc.pid, lambda: proc.poll() is not None)
