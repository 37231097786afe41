"""Turns end to end: what the adapter gets, crashes, bad lines, disconnects."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from conftest import Server, ServerFactory, compiled_spec, pid_alive, script, wait_gone


async def test_adapter_receives_compiled_spec(start_server: ServerFactory, tmp_path: Path) -> None:
    server = await start_server()
    session = await server.create()
    record = tmp_path / "spec.json"
    frames = await server.turn(session["id"], script({"record": str(record)}, {"end": "completed"}))
    assert frames[-1].event == "session.ended"
    received = json.loads(record.read_text())
    expected = compiled_spec()
    expected["task"] = script({"record": str(record)}, {"end": "completed"})
    expected["sessionId"] = session["id"]
    assert received == expected


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


async def test_oversized_line_stops_the_adapter(start_server: ServerFactory) -> None:
    server = await start_server(max_event_bytes=64 * 1024)
    session = await server.create()
    frames = await server.turn(
        session["id"], script({"big": 100_000}, {"event": "message"}, {"sleep": 30})
    )
    assert [f.event for f in frames] == ["session.started", "error"]
    assert "longer than 65536 bytes" in frames[1].data["data"]["message"]
    await wait_gone(frames[0].data["data"]["pid"], 1)
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
    server = await start_server()
    session = await server.create()
    pid = await _stream_until_started(server, session["id"], script({"sleep": 60}))
    await wait_gone(pid, 1)
    with trio.fail_after(5):
        while server.manager.turns_in_flight:
            await trio.sleep(0.01)
    frames = await server.turn(session["id"], "next")
    assert frames[-1].data["data"]["reason"] == "completed"


async def test_adapter_ignoring_sigint_is_killed(start_server: ServerFactory) -> None:
    server = await start_server(adapter_stop_grace=0.5)
    session = await server.create()
    text = script(
        {"ignore_sigint": True}, {"event": "message", "data": {"ready": 1}}, {"hang": True}
    )
    pid = await _stream_until_started(server, session["id"], text, marker='"ready"')
    await trio.sleep(0.2)
    assert pid_alive(pid), "SIGINT is ignored, so the adapter lives through the grace"
    await wait_gone(pid, 3)


async def test_adapter_grandchildren_are_stopped(start_server: ServerFactory) -> None:
    server = await start_server()
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
    await wait_gone(child, 2)


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


async def test_long_quiet_turn_is_not_killed(start_server: ServerFactory) -> None:
    """A turn outlives trio's idle worker threads (10 s): nothing is tied to them."""
    server = await start_server()
    session = await server.create()
    frames = await server.turn(session["id"], script({"sleep": 12}, {"end": "completed"}))
    assert [f.event for f in frames] == ["session.started", "session.ended"]


async def test_stream_outlives_quarts_default_response_timeout(start_server: ServerFactory) -> None:
    """Quart cuts a response at 60 s unless told otherwise; turn streams have no limit."""
    server = await start_server()
    session = await server.create()
    steps = script(
        {"sleep": 62}, {"event": "message", "data": {"late": True}}, {"end": "completed"}
    )
    frames = await server.turn(session["id"], steps)
    assert [f.event for f in frames] == ["session.started", "message", "session.ended"]
    assert frames[1].data["data"] == {"late": True}
