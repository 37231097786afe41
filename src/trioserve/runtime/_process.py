"""One turn's adapter process: spawn, feed, read, stop, reap.

``run_adapter`` is called inside the turn's nursery and owns the child for
its whole life (it starts it, or takes one the warm pool started).  The
child runs in its own process group; the CompiledSpec is written to its
stdin, which is then closed; each stdout line becomes an ``Event`` handed
to the turn's sink (the lines of one read together); the last 64 KiB of
stderr are kept to explain a crash (in the ``error`` event, or only in the
outcome with ``stderr_to_client=False``).  However ``run_adapter`` ends (the adapter finished, a
limit was hit, or the caller was cancelled), the child and its process
group are stopped and reaped before it returns: SIGINT to the group, then
SIGKILL after the stop grace, shielded from cancellation.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import trio

from trioserve.protocol import SESSION_ENDED
from trioserve.runtime import _wire as wire

if TYPE_CHECKING:
    from trioserve.spec._compiler import CompiledSpec

log = logging.getLogger("trioserve.adapter")

STDERR_TAIL_BYTES = 64 * 1024
_READ_CHUNK = 256 * 1024
_KILL_WAIT = 5.0  # how long to wait for a SIGKILLed child to be reaped
_EXIT_DRAIN = 1.0  # after the adapter exits: time for its pipes to reach EOF
_LINGER = 1.0  # after session.ended: time to exit before SIGINT


class EventSink:
    """Where a turn's events go; ``send_many`` returns False once nobody listens.

    This one puts them on a memory channel (tests use it); the server's is
    ``trioserve.turns.TurnLog``.  ``run_adapter`` hands over every event a
    chunk of stdout held in one ``send_many`` call.
    """

    def __init__(self, channel: trio.MemorySendChannel[wire.Event]) -> None:
        self._channel = channel
        self.sent = 0
        self.listening = True

    async def send(self, event: wire.Event) -> bool:
        return await self.send_many([event])

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
class StopPolicy:
    """How to stop the child, and a handle to ask for a graceful stop.

    ``interrupt()`` (from any task) sends SIGINT to the adapter's group at
    once and keeps reading its output, so the adapter's own last events
    (often a ``session.ended`` ``cancelled``) still arrive; if it has not
    exited ``grace`` seconds later it gets SIGKILL.  ``force()`` (a forced
    shutdown) cuts the grace to nothing: SIGKILL at once, on purpose, so it
    is not reported as an adapter that ignored SIGINT.
    """

    grace: float = 5.0
    interrupted_at: float | None = None
    forced: bool = False
    _scope: trio.CancelScope | None = None
    _pid: int | None = None

    def force(self) -> None:
        """Stop at once: no grace (SIGKILL right after SIGINT)."""
        self.forced = True
        self.grace = 0.0
        self.interrupt()

    def interrupt(self) -> None:
        if self.interrupted_at is None:
            self.interrupted_at = trio.current_time()
            if self._pid is not None:
                _signal_group(self._pid, signal.SIGINT)
        if self._scope is not None:
            self._scope.deadline = self.interrupted_at + self.grace

    def _attach(self, pid: int, scope: trio.CancelScope) -> None:
        """Called by ``run_adapter`` once the child runs; applies an early interrupt."""
        self._pid, self._scope = pid, scope
        if self.interrupted_at is not None:
            self.interrupted_at = None
            self.interrupt()

    def _remaining(self) -> float:
        if self.interrupted_at is None:
            return self.grace
        return max(0.0, self.interrupted_at + self.grace - trio.current_time())


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


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


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


async def stop_process(proc: trio.Process, policy: StopPolicy) -> bool:
    """Stop and reap ``proc`` and its group; True if it had to be signalled."""
    signalled = False
    with trio.CancelScope(shield=True):
        if proc.returncode is None:
            signalled = True
            if policy.interrupted_at is None:
                _signal_group(proc.pid, signal.SIGINT)
            with trio.move_on_after(policy._remaining()):
                await proc.wait()
            if proc.returncode is None:
                if policy.forced:
                    log.info("adapter pid %d force-stopped (SIGKILL)", proc.pid)
                else:
                    log.warning("adapter pid %d ignored SIGINT; sending SIGKILL", proc.pid)
                _signal_group(proc.pid, signal.SIGKILL)
                with trio.move_on_after(_KILL_WAIT):
                    await proc.wait()
        # Anything the adapter left behind in its group goes too.
        _signal_group(proc.pid, signal.SIGKILL)
    return signalled


async def spawn(
    command: Sequence[str], env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> trio.Process:
    """Start an adapter in its own process group, its stdio on pipes.  ``OSError`` if it can't."""
    return await trio.lowlevel.open_process(
        list(command),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=dict(env) if env is not None else None,
        cwd=cwd,
    )


@dataclass(eq=False)
class Started:
    """An adapter started ahead of its turn (see ``trioserve.runtime._pool``).

    ``stderr`` is what it printed before the turn; the turn's stderr tail
    begins with it.  Its pid is already registered with the guard.
    """

    proc: trio.Process
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
    policy: StopPolicy,
    max_event_bytes: int,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    guard: ProcessGuard | None = None,
    started: Started | None = None,
    stderr_to_client: bool = True,
) -> AdapterOutcome:
    """Run one adapter turn, sending its events to ``sink``; see the module doc.

    With ``started``, that process is used instead of starting one (its
    ownership passes to this call, which stops and reaps it like any other).
    If the adapter exits without ``session.ended``, the ``error`` event says
    how, with its stderr tail; with ``stderr_to_client=False`` it says the
    tail is in the server log instead (the caller logs ``stderr_tail``).
    """
    outcome = AdapterOutcome()
    if started is not None:
        proc = started.proc
    else:
        try:
            proc = await spawn(command, env, cwd)
        except OSError as exc:
            outcome.error = f"adapter failed to start ({' '.join(command)}): {exc.strerror or exc}"
            outcome.error_reason = "adapter_start_failed"
            await sink.send(wire.error_event(session_id, outcome.error))
            return outcome
        if guard is not None:
            guard.add(proc.pid)
    outcome.pid = proc.pid
    child = _Child(proc)
    if started is not None:
        child.tail.feed(started.stderr)
    try:
        with trio.CancelScope() as interrupted:
            policy._attach(proc.pid, interrupted)
            await _supervise(child, spec, session_id, sink, outcome, policy, max_event_bytes)
    finally:
        policy._scope = None
        if await stop_process(proc, policy) or policy.interrupted_at is not None:
            outcome.stopped_by_server = True
        policy._pid = None  # reaped: the pid may be reused
        if guard is not None:
            guard.remove(proc.pid)
        outcome.exit_code = proc.returncode
        outcome.stderr_tail = child.tail.tail()
        outcome.events = sink.sent
    crashed = outcome.end_reason is None and outcome.error is None
    if crashed and sink.listening and not outcome.stopped_by_server:
        outcome.error = _crash_message(outcome, stderr_to_client)
        outcome.error_reason = "adapter_exit"
        await sink.send(wire.error_event(session_id, outcome.error, exitCode=outcome.exit_code))
    return outcome


async def _supervise(
    child: _Child,
    spec: CompiledSpec,
    session_id: str,
    sink: EventSink,
    outcome: AdapterOutcome,
    policy: StopPolicy,
    max_event_bytes: int,
) -> None:
    """Feed the child, read its events, and let it exit; see ``run_adapter``."""
    proc = child.proc
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_feed_stdin, proc, adapter_input(spec))
        nursery.start_soon(child.drain_stderr)
        nursery.start_soon(child.watch_exit)
        await _read_events(child, session_id, sink, outcome, max_event_bytes)
        if outcome.error is None and sink.listening:
            if outcome.end_reason is None:
                # stdout closed (or the adapter exited): collect the exit
                # status and the rest of stderr, to explain the crash.
                await proc.wait()
                with trio.move_on_after(_EXIT_DRAIN):
                    await child.stderr_done.wait()
            else:
                # After session.ended the adapter should exit by itself.
                with trio.move_on_after(min(policy.grace, _LINGER)):
                    await proc.wait()
        nursery.cancel_scope.cancel()


class _Child:
    """The running adapter: its stderr tail and when it exited."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.tail = StderrTail()
        self.stderr_done = trio.Event()
        self.exited_at: float | None = None
        self._receive_scope: trio.CancelScope | None = None

    async def drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        try:
            while chunk := await self.proc.stderr.receive_some(65536):
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
        if self._receive_scope is not None:
            self._receive_scope.deadline = self.exited_at + _EXIT_DRAIN

    async def receive_stdout(self) -> bytes:
        """The next stdout chunk; ``b""`` at EOF or once the drain time is over."""
        assert self.proc.stdout is not None
        with trio.CancelScope() as scope:
            if self.exited_at is not None:
                # Each read after the exit gets the full drain time: data still
                # in the pipe is read at once, however slow the client was.
                scope.deadline = trio.current_time() + _EXIT_DRAIN
            self._receive_scope = scope
            try:
                return bytes(await self.proc.stdout.receive_some(_READ_CHUNK))
            finally:
                self._receive_scope = None
        return b""


def crash_summary(outcome: AdapterOutcome) -> str:
    """``adapter exited with status 3 before session.ended`` (or ``was killed by ...``)."""
    code = outcome.exit_code if outcome.exit_code is not None else -1
    return f"adapter {describe_exit(code)} before session.ended"


def stderr_text(outcome: AdapterOutcome) -> str:
    """The adapter's stderr tail as text (stripped; ``""`` if it printed none)."""
    return outcome.stderr_tail.decode(errors="replace").strip()


def _crash_message(outcome: AdapterOutcome, stderr_to_client: bool) -> str:
    message, stderr = crash_summary(outcome), stderr_text(outcome)
    if not stderr:
        return f"{message} (no stderr output)"
    if not stderr_to_client:
        return f"{message}; its stderr is in the server log"
    return f"{message}; stderr: {stderr}"


async def _feed_stdin(proc: trio.Process, spec_json: bytes) -> None:
    assert proc.stdin is not None
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await proc.stdin.send_all(spec_json)
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await proc.stdin.aclose()


async def _read_events(
    child: _Child,
    session_id: str,
    sink: EventSink,
    outcome: AdapterOutcome,
    max_event_bytes: int,
) -> None:
    """Forward stdout lines as events until EOF, session.ended, or a fatal line.

    The lines a chunk completes are decoded and handed to the sink in one
    call.  The start of a line still without its newline waits in ``parts``
    and is joined once, when the newline comes: a long line costs one copy,
    not one per chunk.
    """
    parts: list[bytes] = []
    waiting = 0  # bytes in parts
    while True:
        chunk = await child.receive_stdout()
        if not chunk:
            if waiting:  # a last line without its newline is still a line
                await _forward([b"".join(parts)], session_id, sink, outcome)
            return
        end = chunk.rfind(b"\n")
        if end < 0:
            parts.append(chunk)
            waiting += len(chunk)
            if waiting > max_event_bytes:
                await _oversized(session_id, sink, outcome, max_event_bytes)
                return
            continue
        complete = b"".join([*parts, chunk[:end]]) if parts else chunk[:end]
        lines = complete.split(b"\n")
        rest = chunk[end + 1 :]
        parts, waiting = ([rest], len(rest)) if rest else ([], 0)
        if max(map(len, lines)) > max_event_bytes:
            fits = list(itertools.takewhile(lambda line: len(line) <= max_event_bytes, lines))
            if await _forward(fits, session_id, sink, outcome):
                await _oversized(session_id, sink, outcome, max_event_bytes)
            return
        if not await _forward(lines, session_id, sink, outcome):
            return
        if waiting > max_event_bytes:
            await _oversized(session_id, sink, outcome, max_event_bytes)
            return


async def _forward(
    lines: list[bytes], session_id: str, sink: EventSink, outcome: AdapterOutcome
) -> bool:
    """Send the events of ``lines``; False when reading should stop."""
    events: list[wire.Event] = []
    go_on = True
    for line in lines:
        try:
            event = wire.decode_line(line)
        except wire.DecodeError as exc:
            if line.strip():
                preview = line[:200].decode(errors="replace")
                message = f"adapter printed an undecodable line ({exc}): {preview}"
                events.append(wire.error_event(session_id, message))
            continue
        events.append(event)
        if event.type == SESSION_ENDED:
            outcome.end_reason = event.end_reason or "completed"
            go_on = False
            break
    if events and not await sink.send_many(events):
        return False
    return go_on


async def _oversized(session_id: str, sink: EventSink, outcome: AdapterOutcome, limit: int) -> None:
    outcome.error = f"adapter printed an event line longer than {limit} bytes; adapter stopped"
    outcome.error_reason = "event_too_large"
    await sink.send(wire.error_event(session_id, outcome.error))
