"""Turns end to end: what the adapter gets, crashes, bad lines, disconnects."""

from __future__ import annotations

import json
import logging
import re
import shlex
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from tests.helpers import (
    FAKE_ADAPTER,
    Server,
    ServerFactory,
    compiled_spec,
    parse_sse,
    pid_alive,
    script,
    start_cli_server,
    wait_gone,
    write_spec,
)


async def test_adapter_receives_compiled_spec(start_server: ServerFactory, tmp_path: Path) -> None:
    server = await start_server()
    session = await server.create()
    record = tmp_path / "spec.json"
    frames = await server.turn(session["id"], script({"record": str(record)}, {"end": "completed"}))
    assert frames[-1].event == "session.ended"
    expected = compiled_spec()
    expected["task"] = script({"record": str(record)}, {"end": "completed"})
    expected["sessionId"] = session["id"]
    # Byte for byte: compact JSON, camelCase keys in the compiler's order, ASCII only.
    assert record.read_bytes() == json.dumps(expected, separators=(",", ":")).encode()


async def test_crash_mid_stream_yields_one_error(start_server: ServerFactory) -> None:
    server = await start_server()
    session = await server.create()
    steps = script(
        {"event": "message", "data": {"n": 1}}, {"stderr": "Traceback: boom\n"}, {"exit": 7}
    )
    frames = await server.turn(session["id"], steps)
    assert [f.event for f in frames] == ["session.started", "message", "error"]
    message = frames[-1].data["data"]["message"]
    assert "exited with status 7" in message and "Traceback: boom" in message
    assert frames[-1].data["sessionId"] == session["id"]
    # The session takes the next turn.
    frames = await server.turn(session["id"], "again")
    assert frames[-1].data["data"]["reason"] == "completed"


async def test_clean_exit_without_session_ended(start_server: ServerFactory) -> None:
    server = await start_server()
    session = await server.create()
    frames = await server.turn(session["id"], script({"exit": 0}))
    assert [f.event for f in frames] == ["session.started", "error"]
    assert "exited with status 0 before session.ended" in frames[-1].data["data"]["message"]


async def test_garbage_line_is_reported_and_reading_continues(start_server: ServerFactory) -> None:
    server = await start_server()
    session = await server.create()
    steps = script(
        {"raw": "this is not json"},
        {"raw": '{"v":2,"type":"message","data":{}}'},
        {"event": "message", "data": {"after": True}},
        {"end": "completed"},
    )
    frames = await server.turn(session["id"], steps)
    assert [f.event for f in frames] == [
        "session.started",
        "error",
        "error",
        "message",
        "session.ended",
    ]
    assert "not JSON" in frames[1].data["data"]["message"]
    assert "this is not json" in frames[1].data["data"]["message"]
    assert "v=2" in frames[2].data["data"]["message"]
    assert frames[3].data["data"] == {"after": True}


async def test_an_event_nested_too_deep_is_reported_and_reading_continues(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    session = await server.create()
    deep = '{"v":1,"type":"tool.result","data":{"x":' + "[" * 100_000 + "]" * 100_000 + "}}"
    steps = script(
        {"raw": deep}, {"event": "message", "data": {"after": True}}, {"end": "completed"}
    )
    frames = await server.turn(session["id"], steps)
    assert [f.event for f in frames] == ["session.started", "error", "message", "session.ended"]
    assert "not JSON (nested too deep)" in frames[1].data["data"]["message"]
    assert frames[-1].data["data"]["reason"] == "completed"


async def test_oversized_line_stops_the_adapter(start_server: ServerFactory) -> None:
    server = await start_server(max_event_bytes=64 * 1024, processes=True)
    session = await server.create()
    frames = await server.turn(
        session["id"], script({"big": 100_000}, {"event": "message"}, {"sleep": 30})
    )
    assert [f.event for f in frames] == ["session.started", "error"]
    assert "longer than 65536 bytes" in frames[1].data["data"]["message"]
    await wait_gone(frames[0].data["data"]["pid"])
    # A line just under the limit passes whole.
    frames = await server.turn(session["id"], script({"big": 60_000}, {"end": "completed"}))
    assert len(frames[1].data["data"]["content"]) == 60_000


async def _stream_until_started(
    server: Server, session_id: str, text: str, marker: str = "session.started"
) -> int:
    """Start a turn, read up to the frame holding ``marker``, then drop the connection.

    Returns the adapter's pid (from ``session.started``).
    """
    url = f"/v1/sessions/{session_id}/turns"
    pid = None
    async with server.client.stream("POST", url, json={"input": text}) as resp:
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                pid = pid or int(json.loads(line[6:])["data"]["pid"])
                if marker in line:
                    return pid
    raise AssertionError(f"stream ended before {marker}")


async def test_client_disconnect_stops_adapter(start_server: ServerFactory) -> None:
    server = await start_server(processes=True)
    session = await server.create()
    pid = await _stream_until_started(server, session["id"], script({"sleep": 60}))
    await wait_gone(pid)
    with trio.fail_after(5):
        while server.manager.turns_in_flight:
            await trio.sleep(0.01)
    frames = await server.turn(session["id"], "next")
    assert frames[-1].data["data"]["reason"] == "completed"


async def test_adapter_ignoring_sigint_is_killed(
    start_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trioserve.adapter")
    server = await start_server(adapter_stop_grace=0.5, processes=True)
    session = await server.create()
    text = script(
        {"ignore_sigint": True}, {"event": "message", "data": {"ready": 1}}, {"hang": True}
    )
    pid = await _stream_until_started(server, session["id"], text, marker='"ready"')
    await trio.sleep(0.2)
    assert pid_alive(pid), "SIGINT is ignored, so the adapter lives through the grace"
    await wait_gone(pid)
    # Not a forced stop: the adapter did have its grace, and the log says it ignored SIGINT.
    warnings = [r for r in caplog.records if r.name == "trioserve.adapter"]
    assert [(r.levelno, r.getMessage()) for r in warnings] == [
        (logging.WARNING, f"adapter pid {pid} ignored SIGINT; sending SIGKILL")
    ]


async def test_adapter_grandchildren_are_stopped(start_server: ServerFactory) -> None:
    server = await start_server(processes=True)
    session = await server.create()
    url = f"/v1/sessions/{session['id']}/turns"
    body = {"input": script({"child": True}, {"sleep": 60})}
    child = None
    async with server.client.stream("POST", url, json=body) as resp:
        async for line in resp.aiter_lines():
            if line.startswith("data: ") and "childPid" in line:
                child = int(json.loads(line[6:])["data"]["childPid"])
                break
    assert child is not None
    await wait_gone(child)


async def test_session_ended_reasons_pass_through(start_server: ServerFactory) -> None:
    server = await start_server()
    session = await server.create()
    frames = await server.turn(
        session["id"], script({"event": "error", "data": {"message": "m"}}, {"end": "error"})
    )
    assert [f.event for f in frames] == ["session.started", "error", "session.ended"]
    assert frames[-1].data["data"]["reason"] == "error"
    assert frames[1].data["data"] == {"message": "m"}


async def test_many_events_arrive_in_order(start_server: ServerFactory) -> None:
    server = await start_server()
    session = await server.create()
    frames = await server.turn(session["id"], script({"many": 5000}, {"end": "completed"}))
    assert len(frames) == 5002
    assert [f.data["data"]["i"] for f in frames[1:-1]] == list(range(5000))


async def test_long_quiet_turn_is_not_killed(
    start_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn outlives the worker thread that spawned its adapter: nothing is tied to it.

    Trio forks adapters from a worker thread, which exits once it has been
    idle for ``IDLE_TIMEOUT`` (10 s; ``PR_SET_PDEATHSIG``, tied to that
    thread, once SIGKILLed adapters then).  Cut to 0.2 s here, so an adapter
    quiet for 1.5 s outlives its thread.
    """
    monkeypatch.setattr("trio._core._thread_cache.IDLE_TIMEOUT", 0.2)
    server = await start_server(processes=True)
    session = await server.create()
    frames = await server.turn(session["id"], script({"sleep": 1.5}, {"end": "completed"}))
    assert [f.event for f in frames] == ["session.started", "session.ended"]


async def test_stream_outlives_quarts_default_response_timeout(
    start_server: ServerFactory, autojump_clock: trio.testing.MockClock
) -> None:
    """Quart cuts a response at 60 s unless told otherwise; turn streams have no limit.

    The adapter is played in-process and the test runs on Trio's autojump
    clock: the adapter's 62 s of quiet pass in virtual time, and so would
    Quart's timeout, which runs on the same clock.
    """
    server = await start_server()
    session = await server.create()
    steps = script(
        {"sleep": 62}, {"event": "message", "data": {"late": True}}, {"end": "completed"}
    )
    frames = await server.turn(session["id"], steps)
    assert [f.event for f in frames] == ["session.started", "message", "session.ended"]
    assert frames[1].data["data"] == {"late": True}
    assert trio.current_time() >= 62


#: An adapter that prints a secret on stderr (not in the turn's input) and a turn that crashes it.
LEAKY_ADAPTER = [*FAKE_ADAPTER, "--startup-stderr", "fatal: bad key sk-live-1234\nat line 3\n"]
CRASH = script({"exit": 3})


async def test_adapter_stderr_log_keeps_the_tail_out_of_the_stream(
    start_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trioserve.manager")
    server = await start_server(command=LEAKY_ADAPTER, adapter_stderr="log")
    session = await server.create()
    frames = await server.turn(session["id"], CRASH)
    assert [f.event for f in frames] == ["session.started", "error"]
    error = frames[-1].data["data"]
    assert error == {
        "message": "adapter exited with status 3 before session.ended;"
        " its stderr is in the server log",
        "exitCode": 3,
    }
    # Not in the stream, not in the stored log, not in the turn record.
    replay = await server.client.get(
        f"/v1/sessions/{session['id']}/events", params={"format": "json"}
    )
    turns = await server.client.get(f"/v1/sessions/{session['id']}/turns")
    for text in (json.dumps([f.data for f in frames]), replay.text, turns.text):
        assert "sk-live" not in text
    assert turns.json()[0]["reason"] == "adapter_exit"
    [warning] = [r for r in caplog.records if r.name == "trioserve.manager"]
    assert warning.levelno == logging.WARNING
    turn_id = turns.json()[0]["id"]
    assert warning.getMessage() == (
        f"turn {turn_id} of session {session['id']}: adapter exited with status 3 before"
        " session.ended; stderr: fatal: bad key sk-live-1234\nat line 3"
    )
    # A turn that ends well logs nothing.
    frames = await server.turn(session["id"], "fine")
    assert frames[-1].data["data"]["reason"] == "completed"
    assert len([r for r in caplog.records if r.name == "trioserve.manager"]) == 1


async def test_adapter_stderr_log_with_nothing_on_stderr(
    start_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trioserve.manager")
    server = await start_server(adapter_stderr="log")
    session = await server.create()
    frames = await server.turn(session["id"], script({"exit": 4}))
    message = frames[-1].data["data"]["message"]
    assert message == "adapter exited with status 4 before session.ended (no stderr output)"
    [warning] = [r for r in caplog.records if r.name == "trioserve.manager"]
    assert warning.getMessage().endswith("status 4 before session.ended; stderr: (none)")


async def test_adapter_stderr_client_is_the_default(
    start_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trioserve.manager")
    server = await start_server(command=LEAKY_ADAPTER)
    session = await server.create()
    frames = await server.turn(session["id"], CRASH)
    assert frames[-1].data["data"]["message"] == (
        "adapter exited with status 3 before session.ended;"
        " stderr: fatal: bad key sk-live-1234\nat line 3"
    )
    assert not [r for r in caplog.records if r.name == "trioserve.manager"]


async def test_adapter_stderr_log_from_the_command_line(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path)
    command = ["--runtime-command", shlex.join(LEAKY_ADAPTER)]
    server = await start_cli_server(
        nursery, tmp_path, spec, "--in-memory", *command, "--adapter-stderr", "log"
    )
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        session = (await client.post("/v1/sessions", json={})).json()
        resp = await client.post(f"/v1/sessions/{session['id']}/turns", json={"input": CRASH})
    frames = parse_sse(resp.text)
    assert frames[-1].data["data"]["message"].endswith("; its stderr is in the server log")
    assert "sk-live" not in resp.text
    server.signal()
    assert await server.wait() == 0
    assert "stderr: fatal: bad key sk-live-1234" in server.log


def turn_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, str]]:
    """The ``turn ended key=value ...`` lines logged so far, as dicts."""
    found = []
    for record in caplog.records:
        if record.name == "trioserve.turns" and record.getMessage().startswith("turn ended "):
            assert record.levelno == logging.INFO
            pairs = record.getMessage().removeprefix("turn ended ").split(" ")
            found.append(dict(pair.split("=", 1) for pair in pairs))
    return found


async def test_one_log_line_per_finished_turn(
    start_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trioserve.turns")
    keys = ["session", "turn", "status", "reason", "duration_ms", "events", "exit", "adapter"]
    keys.append("protocol")  # the face that started the turn
    server = await start_server(warm_adapters=1)
    assert server.manager.pool is not None
    await server.manager.pool.wait_ready()
    sid = (await server.create())["id"]
    resp = await server.client.post(f"/v1/sessions/{sid}/turns", json={"input": "hi"})
    completed = turn_lines(caplog)
    assert len(completed) == 1 and list(completed[0]) == keys
    assert completed[0]["session"] == sid
    assert completed[0]["turn"] == resp.headers["trioserve-turn-id"]
    assert re.fullmatch(r"\d+", completed[0]["duration_ms"])
    assert {k: completed[0][k] for k in ("status", "reason", "events", "exit", "adapter")} == {
        "status": "completed",
        "reason": "completed",
        "events": str(len(parse_sse(resp.text))),
        "exit": "0",
        "adapter": "warm",
    }
    assert completed[0]["protocol"] == "api"

    cold = await start_server(warm_adapters=0)
    sid = (await cold.create())["id"]
    crash = script({"event": "message", "data": {"x": 1}}, {"stderr": "boom"}, {"exit": 3})
    frames = await cold.turn(sid, crash)
    crashed = turn_lines(caplog)[1]
    assert {k: crashed[k] for k in ("session", "status", "reason", "events", "exit")} == {
        "session": sid,
        "status": "failed",
        "reason": "adapter_exit",
        "events": str(len(frames)),
        "exit": "3",
    }
    assert crashed["adapter"] == "cold"

    hang = script({"event": "message", "data": {"ready": 1}}, {"hang": True})
    url = f"/v1/sessions/{sid}/turns"
    async with cold.client.stream("POST", url, json={"input": hang}) as stream:
        lines = stream.aiter_lines()
        async for line in lines:
            if '"ready"' in line:
                break
        assert (await cold.client.delete(f"{url}/current")).status_code == 202
        rest = "\n".join([line async for line in lines])
    assert len(turn_lines(caplog)) == 3
    cancelled = turn_lines(caplog)[2]
    assert {k: cancelled[k] for k in ("status", "reason", "events", "exit", "adapter")} == {
        "status": "cancelled",
        "reason": "cancelled",
        "events": "3",  # session.started, the message, the server's session.ended
        "exit": "SIGINT",  # the adapter died of the SIGINT the cancel sent it
        "adapter": "cold",
    }
    assert rest.count("event: session.ended") == 1
