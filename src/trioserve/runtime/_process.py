"""One turn's adapter process: spawn, feed, read, stop, reap.

``run_adapter`` is called inside the turn's nursery and owns the child for
its whole life (it starts it, or takes one the warm pool started).  The
child runs in its own process group; the CompiledSpec is written to its
stdin, which is then closed; stdout is cut into lines by a
``LineFramer`` and the turn's ``TurnState`` (``runtime._lifecycle``) says
which events they make, handed to the turn's sink (the lines of one read
together); the last 64 KiB of stderr are kept to explain a crash (in the
``error`` event, or only in the outcome with ``--adapter-stderr log``).
However ``run_adapter`` ends (the adapter finished, a limit was hit, or the
caller was cancelled), the child and its process group are stopped and
reaped before it returns (``runtime._handle.stop_process``): SIGINT to the
group, then SIGKILL after the stop grace, shielded from cancellation.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import trio

from trioserve.fdio import read_ready, read_some
from trioserve.runtime import _lifecycle
from trioserve.runtime import _wire as wire
from trioserve.runtime._child import exec_process
from trioserve.runtime._framing import LineFramer
from trioserve.runtime._handle import AdapterProcess, ProcessHandle, stop_process
from trioserve.runtime._lifecycle import TurnState

if TYPE_CHECKING:
    from trioserve.spec import CompiledSpec

log = logging.getLogger("trioserve.adapter")

STDERR_TAIL_BYTES = 64 * 1024
_READ_CHUNK = 256 * 1024
_EXIT_DRAIN = 1.0  # after the adapter exits: time for its pipes to reach EOF
_LINGER = 1.0  # after session.ended: time to exit before SIGINT


class EventSink(Protocol):
    """Where ``run_adapter`` sends a turn's events: the server's ``sessions._turns.TurnLog``,
    or a ``ChannelSink``.  It hands over every event a chunk of stdout held in one call.
    """

    #: How many events it has taken.
    sent: int

    async def send_many(self, events: Sequence[wire.Event]) -> bool:
        """Take ``events``; False once nobody listens (it then takes no more)."""
        ...


class ChannelSink:
    """An ``EventSink`` that puts the events on a memory channel (tests use it)."""

    def __init__(self, channel: trio.MemorySendChannel[wire.Event]) -> None:
        self._channel = channel
        self.sent = 0
        self.listening = True

    async def send_many(self, events: Sequence[wire.Event]) -> bool:
        for event in events:
            if not self.listening:
                return False
            try:
                try:
                    self._channel.send_nowait(event)
                except trio.WouldBlock:
                    await self._channel.send(event)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.listening = False
                return False
            self.sent += 1
        return True


@dataclass
class AdapterOutcome:
    """What happened to one adapter run."""

    pid: int | None = None
    exit_code: int | None = None
    end_reason: str | None = None  # data.reason of session.ended, if one arrived
    stopped_by_server: bool = False
    error: str | None = None  # the message of the error event we synthesized, if any
    #: Why the turn failed, when ``error`` is set: ``adapter_start_failed``,
    #: ``event_too_large`` or ``adapter_exit``.
    error_reason: str | None = None
    stderr_tail: bytes = b""
    events: int = field(default=0)


class ProcessGuard(Protocol):
    """Told of every adapter that starts and ends (see ``trioserve.runtime.reaper``)."""

    def add(self, pid: int) -> None: ...

    def remove(self, pid: int) -> None: ...


class StderrTail:
    def __init__(self, limit: int = STDERR_TAIL_BYTES) -> None:
        self._buf = bytearray()
        self._limit = limit

    def feed(self, chunk: bytes | bytearray) -> None:
        self._buf += chunk
        if len(self._buf) > 2 * self._limit:
            del self._buf[: len(self._buf) - self._limit]

    def tail(self) -> bytes:
        return bytes(self._buf[-self._limit :])


@dataclass(eq=False)
class Started:
    """An adapter started ahead of its turn (the warm pool's, ``runtime._pool``), or
    forked for it (the fork server's, ``runtime._forker``).

    ``stderr`` is what it printed before the turn; the turn's stderr tail
    begins with it.  Its pid is already registered with the guard.
    """

    proc: AdapterProcess
    stderr: bytes = b""


def adapter_input(spec: CompiledSpec) -> bytes:
    """What an adapter reads on stdin: the spec's wire form as one line of compact JSON.

    The only place a CompiledSpec is serialised for an adapter: camelCase
    keys, absent fields left out, ASCII only (``\\uXXXX`` escapes), no newline.
    """
    return json.dumps(spec.to_json_dict(), separators=(",", ":")).encode()


async def run_adapter(
    command: Sequence[str],
    spec: CompiledSpec,
    session_id: str,
    sink: EventSink,
    *,
    policy: ProcessHandle,
    max_event_bytes: int,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    guard: ProcessGuard | None = None,
    started: Started | None = None,
    state: TurnState | None = None,
) -> AdapterOutcome:
    """Run one adapter turn, sending its events to ``sink``; see the module doc.

    With ``started``, that process is used instead of starting one (its
    ownership passes to this call, which stops and reaps it like any other).
    ``state`` (the turn's, else a new one) decides what the output, the
    exit or a failed start mean and which events they make (see
    ``runtime._lifecycle``): if the adapter exits without ``session.ended``,
    the ``error`` event says how, with its stderr tail; with a state made
    with ``stderr_to_client=False`` it says the tail is in the server log
    instead (the caller logs ``stderr_tail``).
    """
    if state is None:
        state = TurnState(session_id)
    outcome = AdapterOutcome()
    if started is not None:
        proc = started.proc
    else:
        try:
            proc = exec_process(command, env, cwd)
        except OSError as exc:
            await _send(sink, state, state.start_failed(command, exc))
            return _finished(outcome, state)
        if guard is not None:
            guard.add(proc.pid)
    outcome.pid = proc.pid
    child = _Child(proc)
    if started is not None:
        child.tail.feed(started.stderr)
    try:
        await _supervise(child, spec, sink, state, policy, max_event_bytes)
    finally:
        if await stop_process(proc, policy) or policy.interrupted:
            outcome.stopped_by_server = True
        policy.reaped()
        if guard is not None:
            guard.remove(proc.pid)
        outcome.exit_code = proc.returncode
        outcome.stderr_tail = child.tail.tail()
        outcome.events = sink.sent
    crash = state.exited(
        outcome.exit_code,
        stopped_by_server=outcome.stopped_by_server,
        stderr_tail=outcome.stderr_tail,
    )
    await _send(sink, state, crash)
    return _finished(outcome, state)


def _finished(outcome: AdapterOutcome, state: TurnState) -> AdapterOutcome:
    """``outcome`` with what ``state`` made of the run, which is now over."""
    state.run_finished()
    outcome.end_reason, outcome.error, outcome.error_reason = (
        state.end_reason,
        state.error,
        state.failure,
    )
    return outcome


async def _send(sink: EventSink, state: TurnState, events: Sequence[wire.Event]) -> None:
    if events and not await sink.send_many(events):
        state.nobody_listening()


async def _supervise(
    child: _Child,
    spec: CompiledSpec,
    sink: EventSink,
    state: TurnState,
    policy: ProcessHandle,
    max_event_bytes: int,
) -> None:
    """Feed the child, read its events, and let it exit; see ``run_adapter``.  An
    interrupt cancels the nursery ``grace`` seconds later (``ProcessHandle.running``)."""
    proc = child.proc
    async with trio.open_nursery() as nursery:
        with policy.running(proc.pid, nursery.cancel_scope):
            rest = _feed_at_once(proc, adapter_input(spec))
            if rest:  # the pipe did not take it all: a task waits to write the rest
                nursery.start_soon(_feed_stdin, proc, rest)
            nursery.start_soon(child.drain_stderr)
            nursery.start_soon(child.watch_exit)
            await _read_events(child, sink, state, max_event_bytes)
            if state.failure is None and state.listening:
                if state.end_reason is None:
                    # stdout closed (or the adapter exited): collect the exit
                    # status and the rest of stderr, to explain the crash.
                    await child.exited.wait()
                    with trio.move_on_after(_EXIT_DRAIN):
                        await child.stderr_done.wait()
                else:
                    # After session.ended the adapter should exit by itself.
                    with trio.move_on_after(min(policy.grace, _LINGER)):
                        await child.exited.wait()
        if nursery.child_tasks:  # its stderr held open by a process it started, say
            nursery.cancel_scope.cancel()  # (a cancellation costs; most turns need none)


class _Child:
    """The running adapter: its stderr tail and when it exited."""

    def __init__(self, proc: AdapterProcess) -> None:
        self.proc = proc
        self.tail = StderrTail()
        self.stderr_done = trio.Event()
        #: Set by ``watch_exit``, the one task in ``proc.wait`` (a second would
        #: wait for trio's lock on it, a trip to the scheduler).
        self.exited = trio.Event()
        self.exited_at: float | None = None
        self._receive_scope: trio.CancelScope | None = None

    async def drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        try:
            while chunk := await read_pipe(self.proc.stderr, 65536):
                self.tail.feed(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.stderr_done.set()

    async def watch_exit(self) -> None:
        """Once the adapter exits, its stdout gets ``_EXIT_DRAIN`` to reach EOF.

        A process the adapter started may hold the pipe open after the
        adapter itself is gone; without this the turn would hang on it.
        """
        await self.proc.wait()
        self.exited_at = trio.current_time()
        self.exited.set()
        if self._receive_scope is not None:
            self._receive_scope.deadline = self.exited_at + _EXIT_DRAIN

    async def receive_stdout(self) -> bytes:
        """The next stdout chunk; ``b""`` at EOF or once the drain time is over."""
        stdout = self.proc.stdout
        assert stdout is not None
        if self.exited_at is None and isinstance(stdout, trio.lowlevel.FdStream):
            data = await read_ready(stdout, _READ_CHUNK)  # no scope for a read that need not wait
            if data is not None:
                return data
        with trio.CancelScope() as scope:
            if self.exited_at is not None:
                # Each read after the exit gets the full drain time: data still
                # in the pipe is read at once, however slow the client was.
                scope.deadline = trio.current_time() + _EXIT_DRAIN
            self._receive_scope = scope
            try:
                return await read_pipe(stdout, _READ_CHUNK)
            finally:
                self._receive_scope = None
        return b""


def crash_summary(outcome: AdapterOutcome) -> str:
    """``adapter exited with status 3 before session.ended`` (or ``was killed by ...``)."""
    return _lifecycle.crash_summary(outcome.exit_code)


def stderr_text(outcome: AdapterOutcome) -> str:
    """The adapter's stderr tail as text (stripped; ``""`` if it printed none)."""
    return outcome.stderr_tail.decode(errors="replace").strip()


def _feed_at_once(proc: AdapterProcess, spec_json: bytes) -> bytes:
    """Write what the stdin pipe takes without waiting; if that is all of it, close it.

    The usual case: a spec is far smaller than a pipe's buffer, so a turn needs
    no task to feed its adapter.  Returns what is left to write (``b""``: done).
    """
    stdin = proc.stdin
    if not isinstance(stdin, trio.lowlevel.FdStream):
        return spec_json
    try:
        written = os.write(stdin.fileno(), spec_json)
    except BlockingIOError:
        return spec_json
    except OSError:  # the adapter closed its stdin (EPIPE): nothing more to write
        written = len(spec_json)
    if written < len(spec_json):
        return spec_json[written:]
    stdin.close()
    return b""


async def read_pipe(stream: trio.abc.ReceiveStream, max_bytes: int) -> bytes:
    """``stream.receive_some(max_bytes)``, with fewer trips to the scheduler for a pipe
    (``fdio.read_some``: trio's yields before every read, then to wait)."""
    if not isinstance(stream, trio.lowlevel.FdStream):
        return bytes(await stream.receive_some(max_bytes))
    return await read_some(stream, max_bytes)


async def _feed_stdin(proc: AdapterProcess, spec_json: bytes) -> None:
    assert proc.stdin is not None
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await proc.stdin.send_all(spec_json)
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await proc.stdin.aclose()


async def _read_events(
    child: _Child, sink: EventSink, state: TurnState, max_event_bytes: int
) -> None:
    """Forward stdout lines as events until EOF or ``state`` wants no more.

    The lines a chunk completes (``LineFramer``) are turned into events by
    ``state`` and handed to the sink in one call.
    """
    framer = LineFramer(max_event_bytes)
    while state.reading:
        chunk = await child.receive_stdout()
        await _send(sink, state, state.output(framer.feed(chunk) if chunk else framer.end()))
        if not chunk:
            return
