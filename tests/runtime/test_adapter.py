"""One adapter turn: spawn, feed stdin, forward events, stop and reap."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import trio

from tests.helpers import FAKE_ADAPTER, pid_alive, script, typed_spec
from tests.helpers.sinks import InterruptOn
from trioserve.runtime._handle import ProcessHandle
from trioserve.runtime._process import AdapterOutcome, ChannelSink, adapter_input, run_adapter
from trioserve.runtime._wire import Event
from trioserve.spec._compiler import CompiledSpec

SESSION = "s_test"
SAFETY = 20  # seconds: a hung test fails instead of hanging the suite


def spec_of(task: str) -> CompiledSpec:
    """The test agent's spec for one turn of session ``SESSION``."""
    return typed_spec().with_turn(task, SESSION)


def fake_line(event_type: str, data: dict[str, Any]) -> bytes:
    """The exact bytes the fake adapter prints for an event."""
    event = {"v": 1, "type": event_type, "ts": "2026-01-01T00:00:00Z", "sessionId": SESSION}
    return json.dumps({**event, "data": data}).encode()


def python_command(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def drain(receive: trio.MemoryReceiveChannel[Event]) -> list[Event]:
    events = []
    while True:
        try:
            events.append(receive.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return events


async def run(
    task: str = "hello",
    *,
    command: list[str] | None = None,
    spec: CompiledSpec | None = None,
    grace: float = 2.0,
    max_event_bytes: int = 1 << 20,
    safety: float = SAFETY,
    **kwargs: Any,
) -> tuple[AdapterOutcome, list[Event]]:
    """Run one turn to completion; return its outcome and every event sent."""
    send, receive = trio.open_memory_channel[Event](math.inf)
    sink = ChannelSink(send)
    with trio.fail_after(safety):
        outcome = await run_adapter(
            command or FAKE_ADAPTER,
            spec if spec is not None else spec_of(task),
            SESSION,
            sink,
            policy=ProcessHandle(grace=grace),
            max_event_bytes=max_event_bytes,
            **kwargs,
        )
    return outcome, drain(receive)


def errors(events: list[Event]) -> list[Event]:
    return [e for e in events if e.type == "error"]


async def wait_gone(pid: int) -> bool:
    """Poll until ``pid`` is gone (or a zombie); False if still alive after 3 s."""
    with trio.move_on_after(3.0):
        while pid_alive(pid):
            await trio.sleep(0.02)
        return True
    return False


class Turn:
    """A turn running in the background, for tests that cancel or stop listening."""

    def __init__(
        self,
        task: str = "",
        *,
        command: list[str] | None = None,
        grace: float = 2.0,
        buffer: float = math.inf,
    ) -> None:
        self.task = task
        self.command = command or FAKE_ADAPTER
        self.grace = grace
        self.send, self.receive = trio.open_memory_channel[Event](buffer)
        self.scope = trio.CancelScope()
        self.outcome: AdapterOutcome | None = None
        self.done = trio.Event()

    async def run(self) -> None:
        try:
            with self.scope:
                self.outcome = await run_adapter(
                    self.command,
                    spec_of(self.task),
                    SESSION,
                    ChannelSink(self.send),
                    policy=ProcessHandle(grace=self.grace),
                    max_event_bytes=1 << 20,
                )
        finally:
            self.done.set()

    async def next_event(self) -> Event:
        with trio.fail_after(SAFETY):
            return await self.receive.receive()


# --- normal turns ---------------------------------------------------------------------


async def test_normal_turn_forwards_events_exactly_as_printed() -> None:
    outcome, events = await run("hello")
    assert [e.type for e in events] == ["session.started", "message", "session.ended"]
    pid = events[0].data["pid"]
    assert events[0].raw == fake_line("session.started", {"pid": pid, "ppid": os.getpid()})
    assert events[1].raw == fake_line("message", {"role": "assistant", "text": "echo: hello"})
    assert events[2].raw == fake_line("session.ended", {"reason": "completed"})
    assert outcome.pid == pid
    assert outcome.end_reason == "completed"
    assert outcome.error is None
    assert outcome.exit_code == 0
    assert outcome.events == 3
    assert not outcome.stopped_by_server
    assert not pid_alive(pid)


async def test_odd_formatting_unknown_types_and_extra_fields_pass_through() -> None:
    lines = [
        '{ "v" : 1 , "type" : "message" , "data" : {"content":"h\\u00e9"} , "x": [1, 2.50] }',
        '{"type":"vendor.custom","v":1,"sessionId":"other","data":{"deep":{"a":null}},"z":1}',
        '{"v":1,"type":"session.ended","data":{"reason":"completed","extra":true}}',
    ]
    outcome, events = await run(script(*({"raw": line} for line in lines)))
    assert [e.raw for e in events[1:]] == [line.encode() for line in lines]
    assert [e.type for e in events[1:]] == ["message", "vendor.custom", "session.ended"]
    assert outcome.end_reason == "completed"
    assert errors(events) == []


async def test_end_reason_comes_from_session_ended() -> None:
    outcome, events = await run(script({"end": "error"}))
    assert outcome.end_reason == "error"
    assert outcome.error is None
    assert errors(events) == []


async def test_adapter_receives_exactly_the_spec_and_stdin_is_closed(tmp_path: Path) -> None:
    record = tmp_path / "stdin.json"
    # Larger than a pipe buffer: the whole spec must arrive, then EOF (the fake
    # adapter reads stdin to EOF before it prints anything).
    spec = spec_of(script({"record": str(record)}, {"end": "completed"}))
    spec = spec.model_copy(update={"output_schema": {"pad": "p" * 300_000}})
    outcome, events = await run(spec=spec)
    assert record.read_bytes() == adapter_input(spec)
    assert [e.type for e in events] == ["session.started", "session.ended"]
    assert outcome.error is None


async def test_many_events_arrive_complete_and_in_order() -> None:
    count = 20_000
    outcome, events = await run(script({"many": count}, {"end": "completed"}))
    messages = [e for e in events if e.type == "message"]
    assert [m.data["i"] for m in messages] == list(range(count))
    assert errors(events) == []
    assert outcome.events == count + 2


async def test_events_after_session_ended_are_not_forwarded() -> None:
    outcome, events = await run(
        script({"end": "completed"}, {"event": "message", "data": {"late": True}})
    )
    assert [e.type for e in events] == ["session.started", "session.ended"]
    assert outcome.error is None


async def test_nonzero_exit_after_session_ended_adds_no_error() -> None:
    outcome, events = await run(script({"end": "completed"}, {"stderr": "bye"}, {"exit": 5}))
    assert [e.type for e in events] == ["session.started", "session.ended"]
    assert outcome.exit_code == 5
    assert outcome.error is None


async def test_env_and_cwd_are_passed_to_the_adapter(tmp_path: Path) -> None:
    code = (
        "import json, os, sys; sys.stdin.read()\n"
        "data = {'env': os.environ.get('ADAPTER_TEST_VAR'), 'cwd': os.getcwd()}\n"
        "print(json.dumps({'v': 1, 'type': 'message', 'data': data}))\n"
        "print(json.dumps({'v': 1, 'type': 'session.ended', 'data': {'reason': 'completed'}}))"
    )
    env = {"PATH": os.environ.get("PATH", ""), "ADAPTER_TEST_VAR": "from-test"}
    outcome, events = await run(command=python_command(code), env=env, cwd=tmp_path)
    assert events[0].data == {"env": "from-test", "cwd": str(tmp_path)}
    assert outcome.end_reason == "completed"


# --- crashes --------------------------------------------------------------------------


async def test_exit_zero_without_session_ended_is_an_error() -> None:
    outcome, events = await run(script({"exit": 0}))
    assert [e.type for e in events] == ["session.started", "error"]
    error = events[1]
    assert "exited with status 0" in error.data["message"]
    assert error.json()["sessionId"] == SESSION
    assert outcome.error == error.data["message"]
    assert outcome.exit_code == 0
    assert outcome.end_reason is None


async def test_exit_status_and_stderr_are_in_the_error() -> None:
    outcome, events = await run(script({"stderr": "fatal: no API key configured\n"}, {"exit": 3}))
    [error] = errors(events)
    assert events[-1] is error
    message = error.data["message"]
    assert "exited with status 3" in message
    assert "fatal: no API key configured" in message
    assert error.data.get("exitCode") == 3
    assert outcome.exit_code == 3
    assert outcome.stderr_tail == b"fatal: no API key configured\n"
    assert outcome.error == message


async def test_killed_by_a_signal_is_named() -> None:
    command = python_command("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    outcome, events = await run(command=command)
    [error] = events
    assert error.type == "error"
    assert "killed by SIGKILL" in error.data["message"]
    assert outcome.exit_code == -signal.SIGKILL
    assert not outcome.stopped_by_server


async def test_stderr_tail_keeps_only_the_last_64_kib() -> None:
    tail = "B" * (64 * 1024 - 4) + "END\n"
    head = "A" * (136 * 1024)
    outcome, events = await run(script({"stderr": head + tail}, {"exit": 2}))
    assert outcome.stderr_tail == tail.encode()
    [error] = errors(events)
    assert "B" * 1000 + "END" in error.data["message"]
    assert "A" not in error.data["message"].split("stderr:", 1)[1]


def _block_event_loop(seconds: float) -> None:
    """Keep the Trio loop busy, as a loaded server would (a blocking call)."""
    time.sleep(seconds)


async def test_stderr_written_just_before_exit_is_not_lost_on_a_busy_loop() -> None:
    # The adapter prints its fatal error last, then exits.  More than one read's
    # worth of stderr is still in the pipe when the exit is noticed (the pipe is
    # enlarged so the write does not block); it must all reach the tail.
    code = (
        "import fcntl, os, sys, time\n"
        "sys.stdin.read()\n"
        'print(\'{"v":1,"type":"session.started","data":{}}\', flush=True)\n'
        "time.sleep(0.1)\n"
        "try:\n"
        "    size = fcntl.fcntl(2, 1031, 1 << 20)  # F_SETPIPE_SZ\n"
        "except OSError:\n"
        "    size = 65536\n"
        "os.write(2, b'x' * (size - 100) + b'\\nFATAL: the real reason\\n')\n"
        "os._exit(4)\n"
    )
    turn = Turn(command=python_command(code))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(turn.run)
        assert (await turn.next_event()).type == "session.started"
        _block_event_loop(0.5)  # meanwhile the adapter writes stderr and exits
        with trio.fail_after(SAFETY):
            await turn.done.wait()
    assert turn.outcome is not None
    assert turn.outcome.exit_code == 4
    assert turn.outcome.stderr_tail.endswith(b"FATAL: the real reason\n")
    [error] = errors(drain(turn.receive))
    assert "FATAL: the real reason" in error.data["message"]


async def test_command_that_does_not_exist_is_one_error_event(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-adapter")
    outcome, events = await run(command=[missing, "--flag"])
    [error] = events
    assert error.type == "error"
    assert "adapter failed to start" in error.data["message"]
    assert missing in error.data["message"]
    assert error.json()["sessionId"] == SESSION
    assert outcome.error == error.data["message"]
    assert outcome.pid is None


async def test_command_that_is_not_executable_is_one_error_event(tmp_path: Path) -> None:
    program = tmp_path / "adapter"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o644)
    outcome, events = await run(command=[str(program)])
    assert [e.type for e in events] == ["error"]
    assert "adapter failed to start" in events[0].data["message"]
    assert outcome.error is not None


# --- bad output -----------------------------------------------------------------------


async def test_garbage_line_is_an_error_event_and_reading_continues() -> None:
    outcome, events = await run(
        script(
            {"raw": "this is not json"},
            {"event": "message", "data": {"n": 1}},
            {"raw": '{"v":2,"type":"message","data":{}}'},
            {"event": "message", "data": {"n": 2}},
            {"end": "completed"},
        )
    )
    types = [e.type for e in events]
    assert types == ["session.started", "error", "message", "error", "message", "session.ended"]
    assert "this is not json" in events[1].data["message"]
    assert "v" in events[3].data["message"]
    assert [e.data.get("n") for e in events if e.type == "message"] == [1, 2]
    assert all(e.json()["sessionId"] == SESSION for e in errors(events))
    assert outcome.end_reason == "completed"


async def test_reserialized_line_with_lone_surrogate_does_not_crash_the_turn() -> None:
    # Valid JSON with a \r between tokens (so it must be re-serialized) and a lone
    # surrogate escape.  It must be forwarded or reported; the turn goes on.
    line = '{"v":1,\r"type":"message","data":{"content":"\\ud800"}}'
    outcome, events = await run(
        script({"raw": line}, {"event": "message", "data": {"n": 1}}, {"end": "completed"})
    )
    assert [e.type for e in events][-2:] == ["message", "session.ended"]
    assert events[-2].data == {"n": 1}
    assert outcome.end_reason == "completed"


async def test_blank_lines_are_ignored() -> None:
    outcome, events = await run(script({"raw": ""}, {"raw": "   "}, {"end": "completed"}))
    assert [e.type for e in events] == ["session.started", "session.ended"]
    assert outcome.error is None


async def test_oversized_line_stops_the_adapter() -> None:
    outcome, events = await run(script({"big": 5000}, {"hang": True}), max_event_bytes=1000)
    assert [e.type for e in events] == ["session.started", "error"]
    assert "1000" in events[1].data["message"]
    assert outcome.error == events[1].data["message"]
    assert outcome.stopped_by_server
    pid = events[0].data["pid"]
    assert await wait_gone(pid)


async def test_nothing_is_forwarded_after_an_oversized_line() -> None:
    outcome, events = await run(
        script({"big": 5000}, {"event": "message", "data": {"late": 1}}, {"end": "completed"}),
        max_event_bytes=1000,
    )
    assert [e.type for e in events] == ["session.started", "error"]
    assert outcome.error is not None
    assert outcome.end_reason is None


async def test_oversized_line_arriving_in_many_reads_stops_the_adapter() -> None:
    # 300 KB with no newline in any single read: the limit applies to the partial line.
    outcome, events = await run(script({"big": 300_000}, {"hang": True}), max_event_bytes=100_000)
    [error] = errors(events)
    assert "100000" in error.data["message"]
    assert outcome.error == error.data["message"]
    assert await wait_gone(events[0].data["pid"])


def _line_of(size: int) -> str:
    prefix, suffix = '{"v":1,"type":"message","data":{"content":"', '"}}'
    return prefix + "x" * (size - len(prefix) - len(suffix)) + suffix


async def test_line_of_exactly_the_limit_passes() -> None:
    line = _line_of(1000)
    assert len(line) == 1000
    outcome, events = await run(script({"raw": line}, {"end": "completed"}), max_event_bytes=1000)
    assert [e.type for e in events] == ["session.started", "message", "session.ended"]
    assert events[1].raw == line.encode()
    assert outcome.error is None


async def test_line_one_byte_over_the_limit_fails() -> None:
    line = _line_of(1001)
    outcome, events = await run(script({"raw": line}, {"end": "completed"}), max_event_bytes=1000)
    assert [e.type for e in events] == ["session.started", "error"]
    assert outcome.error is not None


async def test_final_line_without_newline_is_forwarded() -> None:
    code = (
        "import sys; sys.stdin.read()\n"
        'sys.stdout.write(\'{"v":1,"type":"session.started","data":{}}\\n\')\n'
        'sys.stdout.write(\'{"v":1,"type":"session.ended","data":{"reason":"completed"}}\')'
    )
    outcome, events = await run(command=python_command(code))
    assert [e.type for e in events] == ["session.started", "session.ended"]
    assert events[1].raw == b'{"v":1,"type":"session.ended","data":{"reason":"completed"}}'
    assert outcome.end_reason == "completed"
    assert outcome.error is None


# --- stopping -------------------------------------------------------------------------


async def test_cancelling_the_caller_stops_the_adapter_and_reaps_it() -> None:
    turn = Turn(script({"hang": True}))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(turn.run)
        started = await turn.next_event()
        pid = started.data["pid"]
        assert pid_alive(pid)
        turn.scope.cancel()
        with trio.fail_after(SAFETY):
            await turn.done.wait()
        # Reaped before run_adapter returned: no process, no zombie.
        assert not pid_alive(pid)
    assert turn.scope.cancelled_caught
    assert turn.outcome is None
    assert drain(turn.receive) == []  # no synthetic error for a turn we stopped


async def test_adapter_ignoring_sigint_is_killed_after_the_grace() -> None:
    turn = Turn(script({"ignore_sigint": True}, {"hang": True}), grace=0.5)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(turn.run)
        pid = (await turn.next_event()).data["pid"]
        # Give the adapter time to install its SIG_IGN handler.
        await trio.sleep(0.2)
        turn.scope.cancel()
        with trio.fail_after(SAFETY):
            await turn.done.wait()
        assert not pid_alive(pid)
    assert turn.scope.cancelled_caught


async def test_grandchild_is_killed_when_the_turn_is_cancelled() -> None:
    turn = Turn(script({"child": True}, {"hang": True}))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(turn.run)
        pid = (await turn.next_event()).data["pid"]
        child_pid = (await turn.next_event()).data["childPid"]
        assert pid_alive(child_pid)
        turn.scope.cancel()
        with trio.fail_after(SAFETY):
            await turn.done.wait()
        assert not pid_alive(pid)
        assert await wait_gone(child_pid)


async def test_grandchild_left_behind_after_a_finished_turn_is_killed() -> None:
    outcome, events = await run(script({"child": True}, {"end": "completed"}))
    child_pid = events[1].data["childPid"]
    assert outcome.end_reason == "completed"
    assert errors(events) == []
    assert await wait_gone(child_pid)


async def test_crash_is_reported_even_if_a_grandchild_keeps_stdout_open() -> None:
    # The adapter starts a helper (which inherits stdout and stderr) and then
    # crashes.  The turn must end with the crash error, not wait for the helper.
    outcome, events = await run(
        script({"child": True}, {"stderr": "boom"}, {"exit": 3}), grace=0.5, safety=5
    )
    child_pid = events[1].data["childPid"]
    [error] = errors(events)
    assert "exited with status 3" in error.data["message"]
    assert "boom" in error.data["message"]
    assert outcome.exit_code == 3
    assert await wait_gone(child_pid)


async def test_receiver_closed_mid_stream_stops_the_adapter() -> None:
    turn = Turn(script({"many": 1000}, {"hang": True}), buffer=0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(turn.run)
        pid = (await turn.next_event()).data["pid"]
        await turn.receive.aclose()
        with trio.fail_after(SAFETY):
            await turn.done.wait()
        assert not pid_alive(pid)
    assert turn.outcome is not None
    assert turn.outcome.stopped_by_server
    assert turn.outcome.events == 1


async def test_adapter_lingering_after_session_ended_is_stopped_without_error() -> None:
    outcome, events = await run(script({"end": "completed"}, {"sleep": 30}), grace=0.3)
    assert [e.type for e in events] == ["session.started", "session.ended"]
    assert outcome.end_reason == "completed"
    assert outcome.error is None
    assert outcome.stopped_by_server
    assert not pid_alive(events[0].data["pid"])


async def test_lingering_adapter_that_ignores_sigint_is_killed() -> None:
    outcome, events = await run(
        script({"ignore_sigint": True}, {"end": "completed"}, {"sleep": 30}), grace=0.3
    )
    assert [e.type for e in events] == ["session.started", "session.ended"]
    assert outcome.exit_code == -signal.SIGKILL
    assert outcome.stopped_by_server
    assert outcome.error is None
    assert not pid_alive(events[0].data["pid"])


async def _run_with_policy(
    task: str,
    policy: ProcessHandle,
    *,
    command: list[str] | None = None,
    interrupt_on: str | None = None,
) -> tuple[AdapterOutcome, trio.MemoryReceiveChannel[Event]]:
    send, receive = trio.open_memory_channel[Event](math.inf)
    sink = ChannelSink(send) if interrupt_on is None else InterruptOn(send, policy, interrupt_on)
    with trio.fail_after(SAFETY):
        outcome = await run_adapter(
            command or FAKE_ADAPTER,
            spec_of(task),
            SESSION,
            sink,
            policy=policy,
            max_event_bytes=1 << 20,
        )
    return outcome, receive


async def test_interrupt_keeps_reading_what_the_adapter_prints_on_sigint() -> None:
    code = (
        "import json, signal, sys, time\n"
        "def bye(*_):\n"
        "    end = {'v': 1, 'type': 'session.ended', 'data': {'reason': 'cancelled'}}\n"
        "    print(json.dumps(end))\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGINT, bye)\n"
        "sys.stdin.read()\n"
        "print(json.dumps({'v': 1, 'type': 'session.started', 'data': {}}), flush=True)\n"
        "time.sleep(60)\n"
    )
    policy = ProcessHandle(grace=5.0)
    outcome, receive = await _run_with_policy(
        "x", policy, command=python_command(code), interrupt_on="session.started"
    )
    events = drain(receive)
    assert [e.type for e in events] == ["session.started", "session.ended"]
    assert outcome.end_reason == "cancelled"
    assert outcome.stopped_by_server and outcome.error is None


async def test_interrupt_of_an_adapter_ignoring_sigint_kills_it_after_the_grace() -> None:
    policy = ProcessHandle(grace=0.3)
    text = script({"ignore_sigint": True}, {"event": "message", "data": {}}, {"hang": True})
    outcome, receive = await _run_with_policy(text, policy, interrupt_on="message")
    assert outcome.exit_code == -signal.SIGKILL
    assert outcome.stopped_by_server and outcome.error is None
    assert not errors(drain(receive)), "a requested stop is not reported as a crash"


async def test_interrupt_before_the_adapter_starts_applies_at_once() -> None:
    policy = ProcessHandle(grace=0.0)
    policy.interrupt()
    outcome, _ = await _run_with_policy(script({"hang": True}), policy)
    assert outcome.stopped_by_server and outcome.pid is not None
    assert not pid_alive(outcome.pid)
