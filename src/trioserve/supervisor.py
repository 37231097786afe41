"""``trioserve run --workers N``: one supervisor, N server processes on one port.

The supervisor serves nothing itself.  It reserves the address (a socket
bound with ``SO_REUSEPORT`` that never listens, so ``--port 0`` resolves
once and the port stays the server's while a worker restarts), then starts
N workers: ``python -m trioserve run`` again with the same arguments, each
in a session of its own (a Ctrl-C reaches the supervisor only, which
forwards it once).  Each worker binds its own listening socket to that
port with ``SO_REUSEPORT`` (hypercorn's ``workers`` setting), so the kernel
spreads new connections over the workers; the store (PostgreSQL) is what
they share: sessions, turns, caps and the event log.

Each worker gets one end of a socket pair (``TRIOSERVE_WORKER`` names its
descriptor).  Over it the worker says ``ready`` once it listens, with its
startup lines; the supervisor prints worker 1's once every worker is ready
(with ``workers N`` in it).  The worker watches its end: end-of-file means
the supervisor is gone (even ``kill -9``), and the worker drains and exits
(``PR_SET_PDEATHSIG`` cannot do it: trio starts processes from a worker
thread, and the signal fires when that thread exits).

A worker that dies (not asked to) is started again after a backoff
(``RESTART_BACKOFF`` doubling to ``RESTART_BACKOFF_MAX``, reset once a
worker has lived ``HEALTHY_AFTER``), logged each time.  Connections waiting
in a dead worker's accept queue are reset (``SO_REUSEPORT`` gives each
worker a queue of its own); its running turns are closed by the others
when their lease expires (``sessions``).  SIGTERM or SIGINT drains: the
signal is forwarded to every worker, which drains as ``trioserve run``
does; a worker still running after the grace (plus the adapters' stop grace
and a margin) is killed.  A second signal is forwarded too (stop now).
SIGHUP is forwarded to every worker: each reads the API key file again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final, TextIO

import trio

from trioserve.config import ServerConfig
from trioserve.server import Stop, serve, settle_collector, watch_signals
from trioserve.spec import CompiledSpec
from trioserve.units import format_duration

log = logging.getLogger("trioserve.supervisor")

#: The environment variable that makes ``trioserve run`` a worker: ``FD,PORT,INDEX``.
WORKER_ENV: Final = "TRIOSERVE_WORKER"
RESTART_BACKOFF: Final = 0.5
RESTART_BACKOFF_MAX: Final = 30.0
HEALTHY_AFTER: Final = 30.0  # a worker that lived this long restarts without delay
#: Beyond the shutdown grace and the adapters' stop grace, before a worker is killed.
KILL_MARGIN: Final = 5.0
_READY: Final = b"ready\n"


def worker_link() -> tuple[int, int, int] | None:
    """In a worker: (the link's descriptor, the port, the worker's index); else ``None``.

    Takes the variable out of the environment, so adapters do not inherit it.
    """
    value = os.environ.pop(WORKER_ENV, None)  # read once: not for the adapters
    if not value:
        return None
    fd, port, index = (int(part) for part in value.split(","))
    return fd, port, index


# -- the worker's side ----------------------------------------------------------


class _LinkText:
    """A text stream whose lines go to the supervisor (the worker's startup lines)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def write(self, text: str) -> int:
        with contextlib.suppress(OSError):  # the supervisor is gone: nobody to tell
            os.write(self._fd, text.encode())
        return len(text)

    def flush(self) -> None:
        pass


async def run_worker(
    config: ServerConfig, spec: CompiledSpec, command: Sequence[str], fd: int
) -> None:
    """One worker: serve as ``trioserve run`` does, tell the supervisor, drain if it goes."""
    link = trio.socket.from_stdlib_socket(socket.socket(fileno=os.dup(fd)))
    stop = Stop.new()
    announce: Any = _LinkText(fd)
    async with trio.open_nursery() as nursery:
        await nursery.start(watch_signals, stop)
        nursery.start_soon(_watch_supervisor, link, stop)
        await _serve_and_report(config, spec, command, stop, announce, fd)
        nursery.cancel_scope.cancel()
    link.close()


async def _serve_and_report(
    config: ServerConfig,
    spec: CompiledSpec,
    command: Sequence[str],
    stop: Stop,
    announce: TextIO,
    fd: int,
) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve, config, spec, command, stop=stop, announce=announce))
        settle_collector()
        with contextlib.suppress(OSError):
            os.write(fd, _READY)


async def _watch_supervisor(link: trio.socket.SocketType, stop: Stop) -> None:
    while await link.recv(4096):
        pass
    if not stop.drain.is_set():
        log.warning("the supervisor is gone: draining")
        stop.drain.set()


# -- the supervisor's side ------------------------------------------------------


@dataclass
class _Worker:
    index: int
    proc: trio.Process | None = None
    link: trio.socket.SocketType | None = None
    ready: trio.Event = field(default_factory=trio.Event)
    started_at: float = 0.0
    lines: list[bytes] = field(default_factory=list)
    failures: int = 0


@dataclass
class _Supervisor:
    config: ServerConfig
    argv: list[str]
    workers: list[_Worker]
    port: int
    announce: TextIO
    draining: bool = False
    started: bool = False

    async def run_one(self, worker: _Worker, *, task_status: trio.TaskStatus[None]) -> None:
        """Keep ``worker`` running (restarting it) until the supervisor drains."""
        first = True
        while True:
            done = await self._run_once(worker, first, task_status if first else None)
            first = False
            if self.draining or not self.started:
                return
            lived = trio.current_time() - worker.started_at
            worker.failures = 0 if lived >= HEALTHY_AFTER else worker.failures + 1
            delay = 0.0 if worker.failures == 0 else RESTART_BACKOFF * 2 ** (worker.failures - 1)
            delay = min(delay, RESTART_BACKOFF_MAX)
            log.warning(
                "worker %d (pid %d) %s; restarting it%s",
                worker.index + 1,
                done[0],
                done[1],
                f" in {format_duration(delay)}" if delay else "",
            )
            await trio.sleep(delay)
            if self.draining:
                return

    async def _run_once(
        self, worker: _Worker, first: bool, task_status: trio.TaskStatus[None] | None
    ) -> tuple[int, str]:
        ours, theirs = socket.socketpair()
        env = {**os.environ, WORKER_ENV: f"{theirs.fileno()},{self.port},{worker.index}"}
        try:
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", "trioserve", *self.argv],
                env=env,
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            theirs.close()
        worker.proc, worker.ready = proc, trio.Event()
        worker.link = trio.socket.from_stdlib_socket(ours)
        worker.started_at = trio.current_time()
        worker.lines = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read_link, worker, first)
            if task_status is not None:
                with trio.CancelScope() as waiting:
                    nursery.start_soon(_cancel_on_exit, proc, waiting)
                    await worker.ready.wait()
                    waiting.cancel()
                task_status.started()  # ready, or exited: the supervisor looks which
            await proc.wait()
            nursery.cancel_scope.cancel()
        worker.link.close()
        return proc.pid, _describe_exit(proc.returncode)

    async def _read_link(self, worker: _Worker, first: bool) -> None:
        assert worker.link is not None
        pending = b""
        while chunk := await worker.link.recv(65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line + b"\n" == _READY:
                    worker.ready.set()
                    if not first:
                        log.info("worker %d is serving again", worker.index + 1)
                elif worker.index == 0 and first:
                    if self.started:
                        self._print(line)
                    else:
                        worker.lines.append(line)

    def _print(self, line: bytes) -> None:
        print(line.decode(errors="replace"), file=self.announce)
        self.announce.flush()

    def forward(self, signum: int) -> None:
        for worker in self.workers:
            if worker.proc is not None and worker.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.proc.send_signal(signum)

    def kill_all(self) -> None:
        for worker in self.workers:
            if worker.proc is not None and worker.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.proc.kill()


async def _cancel_on_exit(proc: trio.Process, scope: trio.CancelScope) -> None:
    await proc.wait()
    scope.cancel()


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to the address with ``SO_REUSEPORT``, never listening: the port's holder."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host.strip("[]"), port))
    except BaseException:
        sock.close()
        raise
    return sock


def supervise(config: ServerConfig, argv: Sequence[str], workers: int) -> int:
    """``trioserve run --workers N`` (N > 1): run the workers until a signal drains them.

    Returns the exit status: 0 after a drain, 1 if the workers could not start.
    """
    with reserve_port(config.host, config.port) as reserved:
        port = reserved.getsockname()[1]
        return trio.run(_supervise, config, list(argv), workers, port)


async def _supervise(config: ServerConfig, argv: list[str], count: int, port: int) -> int:
    sup = _Supervisor(config, argv, [_Worker(i) for i in range(count)], port, sys.stderr)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async with trio.open_nursery() as outer:
            handling = trio.CancelScope()
            async with trio.open_nursery() as running:
                async with trio.open_nursery() as starting:
                    for worker in sup.workers:
                        starting.start_soon(running.start, sup.run_one, worker)
                if not all(w.ready.is_set() and _alive(w) for w in sup.workers):
                    log.error("a worker could not start; stopping the others")
                    sup.draining = True
                    sup.kill_all()
                    handling.cancel()
                    return 1
                sup.started = True
                for line in sup.workers[0].lines:
                    sup._print(line)
                pids = ", ".join(str(w.proc.pid) for w in sup.workers if w.proc is not None)
                log.info("supervising %d workers (pids %s)", count, pids)
                outer.start_soon(_handle_signals, sup, signals, handling)
            handling.cancel()
    return 0


async def _handle_signals(
    sup: _Supervisor, signals: AsyncIterator[int], scope: trio.CancelScope
) -> None:
    """The first signal drains the workers (killed after the grace); a second is forwarded.
    SIGHUP is forwarded (each worker reads its API keys again), and drains nothing."""
    with scope:
        async with trio.open_nursery() as nursery:
            async for signum in signals:
                sup.forward(signum)
                if sup.draining or signum == signal.SIGHUP:
                    continue
                sup.draining = True
                name = signal.Signals(signum).name
                log.warning(
                    "%s: draining %d workers (send again to stop at once)", name, len(sup.workers)
                )
                limits = sup.config.limits
                wait = sup.config.shutdown_grace + limits.adapter_stop_grace + KILL_MARGIN
                nursery.start_soon(_kill_after, sup, wait)


def _alive(worker: _Worker) -> bool:
    return worker.proc is not None and worker.proc.returncode is None


async def _kill_after(sup: _Supervisor, seconds: float) -> None:
    await trio.sleep(seconds)
    alive = [w for w in sup.workers if _alive(w)]
    if alive:
        log.warning(
            "%d worker(s) still running after %s: killing", len(alive), format_duration(seconds)
        )
        sup.kill_all()
