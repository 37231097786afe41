"""The fork server: turns forked from an imported adapter, as exec'd ones are run.

Real processes throughout: the fork server program, its children (children
of this test process, ``CLONE_PARENT``), the echo adapter and a module
adapter of the tests (``tests/fixtures/adapters/forked_adapter.py``, on
``PYTHONPATH``: it imports nothing of the tests, so it loads at once).
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.helpers import FIXTURES, pid_alive, typed_spec, wait_gone
from trioserve.runtime._forker import ForkServer, ForkServerError, ForkTarget, fork_target
from trioserve.runtime._handle import ProcessHandle
from trioserve.runtime._process import AdapterOutcome, ChannelSink, Started, run_adapter
from trioserve.runtime._wire import Event
from trioserve.spec import echo_command

SESSION = "s_fork"
SAFETY = 30  # seconds: a hung test fails instead of hanging the suite
ADAPTERS = FIXTURES / "adapters"
MODULE = ForkTarget("forked_adapter:main", argv=("--flag",))
#: The same module adapter, exec'd.
MODULE_COMMAND = [
    sys.executable,
    "-c",
    "import sys; from forked_adapter import main; sys.exit(main())",
    "--flag",
]


class Guard:
    """A process guard that records what it was told."""

    def __init__(self) -> None:
        self.live: set[int] = set()
        self.seen: list[int] = []

    def add(self, pid: int) -> None:
        self.live.add(pid)
        self.seen.append(pid)

    def remove(self, pid: int) -> None:
        self.live.discard(pid)


@pytest.fixture
async def module_server(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[ForkServer]:
    monkeypatch.setenv("PYTHONPATH", str(ADAPTERS))  # where the fork server finds the module
    server = ForkServer(MODULE, guard=Guard())
    scope = await serving(nursery, server)
    yield server
    scope.cancel()


async def serving(nursery: trio.Nursery, server: ForkServer) -> trio.CancelScope:
    """``server`` started (ready) in ``nursery``; cancel the scope to stop it."""
    scope = trio.CancelScope()

    async def run(task_status: trio.TaskStatus[None]) -> None:
        with scope:
            await server.run(task_status=task_status)

    await nursery.start(run)
    return scope


async def turn(
    task: str,
    *,
    command: list[str] | None = None,
    forker: ForkServer | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    stop_after_start: bool = False,
) -> tuple[AdapterOutcome, list[Event]]:
    """One turn, exec'd (``command``) or forked (``forker``); its outcome and events."""
    send, receive = trio.open_memory_channel[Event](math.inf)
    policy = ProcessHandle(grace=5.0)
    started = None
    guard = None
    if forker is not None:
        guard = forker._guard
        proc = await forker.spawn(env, cwd)
        assert proc is not None, "the fork server is not up"
        started = Started(proc)
    events: list[Event] = []
    with trio.fail_after(SAFETY):
        async with trio.open_nursery() as nursery:
            if stop_after_start:

                async def stop() -> None:
                    event = await receive.receive()
                    events.append(event)
                    assert event.type == "session.started"
                    policy.interrupt()

                nursery.start_soon(stop)
            outcome = await run_adapter(
                command or ["unused"],
                typed_spec().with_turn(task, SESSION),
                SESSION,
                ChannelSink(send),
                policy=policy,
                max_event_bytes=1 << 20,
                env=env,
                cwd=cwd,
                started=started,
                guard=guard,
            )
    send.close()
    events += [event async for event in receive]
    return outcome, events


def wire_form(events: list[Event]) -> list[dict[str, Any]]:
    """The events as they would be stored, without what differs between two runs."""
    found = []
    for event in events:
        record = event.json()
        record.pop("ts", None)
        data = dict(record.get("data") or {})
        data.pop("pid", None)
        found.append({**record, "data": data})
    return found


async def test_forked_echo_streams_as_the_exec_d_one(
    nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = fork_target(echo_command())
    assert target is not None
    server = ForkServer(target)
    await nursery.start(server.run)
    runs = []
    for path in ("exec", "fork"):  # two sessions' first turns: the echo keeps state per session
        monkeypatch.setenv("TRIOSERVE_ECHO_STATE_DIR", str(tmp_path / path))
        if path == "exec":
            outcome, events = await turn("hello there", command=echo_command())
        else:
            outcome, events = await turn("hello there", forker=server)
        assert outcome.exit_code == 0 and outcome.error is None, outcome
        runs.append(wire_form(events))
    assert runs[0] == runs[1]
    assert [e["type"] for e in runs[1]] == ["session.started", "message", "session.ended"]
    assert server.stats.forks == 1


async def test_no_trace_of_one_turn_in_the_next(module_server: ForkServer, tmp_path: Path) -> None:
    reports = []
    for mark in ("one", "two"):
        outcome, events = await turn(
            "report", forker=module_server, env={**os.environ, "FORKED_MARK": mark}, cwd=tmp_path
        )
        assert outcome.exit_code == 0 and outcome.error is None, outcome
        (message,) = [e for e in events if e.type == "message"]
        reports.append(message.json()["data"]["report"])
    for mark, report in zip(("one", "two"), reports, strict=True):
        assert report["turns"] == 1  # the module global is the fork server's, fresh
        assert report["fds"] == []  # its three pipes, nothing else
        assert report["mark"] == mark and report["cwd"] == str(tmp_path)
        assert report["ppid"] == os.getpid()  # our own child: we reap it
        assert report["pgid"] == report["pid"] == report["sid"]  # its own session and group
        assert report["sigint"] and report["sigterm"]
        assert report["argv"] == ["--flag"]
        assert not pid_alive(report["pid"])  # reaped
    assert reports[0]["random"] != reports[1]["random"]  # re-seeded, not seed(42)'s
    import random

    assert reports[1]["random"] != random.Random(42).random()


async def test_an_exec_d_turn_of_the_module_reports_the_same(tmp_path: Path) -> None:
    """The module adapter exec'd: the baseline the forked one is held to."""
    env = {**os.environ, "FORKED_MARK": "x", "PYTHONPATH": str(ADAPTERS)}
    outcome, events = await turn("report", command=MODULE_COMMAND, env=env, cwd=tmp_path)
    assert outcome.exit_code == 0, outcome
    (message,) = [e for e in events if e.type == "message"]
    report = message.json()["data"]["report"]
    assert report["fds"] == [] and report["turns"] == 1 and report["sigint"]


async def test_the_environment_is_the_turn_s_whole(
    module_server: ForkServer, tmp_path: Path
) -> None:
    """A child's environment is the turn's, exactly as an exec'd adapter's is: variables
    the fork server was started with and the turn has not are gone, new ones are there."""
    env = {key: value for key, value in os.environ.items() if key != "HOME"}
    env |= {"FORKED_MARK": "z", "PYTHONPATH": str(ADAPTERS)}
    assert "HOME" in os.environ  # the fork server has it
    reports = []
    for forker, command in ((module_server, None), (None, MODULE_COMMAND)):
        _, events = await turn("report", command=command, forker=forker, env=env, cwd=tmp_path)
        (message,) = [e for e in events if e.type == "message"]
        reports.append(message.json()["data"]["report"]["env"])
    forked, exec_d = reports
    assert forked == exec_d == env


async def test_every_signal_handler_is_as_in_an_exec_d_turn(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A child puts back what the fork server changed (SIGINT, SIGTERM) and keeps what a
    new process inherits: a signal ignored where trioserve was started stays ignored."""
    monkeypatch.setenv("PYTHONPATH", str(ADAPTERS))
    env = {**os.environ, "PYTHONPATH": str(ADAPTERS)}
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:
        server = ForkServer(MODULE, guard=Guard())
        scope = await serving(nursery, server)
        reports = []
        for forker, command in ((server, None), (None, MODULE_COMMAND)):
            _, events = await turn("report", command=command, forker=forker, env=env, cwd=tmp_path)
            (message,) = [e for e in events if e.type == "message"]
            reports.append(message.json()["data"]["report"]["handlers"])
        scope.cancel()
    finally:
        signal.signal(signal.SIGHUP, previous)
    forked, exec_d = reports
    assert forked == exec_d
    ignored, default = str(signal.SIG_IGN), str(signal.SIG_DFL)
    assert forked[str(signal.SIGHUP.value)] == ignored
    assert forked[str(signal.SIGTERM.value)] == default
    assert forked[str(signal.SIGINT.value)] == "default_int_handler"


@pytest.mark.parametrize("task", ["kill", "fail"])
async def test_a_crash_reads_as_the_exec_d_one(
    module_server: ForkServer, tmp_path: Path, task: str
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ADAPTERS)}
    exec_d, exec_events = await turn(task, command=MODULE_COMMAND, env=env, cwd=tmp_path)
    forked, fork_events = await turn(task, forker=module_server, env=env, cwd=tmp_path)
    assert forked.exit_code == exec_d.exit_code == (-9 if task == "kill" else 3)
    assert forked.error == exec_d.error and forked.error is not None
    assert forked.error_reason == "adapter_exit"
    assert wire_form(fork_events) == wire_form(exec_events)


async def test_a_stopped_turn_leaves_no_process(module_server: ForkServer) -> None:
    outcome, _ = await turn("wait", forker=module_server, stop_after_start=True)
    assert outcome.stopped_by_server
    assert outcome.exit_code == -signal.SIGINT  # died of SIGINT, as a Python program does
    assert outcome.pid is not None and not pid_alive(outcome.pid)
    guard = module_server._guard
    assert isinstance(guard, Guard) and guard.live == {module_server.pid}  # the fork server's
    assert outcome.pid in guard.seen


async def test_a_cancelled_turn_leaves_no_process(module_server: ForkServer) -> None:
    proc = await module_server.spawn(None)
    assert proc is not None
    send, receive = trio.open_memory_channel[Event](math.inf)
    with trio.move_on_after(SAFETY) as safety:
        async with trio.open_nursery() as nursery:

            async def run() -> None:
                await run_adapter(
                    ["unused"],
                    typed_spec().with_turn("wait", SESSION),
                    SESSION,
                    ChannelSink(send),
                    policy=ProcessHandle(grace=5.0),
                    max_event_bytes=1 << 20,
                    started=Started(proc),
                )

            nursery.start_soon(run)
            assert (await receive.receive()).type == "session.started"
            nursery.cancel_scope.cancel()  # the turn's nursery is cancelled
    assert not safety.cancelled_caught
    assert proc.returncode == -signal.SIGINT and not pid_alive(proc.pid)


async def test_a_module_that_does_not_import_fails_the_start(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ADAPTERS))
    server = ForkServer(ForkTarget("no_such_adapter:main"))
    with pytest.raises(ForkServerError, match=r"cannot import no_such_adapter: ModuleNotFound"):
        await nursery.start(server.run)
    assert server.stats.state == "stopped"


async def test_a_killed_fork_server_is_started_again(module_server: ForkServer) -> None:
    running = await module_server.spawn(None)  # a turn's process, forked before the kill
    assert running is not None
    first = module_server.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    with trio.fail_after(SAFETY):  # until the watcher has seen it go
        while module_server.stats.restarts == 0:
            await trio.sleep(0.01)
    if module_server.pid is None:  # down: a turn racing the restart execs its adapter
        fallbacks = module_server.stats.fallbacks
        if await module_server.spawn(None) is None:
            assert module_server.stats.fallbacks == fallbacks + 1
    with trio.fail_after(SAFETY):
        while module_server.stats.state != "ready":
            await trio.sleep(0.01)
    assert module_server.pid not in (None, first)
    await wait_gone(first)
    # The process forked before the kill is ours, not the fork server's: it runs on.
    assert pid_alive(running.pid)
    assert running.stdin is not None
    await running.stdin.send_all(json.dumps({"sessionId": SESSION, "task": "report"}).encode())
    await running.stdin.aclose()
    with trio.fail_after(SAFETY):
        assert await running.wait() == 0
    outcome, _ = await turn("report", forker=module_server)
    assert outcome.exit_code == 0 and outcome.error is None
