"""An in-process adapter launcher for tests: plays the fake adapter's scripts, no process.

``ScriptedLauncher`` has ``run_adapter``'s contract (``trioserve.runtime._launcher``)
and plays what ``tests/helpers/fakeadapter.py`` would print for the same command and
turn input, in the test's Trio run: ``sleep`` is ``trio.sleep`` (virtual time
under a ``MockClock``), ``hang`` waits until the turn is stopped.  What it
prints goes where a real adapter's stdout goes: through a ``LineFramer`` to
the turn's ``TurnState``, which makes the events (and the ``error`` of a
crash, an oversized line, a failed start) exactly as for a process.

What it plays: the fake adapter's ``--startup-stderr`` and ``--startup-sleep``
and the steps ``event``, ``end``, ``raw``, ``big``, ``many``, ``tick``,
``stderr``, ``sleep``, ``hang``, ``ignore_sigint``, ``env``, ``record``, ``exit``.
The rest (``child``, ``nice``, ``count``, other startup flags, another command)
needs a process: the turn fails loudly (``AssertionError``), and such a test runs
with ``processes=True``.

Stops as a process takes them (``ProcessHandle``, ``stop_process``): on
``policy.interrupt()`` the adapter "gets SIGINT" and ends (exit -2) unless
it ignores SIGINT, when it is "killed" (exit -9) once the grace is over;
after ``session.ended`` it has up to 1 s (``_LINGER``) to finish its script,
and is stopped as a process would be if it has not.  Its pid is above the
kernel's largest (``SCRIPTED_PIDS``): no process ever has it (a signal to it
finds none), and ``pid_alive`` refuses it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import trio

from tests.helpers.procs import SCRIPTED_PIDS
from tests.helpers.specs import FAKE_ADAPTER
from trioserve.runtime import _process
from trioserve.runtime._framing import Line, LineFramer, Oversized
from trioserve.runtime._handle import ProcessHandle
from trioserve.runtime._lifecycle import TurnState
from trioserve.runtime._process import (
    AdapterOutcome,
    EventSink,
    ProcessGuard,
    Started,
    StderrTail,
    adapter_input,
)
from trioserve.spec._compiler import CompiledSpec

_POLL: Final = 0.005  # how often a playing adapter looks for a stop (its "SIGINT")


class ScriptedLauncher:
    """Plays each turn in-process; see the module doc."""

    def __init__(self) -> None:
        self._pids = itertools.count(SCRIPTED_PIDS)
        self.turns = 0  # how many turns it played

    async def __call__(
        self,
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
        assert started is None, "a scripted launcher runs without a warm pool"
        startup = _startup_flags(command)
        if state is None:
            state = TurnState(session_id)
        self.turns += 1
        pid = next(self._pids)
        outcome = AdapterOutcome(pid=pid)
        if guard is not None:
            guard.add(pid)
        play = _Play(spec, sink, state, max_event_bytes, env, pid)
        try:
            with policy.running(pid):
                await play.run(startup, policy)
        finally:
            signalled = await play.stop(policy)  # as ``stop_process``, shielded
            policy.reaped()
            if guard is not None:
                guard.remove(pid)
            outcome.stopped_by_server = signalled or policy.interrupted
            outcome.exit_code = play.exit_code
            outcome.stderr_tail = play.tail.tail()
            outcome.events = sink.sent
        crash = state.exited(
            outcome.exit_code,
            stopped_by_server=outcome.stopped_by_server,
            stderr_tail=outcome.stderr_tail,
        )
        await _process._send(sink, state, crash)
        return _process._finished(outcome, state)


def _startup_flags(command: Sequence[str]) -> list[tuple[str, str]]:
    prefix = len(FAKE_ADAPTER)
    assert list(command[:prefix]) == FAKE_ADAPTER, f"not the fake adapter: {command}"
    rest = list(command[prefix:])
    flags = list(zip(rest[::2], rest[1::2], strict=True))
    for flag, _ in flags:
        assert flag in ("--startup-stderr", "--startup-sleep"), f"needs a process: {flag}"
    return flags


class _Exit(Exception):
    """The script exits here (``{"exit": CODE}``)."""


class _Play:
    """One turn of the fake adapter, played: a "process" that runs its script."""

    def __init__(
        self,
        spec: CompiledSpec,
        sink: EventSink,
        state: TurnState,
        max_event_bytes: int,
        env: Mapping[str, str] | None,
        pid: int,
    ) -> None:
        self.raw = adapter_input(spec)
        self.spec: dict[str, Any] = json.loads(self.raw)
        self.sink = sink
        self.state = state
        self.framer = LineFramer(max_event_bytes)
        self.env = os.environ if env is None else env
        self.pid = pid
        self.tail = StderrTail()
        self.exit_code: int | None = None  # set once it has exited
        self.ignores_sigint = False
        self._alive = trio.CancelScope()  # cancelled: the process is gone or must stop
        self._grace = 0.0

    async def run(self, startup: list[tuple[str, str]], policy: ProcessHandle) -> None:
        """The process's life as ``run_adapter`` sees it: it prints, it exits, or the
        server stops reading (then it is stopped after ``_LINGER``, or at once)."""
        self._grace = policy.grace
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._sigint, policy)
            with self._alive, contextlib.suppress(_Exit):
                await self._play(startup)
                self.exit_code = 0
            if self.exit_code is not None and self.state.reading:
                # It exited: its stdout is at EOF (a last line without its newline counts).
                await self._send(self.framer.end())
            nursery.cancel_scope.cancel()

    async def stop(self, policy: ProcessHandle) -> bool:
        """``stop_process``: a process still running gets SIGINT (if not interrupted yet),
        the rest of the grace if it ignores it, then SIGKILL.  True if it was signalled."""
        if self.exit_code is not None:
            return False
        with trio.CancelScope(shield=True):
            if self.ignores_sigint:
                await trio.sleep(policy.remaining())
                self.exit_code = -signal.SIGKILL
            else:
                self.exit_code = -signal.SIGINT
        return True

    async def _sigint(self, policy: ProcessHandle) -> None:
        """An interrupt is SIGINT: the adapter dies of it, unless it ignores it."""
        while not policy.interrupted or self.ignores_sigint:
            await trio.sleep(_POLL)
        if self.exit_code is None:
            self.exit_code = -signal.SIGINT
        self._alive.cancel()

    async def _play(self, startup: list[tuple[str, str]]) -> None:
        for flag, value in startup:
            if flag == "--startup-stderr":
                self.tail.feed(value.encode())
            else:
                await trio.sleep(float(value))
        task = str(self.spec.get("task", ""))
        await self._emit("session.started", {"pid": self.pid, "ppid": os.getpid()})
        if not task.startswith("script:"):
            await self._emit("message", {"role": "assistant", "text": f"echo: {task}"})
            await self._emit("session.ended", {"reason": "completed"})
            return
        for step in json.loads(task[len("script:") :]):
            await self._step(step)

    async def _step(self, step: dict[str, Any]) -> None:
        if "event" in step:
            await self._emit(step["event"], step.get("data"))
        elif "end" in step:
            await self._emit("session.ended", {"reason": step["end"]})
        elif "raw" in step:
            await self._print(str(step["raw"]).encode() + b"\n")
        elif "big" in step:
            await self._emit("message", {"role": "assistant", "content": "x" * int(step["big"])})
        elif "many" in step:
            line = '{"v":1,"type":"message","sessionId":"%s","data":{"i":%d}}\n'
            session = self.spec.get("sessionId", "")
            await self._print("".join(line % (session, i) for i in range(step["many"])).encode())
        elif "tick" in step:
            for i in range(int(step["tick"])):
                await self._emit("message", {"i": i})
                await trio.sleep(float(step.get("every", 0.01)))
        elif "stderr" in step:
            self.tail.feed(str(step["stderr"]).encode())
        elif "sleep" in step:
            await trio.sleep(float(step["sleep"]))
        elif "hang" in step:
            await trio.sleep_forever()
        elif "ignore_sigint" in step:
            self.ignores_sigint = True
        elif "env" in step:
            await self._emit("message", {"env": self.env.get(step["env"])})
        elif "record" in step:
            await trio.Path(step["record"]).write_bytes(self.raw)
        elif "exit" in step:
            self.exit_code = int(step["exit"])
            raise _Exit
        else:
            raise AssertionError(f"a scripted adapter cannot play {step}: it needs a process")

    async def _emit(self, event_type: str, data: dict[str, Any] | None) -> None:
        event = {
            "v": 1,
            "type": event_type,
            "ts": "2026-01-01T00:00:00Z",
            "sessionId": self.spec.get("sessionId", ""),
            "data": data or {},
        }
        await self._print(json.dumps(event).encode() + b"\n")

    async def _print(self, data: bytes) -> None:
        """Bytes on stdout: framed and turned into events while the server reads."""
        if not self.state.reading:
            await trio.lowlevel.checkpoint()  # nobody reads: the pipe takes it
            return
        await self._send(self.framer.feed(data))
        if not self.state.reading:
            # After session.ended the adapter should exit by itself (``_LINGER``);
            # after an error, or with nobody listening, it is stopped at once.
            ended = self.state.failure is None and self.state.listening
            linger = min(self._grace, _process._LINGER) if ended else 0.0
            self._alive.deadline = trio.current_time() + linger

    async def _send(self, items: Sequence[Line | Oversized]) -> None:
        await _process._send(self.sink, self.state, self.state.output(items))
