"""The scripted launcher plays a turn as the fake adapter's process does: the same
events and the same outcome for the same script, through ``run_adapter`` and
through ``ScriptedLauncher`` side by side (so in-process tests test what a process
would do)."""

from __future__ import annotations

import math
import signal
from typing import Any

import pytest
import trio

from tests.helpers import FAKE_ADAPTER, ScriptedLauncher, script, typed_spec
from tests.helpers.sinks import InterruptOn
from trioserve.runtime._handle import ProcessHandle
from trioserve.runtime._launcher import AdapterLauncher
from trioserve.runtime._lifecycle import TurnState
from trioserve.runtime._process import AdapterOutcome, ChannelSink, run_adapter
from trioserve.runtime._wire import Event

SESSION = "s_scripted"

SCRIPTS = {
    "plain reply": "hello",
    "events then end": script(
        {"event": "message", "data": {"n": 1}}, {"many": 50}, {"end": "completed"}
    ),
    "crash with stderr": script({"event": "message"}, {"stderr": "boom\n"}, {"exit": 7}),
    "exit 0 without end": script({"event": "message"}),
    "undecodable and blank lines": script({"raw": "not json"}, {"raw": ""}, {"end": "done"}),
    # The adapter ignores SIGINT and waits after its oversized line, so the real
    # process is always the one the server stops (SIGKILL after the grace): one that
    # ends by itself races the server's SIGINT (exit 0 or -2, by the scheduler).
    "oversized line": script(
        {"ignore_sigint": True}, {"event": "message"}, {"big": 4096}, {"hang": True}
    ),
    "lines after the end": script({"end": "completed"}, {"event": "message"}),
    "ticks": script({"tick": 5, "every": 0.01}, {"end": "completed"}),
}


async def play(
    launcher: AdapterLauncher,
    task: str,
    *,
    stderr_to_client: bool = True,
    stop_on: str | None = None,
    grace: float = 0.5,
) -> tuple[AdapterOutcome, list[Event]]:
    """One turn through ``launcher``; with ``stop_on``, interrupted once it prints that event
    (then killed if it still runs ``grace`` seconds later)."""
    send, receive = trio.open_memory_channel[Event](math.inf)
    policy = ProcessHandle(grace=grace)
    state = TurnState(SESSION, stderr_to_client=stderr_to_client)
    sink = ChannelSink(send) if stop_on is None else InterruptOn(send, policy, stop_on)
    with trio.fail_after(20):
        outcome = await launcher(
            FAKE_ADAPTER,
            typed_spec().with_turn(task, SESSION),
            SESSION,
            sink,
            policy=policy,
            max_event_bytes=1024,
            state=state,
        )
    send.close()
    return outcome, [event async for event in receive]


def comparable(outcome: AdapterOutcome, events: list[Event]) -> dict[str, Any]:
    """What a test can see of a run, but the pids (a scripted one is not a process's)."""
    shown = [
        (e.type, {k: v for k, v in e.data.items() if k not in ("pid", "ppid")}) for e in events
    ]
    return {
        "events": shown,
        "exit": outcome.exit_code,
        "end": outcome.end_reason,
        "error": (outcome.error, outcome.error_reason),
        "stopped": outcome.stopped_by_server,
        "stderr": outcome.stderr_tail,
        "count": outcome.events,
    }


@pytest.mark.parametrize("name", list(SCRIPTS))
async def test_a_script_plays_as_the_process_does(name: str) -> None:
    real = comparable(*await play(run_adapter, SCRIPTS[name]))
    scripted = comparable(*await play(ScriptedLauncher(), SCRIPTS[name]))
    assert scripted == real


async def test_stderr_kept_for_the_log_plays_as_the_process_does() -> None:
    crash = SCRIPTS["crash with stderr"]
    real = comparable(*await play(run_adapter, crash, stderr_to_client=False))
    assert comparable(*await play(ScriptedLauncher(), crash, stderr_to_client=False)) == real


@pytest.mark.parametrize(
    ("steps", "grace", "exit"),
    [
        # A grace long enough for a starved interpreter to unwind: it dies of the SIGINT.
        (({"event": "message"}, {"hang": True}), 10.0, -signal.SIGINT),
        (({"ignore_sigint": True}, {"event": "message"}, {"hang": True}), 0.5, -signal.SIGKILL),
    ],
    ids=["dies of SIGINT", "ignores SIGINT until SIGKILL"],
)
async def test_an_interrupt_plays_as_a_signal_does(
    steps: tuple[dict[str, Any], ...], grace: float, exit: int
) -> None:
    task = script(*steps)
    real = comparable(*await play(run_adapter, task, stop_on="message", grace=grace))
    scripted = comparable(*await play(ScriptedLauncher(), task, stop_on="message", grace=grace))
    # Python's KeyboardInterrupt traceback is the process's own (no one sees it: the
    # server stopped the adapter, so its stderr goes nowhere).
    del real["stderr"], scripted["stderr"]
    assert scripted == real
    assert real["stopped"] and real["exit"] == exit
