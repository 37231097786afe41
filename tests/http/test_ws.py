"""The WebSocket transport over real sockets: every message and close code."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import pytest
import trio
import wsproto
import wsproto.events
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    WebSocketConnection,
    open_websocket_url,
)

import trioserve.http._ws as ws_module
from tests.helpers import Server, ServerFactory, pid_alive, script, wait_gone
from tests.helpers.ws import connect, receive, send
from trioserve.errors import InvalidRequest, StoreError
from trioserve.http._ws import event_text, parse_message
from trioserve.protocol import WSCancel, WSResume, WSTurn
from trioserve.runtime import _wire as wire

HANG = script({"event": "message", "data": {"content": "working"}}, {"hang": True})


async def receive_turn(ws: WebSocketConnection) -> list[dict[str, Any]]:
    """The events of one turn, checked against the ``trioserve.turn.end`` that follows them."""
    messages = [await receive(ws)]
    while messages[-1]["type"] != "trioserve.turn.end":
        messages.append(await receive(ws))
    end = messages.pop()
    assert set(end) == {"type", "turnId", "status", "reason", "lastSeq"}, end
    assert end["turnId"].startswith("t_") and end["status"] != "running"
    assert end["lastSeq"] == messages[-1]["seq"]
    return messages


async def run_turn(ws: WebSocketConnection, text: str) -> list[dict[str, Any]]:
    await send(ws, {"type": "turn", "input": text})
    return await receive_turn(ws)


async def expect_error(ws: WebSocketConnection, code: int, reason: str, *needles: str) -> None:
    message = await receive(ws)
    assert message["type"] == "trioserve.error", message
    assert set(message) == {"type", "error"}
    error = message["error"]
    assert set(error) == {"code", "reason", "message"}
    assert (error["code"], error["reason"]) == (code, reason), error
    for needle in needles:
        assert needle in error["message"], error


async def expect_close(ws: WebSocketConnection, code: int) -> str | None:
    """The connection is closed with ``code`` and nothing else arrives first."""
    with trio.fail_after(10), pytest.raises(ConnectionClosed) as closed:
        message = await ws.get_message()
        pytest.fail(f"expected close {code}, got message {message!r}")
    assert closed.value.reason is not None
    assert closed.value.reason.code == code, closed.value.reason
    reason: str | None = closed.value.reason.reason
    return reason


async def expect_pong(ws: WebSocketConnection) -> None:
    await send(ws, {"type": "ping"})
    assert await receive(ws) == {"type": "trioserve.pong"}


async def start_hanging_turn(ws: WebSocketConnection) -> int:
    """Start a turn that runs until stopped; return its adapter's pid."""
    await send(ws, {"type": "turn", "input": HANG})
    started = await receive(ws)
    assert started["type"] == "session.started", started
    assert (await receive(ws))["data"] == {"content": "working"}
    pid: int = started["data"]["pid"]
    return pid


# -- turns ----------------------------------------------------------------------


async def test_turns_in_a_row_carry_the_sse_events(start_server: ServerFactory) -> None:
    server = await start_server()
    session = (await server.create())["id"]
    sse = await server.turn(session, "hello")
    async with connect(server, session) as ws:
        first = await run_turn(ws, "hello")
        assert [m["type"] for m in first] == ["session.started", "message", "session.ended"]
        # The same JSON objects the SSE data: lines carry (the pid aside),
        # numbered on from the SSE turn's events.
        assert [m["seq"] for m in first] == [4, 5, 6]
        assert [{**m, "seq": 0} for m in first[1:]] == [{**f.data, "seq": 0} for f in sse[1:]]
        assert first[0]["sessionId"] == session
        # Each next turn goes out the moment the last one's session.ended
        # arrived: the session is already free, never a 409.
        for n in range(3):
            turn = await run_turn(ws, f"again {n}")
            assert turn[1]["data"]["text"] == f"echo: again {n}"
            assert turn[-1]["data"]["reason"] == "completed"


async def test_turn_without_session_ended_ends_with_its_error(start_server: ServerFactory) -> None:
    server = await start_server()
    session = (await server.create())["id"]
    async with connect(server, session) as ws:
        await send(ws, {"type": "turn", "input": script({"exit": 3})})
        assert (await receive(ws))["type"] == "session.started"
        error = await receive(ws)
        assert error["type"] == "error"
        assert "exited with status 3" in error["data"]["message"]
        # Then the marker that says the turn is over, and how it ended.
        end = await receive(ws)
        assert end["type"] == "trioserve.turn.end"
        assert (end["status"], end["reason"], end["lastSeq"]) == ("failed", "adapter_exit", 2)
        # The error went out once the turn had finished: the session is free.
        turn = await run_turn(ws, "next")
        assert turn[-1]["data"]["reason"] == "completed"


async def test_empty_input_runs_the_session_task(start_server: ServerFactory) -> None:
    server = await start_server()
    session = (await server.create())["id"]
    async with connect(server, session) as ws:
        await send(ws, {"type": "turn"})
        turn = await receive_turn(ws)
        assert turn[1]["data"]["text"] == "echo: Say hello."


async def test_turn_while_running_is_409_and_the_connection_stays(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    session = (await server.create())["id"]
    async with connect(server, session) as ws:
        await start_hanging_turn(ws)
        await send(ws, {"type": "turn", "input": "second"})
        await expect_error(ws, 409, "session_busy", session)
        await expect_pong(ws)
        # A turn over HTTP is refused the same way.
        resp = await server.client.post(f"/v1/sessions/{session}/turns", json={"input": "x"})
        assert resp.status_code == 409
        await send(ws, {"type": "cancel"})
        ended = (await receive_turn(ws))[-1]
        assert ended["data"]["reason"] == "cancelled"
        assert (await run_turn(ws, "third"))[-1]["data"]["reason"] == "completed"


async def test_two_connections_race_for_one_session(start_server: ServerFactory) -> None:
    server = await start_server(processes=True)
    session = (await server.create())["id"]
    async with connect(server, session) as a, connect(server, session) as b:
        first: dict[WebSocketConnection, dict[str, Any]] = {}

        async def ask(ws: WebSocketConnection) -> None:
            await send(ws, {"type": "turn", "input": HANG})
            first[ws] = await receive(ws)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, a)
            nursery.start_soon(ask, b)
        kinds = sorted(m["type"] for m in first.values())
        assert kinds == ["session.started", "trioserve.error"], first
        winner, loser = (a, b) if first[a]["type"] == "session.started" else (b, a)
        assert first[loser]["error"]["code"] == 409
        assert first[loser]["error"]["reason"] == "session_busy"
        pid = first[winner]["data"]["pid"]
        # The loser may cancel the session's turn (cancel is per session).
        await send(loser, {"type": "cancel"})
        assert (await receive_turn(winner))[-1]["data"]["reason"] == "cancelled"
        assert not pid_alive(pid)
        assert (await run_turn(loser, "mine now"))[-1]["data"]["reason"] == "completed"


async def test_turn_cap_is_429(start_server: ServerFactory) -> None:
    server = await start_server(max_concurrent_turns=1)
    one = (await server.create())["id"]
    two = (await server.create())["id"]
    async with connect(server, one) as a, connect(server, two) as b:
        await start_hanging_turn(a)
        await send(b, {"type": "turn", "input": "x"})
        await expect_error(b, 429, "turn_cap", "max 1")
        await expect_pong(b)
        await send(a, {"type": "cancel"})
        await receive_turn(a)
        assert (await run_turn(b, "now"))[-1]["data"]["reason"] == "completed"


# -- messages ---------------------------------------------------------------------


BAD_MESSAGES: list[tuple[str | bytes, str]] = [
    ("not json", "malformed JSON"),
    ("[1]", "expected a JSON object, got an array"),
    ('"turn"', "expected a JSON object, got a string"),
    ('{"input": "x"}', "type: expected a string"),
    ('{"type": 7}', "type: expected a string"),
    ('{"type": "x"}', "unknown type 'x'"),
    ('{"type": "turn", "input": 3}', "input: expected a string, got a number"),
    ('{"type": "turn", "onDisconnect": "later"}', "onDisconnect: expected 'cancel' or"),
    ('{"type": "resume", "after": "3"}', "after: expected an integer, got a string"),
    (b'{"type": "ping"}', "text message"),
]


async def test_malformed_and_unknown_messages_are_400(start_server: ServerFactory) -> None:
    server = await start_server()
    session = (await server.create())["id"]
    async with connect(server, session) as ws:
        for message, needle in BAD_MESSAGES:
            await ws.send_message(message)
            await expect_error(ws, 400, "invalid_request", needle)
        await expect_pong(ws)
        # None of them started a turn, and the connection still takes one.
        await send(ws, {"type": "cancel"})
        await expect_error(ws, 404, "no_turn")
        assert (await run_turn(ws, "fine"))[-1]["data"]["reason"] == "completed"


async def test_unknown_fields_and_nulls_are_read_as_over_http(
    start_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """As the HTTP bodies: unknown fields ignored (logged at debug), null is the default."""
    caplog.set_level(logging.DEBUG, logger="trioserve.requests")
    server = await start_server()
    session = (await server.create())["id"]
    async with connect(server, session) as ws:
        await send(ws, {"type": "ping", "id": 7})
        assert await receive(ws) == {"type": "trioserve.pong"}
        await send(ws, {"type": "cancel", "force": True})
        await expect_error(ws, 404, "no_turn")
        await send(ws, {"type": "turn", "input": "x", "model": "big", "onDisconnect": None})
        events = await receive_turn(ws)
        assert events[1]["data"]["text"] == "echo: x"
        await send(ws, {"type": "turn", "input": None})
        events = await receive_turn(ws)
        assert events[1]["data"]["text"] == "echo: Say hello."  # the session's task
    ignored = [r.getMessage() for r in caplog.records if r.name == "trioserve.requests"]
    assert len(ignored) == 3 and all(r.levelno == logging.DEBUG for r in caplog.records), ignored
    assert "ping message: ignored unknown field(s) 'id'" in ignored[0]
    assert "'force'" in ignored[1] and "'model'" in ignored[2]


async def test_ping_pong(start_server: ServerFactory) -> None:
    server = await start_server()
    session = (await server.create())["id"]
    async with connect(server, session) as ws:
        await expect_pong(ws)
        await expect_pong(ws)


async def test_cancel_stops_the_adapter_and_the_next_turn_runs(
    start_server: ServerFactory,
) -> None:
    server = await start_server(processes=True)
    session = (await server.create())["id"]
    async with connect(server, session) as ws:
        pid = await start_hanging_turn(ws)
        assert pid_alive(pid)
        await send(ws, {"type": "cancel"})
        rest = await receive_turn(ws)
        assert [m["type"] for m in rest] == ["session.ended"]
        assert rest[0]["data"]["reason"] == "cancelled"
        # session.ended is sent once the turn has finished: the adapter is reaped.
        assert not pid_alive(pid)
        await send(ws, {"type": "cancel"})
        await expect_error(ws, 404, "no_turn")
        assert (await run_turn(ws, "next"))[-1]["data"]["reason"] == "completed"
    status = (await server.client.get(f"/v1/sessions/{session}")).json()["status"]
    assert status == "active"


async def test_cancel_with_nothing_running_is_404(start_server: ServerFactory) -> None:
    server = await start_server()
    session = (await server.create())["id"]
    async with connect(server, session) as ws:
        await send(ws, {"type": "cancel"})
        await expect_error(ws, 404, "no_turn", session)
        await run_turn(ws, "done")
        await send(ws, {"type": "cancel"})
        await expect_error(ws, 404, "no_turn")


# -- close codes ------------------------------------------------------------------


async def test_unknown_and_ended_sessions_close_4404(start_server: ServerFactory) -> None:
    server = await start_server()
    async with connect(server, "s_missing") as ws:
        assert "s_missing" in (await expect_close(ws, 4404) or "")
    session = (await server.create())["id"]
    assert (await server.client.delete(f"/v1/sessions/{session}")).status_code == 204
    async with connect(server, session) as ws:
        assert "ended" in (await expect_close(ws, 4404) or "")


async def test_session_ended_while_connected_closes_4404_on_next_turn(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    session = (await server.create())["id"]
    async with connect(server, session) as ws:
        await expect_pong(ws)
        assert (await server.client.delete(f"/v1/sessions/{session}")).status_code == 204
        await send(ws, {"type": "turn", "input": "x"})
        await expect_close(ws, 4404)


async def test_session_ended_during_a_turn(start_server: ServerFactory) -> None:
    server = await start_server(processes=True)
    session = (await server.create())["id"]
    async with connect(server, session) as ws:
        pid = await start_hanging_turn(ws)
        assert (await server.client.delete(f"/v1/sessions/{session}")).status_code == 204
        assert (await receive_turn(ws))[-1]["data"]["reason"] == "cancelled"
        assert not pid_alive(pid)


async def test_draining_closes_idle_1001_and_new_4503(start_server: ServerFactory) -> None:
    server = await start_server()
    session = (await server.create())["id"]
    async with connect(server, session) as idle:
        await expect_pong(idle)
        server.manager.start_draining()
        await expect_close(idle, 1001)
    async with connect(server, session) as ws:
        assert "draining" in (await expect_close(ws, 4503) or "")


async def test_message_over_1_mib_closes_1009(start_server: ServerFactory) -> None:
    server = await start_server(processes=True)
    session = (await server.create())["id"]
    # The connection must end (TCP closed by the server after the closing
    # handshake), not hang: hypercorn alone leaves it open (hypercorn_fixes).
    with trio.fail_after(20):
        async with connect(server, session) as ws:
            # Just under the limit is a turn like any other.
            fits = script({"stderr": "x" * (1024 * 1024 - 200)}, {"end": "completed"})
            message = json.dumps({"type": "turn", "input": fits})
            assert len(message) <= 1024 * 1024
            await ws.send_message(message)
            assert (await receive_turn(ws))[-1]["data"]["reason"] == "completed"
            pid = await start_hanging_turn(ws)
            with contextlib.suppress(ConnectionClosed):
                await ws.send_message(json.dumps({"type": "turn", "input": "x" * 2 * 1024 * 1024}))
            await expect_close(ws, 1009)
    # The handler learnt the socket is gone: the turn it was delivering stopped.
    await wait_gone(pid)
    assert (await server.client.get("/healthz")).status_code == 200
    async with connect(server, session) as ws:
        assert (await run_turn(ws, "after"))[-1]["data"]["reason"] == "completed"


async def test_client_disconnect_cancels_the_turn(start_server: ServerFactory) -> None:
    server = await start_server(processes=True)
    session = (await server.create())["id"]
    async with connect(server, session) as ws:
        pid = await start_hanging_turn(ws)
    await wait_gone(pid)
    # The session is free again at once.
    async with connect(server, session) as ws:
        assert (await run_turn(ws, "back"))[-1]["data"]["reason"] == "completed"


async def test_client_vanishing_cancels_the_turn(start_server: ServerFactory) -> None:
    server = await start_server(processes=True)
    session = (await server.create())["id"]
    async with raw_connect(server, session) as (stream, conn):
        await stream.send_all(conn.send(wsproto.events.TextMessage(json.dumps(turn(HANG)))))
        started = await next_message(stream, conn)
        assert started["type"] == "session.started"
    # The TCP connection is gone without a close frame.
    await wait_gone(started["data"]["pid"])


async def test_shutdown_gives_the_turn_its_grace_then_closes_1001(
    start_server: ServerFactory,
) -> None:
    server = await start_server(shutdown_grace=30)
    session = (await server.create())["id"]
    steps = script({"event": "message", "data": {}}, {"sleep": 0.3}, {"end": "completed"})
    async with connect(server, session) as ws:
        await send(ws, {"type": "turn", "input": steps})
        assert [(await receive(ws))["type"] for _ in range(2)] == ["session.started", "message"]
        server.stop.drain.set()
        # The turn finishes on its own within the grace, then the server closes.
        ended = await receive(ws)
        assert (ended["type"], ended["data"]["reason"]) == ("session.ended", "completed")
        assert (await receive(ws))["type"] == "trioserve.turn.end"
        await expect_close(ws, 1001)


async def test_shutdown_stops_a_turn_past_the_grace_then_closes_1001(
    start_server: ServerFactory,
) -> None:
    server = await start_server(shutdown_grace=0.5, processes=True)
    session = (await server.create())["id"]
    async with connect(server, session) as ws:
        pid = await start_hanging_turn(ws)
        server.stop.drain.set()
        notice = await receive(ws)
        assert (notice["type"], notice["data"]["reason"]) == ("error", "server_shutdown")
        ended = await receive(ws)
        assert (ended["type"], ended["data"]["reason"]) == ("session.ended", "cancelled")
        end = await receive(ws)
        assert (end["type"], end["status"], end["reason"]) == (
            "trioserve.turn.end",
            "cancelled",
            "server_shutdown",
        )
        await expect_close(ws, 1001)
        assert not pid_alive(pid)


async def test_websocket_pings_at_the_heartbeat(start_server: ServerFactory) -> None:
    server = await start_server(heartbeat=0.1)
    session = (await server.create())["id"]
    async with raw_connect(server, session) as (stream, conn):
        pings = 0
        with trio.fail_after(10):
            while pings < 3:
                for event in conn.events():
                    if isinstance(event, wsproto.events.Ping):
                        pings += 1
                        await stream.send_all(conn.send(event.response()))
                conn.receive_data(await stream.receive_some())


# -- units --------------------------------------------------------------------------


def test_parse_message() -> None:
    assert parse_message('{"type":"turn","input":"hi"}') == WSTurn(type="turn", input="hi")
    assert parse_message('{"type":"turn"}') == WSTurn(type="turn", input="")
    assert parse_message('{"type":"cancel"}') == WSCancel(type="cancel")
    assert parse_message('{"type":"resume","after":3}') == WSResume(type="resume", after=3)
    continuing = parse_message('{"type":"turn","onDisconnect":"continue"}')
    assert isinstance(continuing, WSTurn) and continuing.onDisconnect == "continue"
    with pytest.raises(InvalidRequest, match=r"invalid turn message: input: expected a string"):
        parse_message('{"type":"turn","input":[],"extra":1}')
    assert parse_message('{"type":"turn","input":null,"extra":1}') == WSTurn(type="turn")
    assert parse_message('{"type":"resume","after":null}') == WSResume(type="resume", after=0)
    with pytest.raises(InvalidRequest, match=r"invalid resume message: after: .*greater than"):
        parse_message('{"type":"resume","after":-1}')
    with pytest.raises(InvalidRequest, match=r"after: expected an integer, got a boolean"):
        parse_message('{"type":"resume","after":true}')
    with pytest.raises(InvalidRequest, match=r"unknown type 'x': expected turn, cancel, ping"):
        parse_message('{"type":"x"}')
    with pytest.raises(InvalidRequest, match=r"type: expected a string.*got nothing"):
        parse_message("{}")
    with pytest.raises(InvalidRequest, match="text message"):
        parse_message(None)


def test_event_text_keeps_the_json_and_escapes_what_is_not_utf8() -> None:
    line = b'{"v":1,"type":"message","data":{"x":"caf\xc3\xa9"}}'
    assert event_text(wire.decode_line(line).raw) == line.decode()
    # An encoded lone surrogate decodes as JSON but is not UTF-8.
    event = wire.decode_line(b'{"v":1,"type":"message","data":{"s":"\xed\xa0\x80"}}')
    text = event_text(event.raw)
    assert json.loads(text)["data"]["s"] == "\ud800"
    text.encode()  # valid for a text frame


# -- a raw client (no close handshake, sees pings) ----------------------------------


def turn(text: str) -> dict[str, str]:
    return {"type": "turn", "input": text}


@asynccontextmanager
async def raw_connect(
    server: Server, session_id: str
) -> AsyncIterator[tuple[trio.SocketStream, wsproto.WSConnection]]:
    """A bare wsproto client; leaving closes the TCP connection without a close frame."""
    url = urlsplit(server.url)
    assert url.hostname is not None and url.port is not None
    stream = await trio.open_tcp_stream(url.hostname, url.port)
    async with stream:
        conn = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        target = f"/v1/sessions/{session_id}/ws"
        await stream.send_all(conn.send(wsproto.events.Request(host=url.netloc, target=target)))
        with trio.fail_after(10):
            while not any(isinstance(e, wsproto.events.AcceptConnection) for e in conn.events()):
                conn.receive_data(await stream.receive_some())
        yield stream, conn


async def next_message(stream: trio.SocketStream, conn: wsproto.WSConnection) -> dict[str, Any]:
    with trio.fail_after(10):
        while True:
            for event in conn.events():
                if isinstance(event, wsproto.events.TextMessage):
                    value: dict[str, Any] = json.loads(event.data)
                    return value
            conn.receive_data(await stream.receive_some())


async def test_a_bug_in_the_handler_still_cancels_the_turn(
    start_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(raw: bytes) -> str:
        if b'"type": "message"' in raw:
            raise RuntimeError("bug")
        return event_text(raw)

    monkeypatch.setattr(ws_module, "event_text", broken)
    server = await start_server(processes=True)
    session = (await server.create())["id"]
    async with connect(server, session) as ws:
        await send(ws, {"type": "turn", "input": HANG})
        started = await receive(ws)
        await expect_close(ws, 1011)
    await wait_gone(started["data"]["pid"])


async def test_a_store_failure_at_connect_closes_1011(
    start_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = await start_server()
    session = (await server.create())["id"]

    async def failing(session_id: str, tenant: str | None = None) -> None:
        raise StoreError("disk on fire")

    monkeypatch.setattr(server.manager, "get_session", failing)
    async with connect(server, session) as ws:
        assert await expect_close(ws, 1011) == "internal error"


async def test_a_websocket_to_an_unknown_route_gets_the_json_404(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    url = server.url.replace("http://", "ws://", 1) + "/v1/nothing/ws"
    with pytest.raises(ConnectionRejected) as rejected:
        async with open_websocket_url(url):
            pytest.fail("the handshake must be refused")
    assert rejected.value.status_code == 404
    assert rejected.value.body is not None
    assert json.loads(rejected.value.body)["error"] == {
        "code": 404,
        "reason": "route_not_found",
        "message": "no route for WEBSOCKET /v1/nothing/ws",
    }


async def test_frames_sent_with_the_handshake_are_read_after_it(
    start_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that sends its first frames with its handshake, before the 101 comes back,
    gets them read once the handshake is accepted (it was a bare 400 and a traceback)."""
    server = await start_server()
    session_id = (await server.create())["id"]
    host, port = urlsplit(server.url).hostname, urlsplit(server.url).port
    assert host is not None and port is not None
    client = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    data = client.send(wsproto.events.Request(host=host, target=f"/v1/sessions/{session_id}/ws"))
    client_frames = wsproto.frame_protocol.FrameProtocol(client=True, extensions=[])
    data += client_frames.send_data('{"type":"ping"}', fin=True)
    got: list[Any] = []
    with trio.fail_after(30):
        stream = await trio.open_tcp_stream(host, port)
        async with stream:
            await stream.send_all(data)
            while not any(isinstance(e, wsproto.events.TextMessage) for e in got):
                client.receive_data(await stream.receive_some(65536))
                got += list(client.events())
            await stream.send_all(bytes([0x8F, 0x80, 1, 2, 3, 4]))  # a reserved opcode
            while chunk := await stream.receive_some(65536):
                client.receive_data(chunk)
                got += list(client.events())
    kinds = [type(event).__name__ for event in got]
    assert kinds[0] == "AcceptConnection", kinds
    texts = [json.loads(e.data)["type"] for e in got if isinstance(e, wsproto.events.TextMessage)]
    assert texts == ["trioserve.pong"], got
    closes = [e for e in got if isinstance(e, wsproto.events.CloseConnection)]
    assert closes and closes[0].code == 1002, got  # the reserved opcode
    assert "Traceback" not in caplog.text
