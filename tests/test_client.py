"""The Python client: the SSE parser (pure), error mapping, and the real server."""

from __future__ import annotations

import json
import socket
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest
import trio

import trioserve.ws
from conftest import ServerFactory, script, wait_gone
from trioserve import app
from trioserve.client import (
    APIError,
    BadRequestError,
    Client,
    ConnectError,
    DrainingError,
    Event,
    NotFoundError,
    PayloadTooLargeError,
    ProtocolError,
    RateLimitedError,
    ServerError,
    ServerSentEvent,
    SessionBusyError,
    SSEParser,
    StreamInterrupted,
    Transport,
    TransportError,
    TrioserveClientError,
    TurnStream,
)
from trioserve.client.errors import CLOSE_CODES, error_class, from_response, parse_retry_after
from trioserve.errors import TrioserveError

HANG = script(
    {"event": "message", "data": {"role": "assistant", "content": "working"}}, {"hang": True}
)
TRANSPORTS: list[Transport] = ["sse", "websocket"]


# -- the SSE parser -------------------------------------------------------------------


def parse(*chunks: bytes) -> list[ServerSentEvent]:
    parser = SSEParser()
    events = [event for chunk in chunks for event in parser.feed(chunk)]
    parser.close()
    return events


def test_sse_the_servers_frames() -> None:
    stream = b'event: session.started\ndata: {"v":1}\n\n: keep-alive\n\nevent: x\ndata: 2\n\n'
    assert parse(stream) == [
        ServerSentEvent("session.started", '{"v":1}'),
        ServerSentEvent("x", "2"),
    ]


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_sse_every_line_ending(eol: bytes) -> None:
    stream = eol.join([b"event: a", b"data: 1", b"", b"data: 2", b"", b""])
    assert parse(stream) == [ServerSentEvent("a", "1"), ServerSentEvent("message", "2")]


def test_sse_mixed_line_endings_and_a_crlf_split_across_chunks() -> None:
    # Counted twice, the split CRLF would be a blank line dispatching "a" alone.
    assert parse(b"data: a\r", b"\ndata: b\r\n\r", b"\n") == [ServerSentEvent("message", "a\nb")]
    assert parse(b"data: a\r", b"\r", b"data: b\n\n") == [
        ServerSentEvent("message", "a"),
        ServerSentEvent("message", "b"),
    ]


def test_sse_multi_line_data_and_the_optional_space() -> None:
    stream = b"data: one\ndata:two\ndata:  three\ndata\ndata:\n\n"
    assert parse(stream) == [ServerSentEvent("message", "one\ntwo\n three\n\n")]


def test_sse_comments_unknown_fields_and_frames_without_data() -> None:
    stream = (
        b": keep-alive\n\n"  # a heartbeat: nothing
        b"event: lonely\n\n"  # no data: nothing, and the type does not carry over
        b"foo: bar\nDATA: no\ndata : no\n\n"  # unknown fields (names are case-sensitive)
        b":comment\ndata: yes\n\n"
    )
    assert parse(stream) == [ServerSentEvent("message", "yes")]


def test_sse_ids_persist_and_nul_is_ignored() -> None:
    parser = SSEParser()
    events = parser.feed(
        b"id: 1\ndata: a\n\n"
        b"data: b\n\n"  # no id line: the last id still holds
        b"id: 2\x00x\ndata: c\n\n"  # NUL: ignored
        b"id\ndata: d\n\n"  # an empty id resets it
        b"id: 7\n\n"  # an id-only frame dispatches nothing but sets the id
        b"data: e\n\n"
    )
    assert [(e.data, e.last_event_id) for e in events] == [
        ("a", "1"),
        ("b", "1"),
        ("c", "1"),
        ("d", ""),
        ("e", "7"),
    ]
    assert parser.last_event_id == "7"


def test_sse_retry() -> None:
    parser = SSEParser()
    parser.feed(b"retry: 1500\n\n")
    assert parser.retry == 1500
    parser.feed(b"retry: 15s\nretry: -1\nretry:\nretry: \xc2\xb2\n\n")  # not ASCII digits
    assert parser.retry == 1500
    parser.feed(b"retry:20\n\n")
    assert parser.retry == 20


def test_sse_incomplete_frame_at_eof_is_discarded() -> None:
    assert parse(b"data: whole\n\ndata: half\n") == [ServerSentEvent("message", "whole")]
    assert parse(b"data: whole\n\ndata: no newline") == [ServerSentEvent("message", "whole")]


def test_sse_bom_is_skipped_once_at_the_start_only() -> None:
    bom = "\ufeff".encode()
    assert parse(bom + b"data: x\n\n") == [ServerSentEvent("message", "x")]
    # A second BOM is part of the line: "\ufeffdata" is an unknown field.
    assert parse(bom + bom + b"data: x\n\ndata: y\n\n") == [ServerSentEvent("message", "y")]
    assert parse(b"data: " + bom + b"x\n\n") == [ServerSentEvent("message", "\ufeffx")]


def test_sse_utf8_and_invalid_bytes() -> None:
    assert parse("data: café ✓\n\n".encode()) == [ServerSentEvent("message", "café ✓")]
    assert parse(b"data: \xff\xfe\n\n") == [ServerSentEvent("message", "\ufffd\ufffd")]


SAMPLE = (
    "\ufeff: keep-alive\r\n\r\n"
    'event: message\r\nid: 1\r\ndata: {"text":"h\u00e9llo \u2713 \U0001f600"}\r\n\r\n'
    "data: line one\rdata: line two\r\r"
    "event: session.ended\ndata: {}\nid: 2\n\n"
    "retry: 10\r\ndata: trailing incomplete"
).encode()


def test_sse_chunk_boundaries_at_every_byte() -> None:
    whole = parse(SAMPLE)
    assert [e.event for e in whole] == ["message", "message", "session.ended"]
    assert whole[0].data == '{"text":"h\u00e9llo \u2713 \U0001f600"}'
    assert whole[1] == ServerSentEvent("message", "line one\nline two", "1")
    assert whole[2].last_event_id == "2"
    for i in range(len(SAMPLE) + 1):
        assert parse(SAMPLE[:i], SAMPLE[i:]) == whole, i
    for i in range(len(SAMPLE) + 1):
        for j in range(i, len(SAMPLE) + 1, 7):
            assert parse(SAMPLE[:i], SAMPLE[i:j], SAMPLE[j:]) == whole, (i, j)
    assert parse(*(SAMPLE[i : i + 1] for i in range(len(SAMPLE)))) == whole


def test_sse_events_are_returned_as_soon_as_their_blank_line_arrives() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\n") == []
    assert parser.feed(b"\r") == [ServerSentEvent("message", "a")]  # CR is a whole line ending
    assert parser.feed(b"\n") == []  # ... and this LF belongs to it
    assert parser.feed(b"data: b\n\n") == [ServerSentEvent("message", "b")]


def test_event_seq_and_last_event_id() -> None:
    text = '{"seq":3,"v":1,"type":"message","sessionId":"s_1","data":{"role":"assistant"}}'
    event = Event.parse(text, last_event_id="3")
    assert (event.seq, event.last_event_id, event.session_id) == (3, "3", "s_1")
    assert (event.type, event.data, event.raw) == ("message", {"role": "assistant"}, text)
    assert event.json["seq"] == 3 and event.wire().type == "message"
    plain = Event.parse('{"v":1,"type":"x.future","extra":[1]}', last_event_id="")
    assert (plain.seq, plain.last_event_id, plain.data) == (None, None, {})
    assert plain.json["extra"] == [1]  # unknown types and fields are kept
    assert Event.parse('{"v":1,"type":"m","seq":true}').seq is None
    for bad in ["nope", "[1]", '{"v":2,"type":"m"}', '{"v":1}', '{"v":1,"type":"m","data":[]}']:
        with pytest.raises(ProtocolError):
            Event.parse(bad)


# -- errors -----------------------------------------------------------------------------


def test_error_classes_cover_every_server_refusal() -> None:
    expected = {
        "invalid_request": BadRequestError,
        "not_found": NotFoundError,
        "no_turn": NotFoundError,
        "session_busy": SessionBusyError,
        "turn_cap": RateLimitedError,
        "session_cap": RateLimitedError,
        "draining": DrainingError,
    }
    seen = set()
    for server_class in app.STATUS_OF:
        for cls in [server_class, *server_class.__subclasses__()]:
            if issubclass(cls, TrioserveError) and cls.reason in expected:
                assert error_class(app.status_for(cls("x"))) is expected[cls.reason]
                seen.add(cls.reason)
    assert seen == set(expected)
    assert error_class(413) is PayloadTooLargeError
    assert error_class(500) is ServerError and error_class(502) is ServerError
    assert error_class(405) is APIError
    assert issubclass(APIError, TrioserveClientError)
    assert issubclass(StreamInterrupted, TransportError)
    assert issubclass(ConnectError, TransportError)


def test_close_codes_match_the_server() -> None:
    assert CLOSE_CODES[trioserve.ws.CLOSE_NOT_FOUND] == (404, "not_found")
    assert CLOSE_CODES[trioserve.ws.CLOSE_DRAINING] == (503, "draining")
    assert CLOSE_CODES[trioserve.ws.CLOSE_SHUTDOWN][0] == 503


def test_error_from_an_envelope_and_from_anything_else() -> None:
    body = json.dumps(app.error_body(429, "turn_cap", "too many concurrent turns (max 1)"))
    error = from_response(429, {"retry-after": "1"}, body.encode())
    assert isinstance(error, RateLimitedError)
    assert (error.code, error.reason, error.retry_after) == (429, "turn_cap", 1.0)
    assert error.message == "too many concurrent turns (max 1)"
    assert str(error) == "too many concurrent turns (max 1) (429 turn_cap; retry after 1s)"
    for raw in [b"<html>Bad Gateway</html>", b"", b"[1]", b'{"error":"x"}', b"\xff", b"{"]:
        error = from_response(502, {}, raw)
        assert isinstance(error, ServerError)
        assert (error.code, error.reason, error.retry_after) == (502, "unknown", None)
        assert error.message.startswith("HTTP 502")
    assert "Bad Gateway" in from_response(502, {}, b"<html>Bad Gateway</html>").message
    no_reason = from_response(404, {}, b'{"error":{"code":404,"message":"gone"}}')
    assert (type(no_reason), no_reason.reason, no_reason.message) == (
        NotFoundError,
        "unknown",
        "gone",
    )


def test_retry_after() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert parse_retry_after("1") == 1.0
    assert parse_retry_after(" 120 ") == 120.0
    assert parse_retry_after("Thu, 01 Jan 2026 00:00:30 GMT", now=now) == 30.0
    assert parse_retry_after("Thu, 01 Jan 2026 00:00:00 GMT", now=now + timedelta(1)) == 0.0
    for bad in [None, "", "soon", "-1", "1.5"]:
        assert parse_retry_after(bad) is None


def test_client_rejects_a_base_url_it_cannot_use() -> None:
    for bad in ["localhost:8080", "ftp://x", "http://"]:
        with pytest.raises(ValueError, match="base URL"):
            Client(bad)
    client = Client("https://example.com/prefix/")
    assert client.websocket_url("s_1") == "wss://example.com/prefix/v1/sessions/s_1/ws"
    assert client.websocket_url("a/b").endswith("/v1/sessions/a%2Fb/ws")


# -- against the real server ------------------------------------------------------------


async def events_of(stream: TurnStream) -> list[Event]:
    with trio.fail_after(30):
        return [event async for event in stream]


async def next_event(stream: TurnStream) -> Event:
    with trio.fail_after(10):
        return await anext(stream)


async def test_sessions_create_get_list_end(start_server: ServerFactory) -> None:
    server = await start_server()
    async with Client(server.url) as client:
        assert await client.health() and await client.ready()
        one = await client.create_session()
        two = await client.create_session({"unused": "x"})
        assert (one.agent_name, one.runtime_type, one.status) == ("test-agent", "exec", "active")
        assert one.created_at.tzinfo is not None and not one.terminal
        assert one.json == (await server.client.get(f"/v1/sessions/{one.id}")).json()
        assert await client.get_session(one.id) == one
        assert {s.id for s in await client.list_sessions()} == {one.id, two.id}
        assert len(await client.list_sessions(limit=1)) == 1
        await client.end_session(one.id)
        await client.end_session(one.id)  # idempotent
        ended = await client.get_session(one.id)
        assert ended.status == "ended" and ended.terminal
        assert [s.id for s in await client.list_sessions(status="ended")] == [one.id]
        assert [s.id for s in await client.list_sessions(status="active")] == [two.id]
        with pytest.raises(BadRequestError) as bad:
            await client.list_sessions(status="bogus")
        assert (bad.value.code, bad.value.reason) == (400, "invalid_request")
        assert "unknown status 'bogus'" in bad.value.message
        with pytest.raises(NotFoundError) as missing:
            await client.get_session("s_nope")
        assert (missing.value.code, missing.value.reason) == (404, "not_found")
        with pytest.raises(NotFoundError):
            await client.end_session("s_nope")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_turn_events_in_order(start_server: ServerFactory, transport: Transport) -> None:
    server = await start_server()
    async with Client(server.url) as client:
        sid = (await client.create_session()).id
        for text in ["hello", "again"]:
            async with client.turn(sid, text, transport=transport) as events:
                assert events.transport == transport and events.session_id == sid
                got = await events_of(events)
            assert [e.type for e in got] == ["session.started", "message", "session.ended"]
            assert got[1].data == {"role": "assistant", "content": f"echo: {text}"}
            assert got[2].end_reason == "completed" and events.finished
            assert all(e.session_id == sid for e in got)
            # Each event's number in the session's log; over SSE also the frame's id.
            seqs = [e.seq for e in got]
            assert all(isinstance(n, int) for n in seqs), seqs
            assert seqs == sorted(seqs) and len(set(seqs)) == 3
            ids = [e.last_event_id for e in got]
            assert ids == ([str(n) for n in seqs] if transport == "sse" else [None] * 3)
        # An empty input runs the session's task.
        async with client.turn(sid, transport=transport) as events:
            assert (await events_of(events))[1].data["content"] == "echo: Say hello."


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_turn_ending_with_an_error_ends_the_iteration(
    start_server: ServerFactory, transport: Transport
) -> None:
    server = await start_server()
    async with Client(server.url) as client:
        sid = (await client.create_session()).id
        async with client.turn(sid, script({"exit": 3}), transport=transport) as events:
            got = await events_of(events)
        assert [e.type for e in got] == ["session.started", "error"]
        assert "exited with status 3" in got[1].data["message"]
        # An undecodable line is an error event in the middle: the turn goes on.
        steps = script({"raw": "garbage"}, {"end": "completed"})
        async with client.turn(sid, steps, transport=transport) as events:
            got = await events_of(events)
        assert [e.type for e in got] == ["session.started", "error", "session.ended"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_refusals_raise_before_any_event(
    start_server: ServerFactory, transport: Transport
) -> None:
    server = await start_server(max_concurrent_turns=1)
    async with Client(server.url) as client:
        with pytest.raises(NotFoundError) as missing:
            async with client.turn("s_nope", "x", transport=transport):
                pytest.fail("entered")
        assert (missing.value.code, missing.value.reason) == (404, "not_found")
        assert "s_nope" in missing.value.message
        assert missing.value.close_code == (4404 if transport == "websocket" else None)
        a = (await client.create_session()).id
        b = (await client.create_session()).id
        async with client.turn(a, HANG, transport=transport) as running:
            assert (await next_event(running)).type == "session.started"
            with pytest.raises(SessionBusyError) as busy:
                async with client.turn(a, "x", transport=transport):
                    pytest.fail("entered")
            assert (busy.value.code, busy.value.reason) == (409, "session_busy")
            with pytest.raises(RateLimitedError) as capped:
                async with client.turn(b, "x", transport=transport):
                    pytest.fail("entered")
            assert (capped.value.code, capped.value.reason) == (429, "turn_cap")
            # Retry-After is an HTTP header: WebSocket refusals have none.
            assert capped.value.retry_after == (1 if transport == "sse" else None)
            await client.cancel(a)
            assert (await events_of(running))[-1].end_reason == "cancelled"
        with pytest.raises(NotFoundError) as nothing:
            await client.cancel(a)
        assert nothing.value.reason == "no_turn"
        await client.end_session(b)
        with pytest.raises(NotFoundError, match="ended"):
            async with client.turn(b, "x", transport=transport):
                pytest.fail("entered")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_cancel_a_running_turn(start_server: ServerFactory, transport: Transport) -> None:
    server = await start_server()
    async with Client(server.url) as client:
        sid = (await client.create_session()).id
        async with client.turn(sid, HANG, transport=transport) as events:
            started = await next_event(events)
            assert (await next_event(events)).data["content"] == "working"
            await client.cancel(sid)
            rest = await events_of(events)
        assert [e.type for e in rest] == ["session.ended"]
        assert rest[0].end_reason == "cancelled"
        await wait_gone(started.data["pid"], 5)
        assert (await client.get_session(sid)).status == "active"
        async with client.turn(sid, "next", transport=transport) as events:
            assert (await events_of(events))[-1].end_reason == "completed"


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("how", ["break", "raise", "cancel"])
async def test_leaving_the_block_early_cancels_the_turn(
    start_server: ServerFactory, transport: Transport, how: str
) -> None:
    server = await start_server()
    pid = 0

    class Leave(Exception):
        pass

    async with Client(server.url) as client:
        sid = (await client.create_session()).id
        with trio.move_on_after(30) as guard:
            try:
                async with client.turn(sid, HANG, transport=transport) as events:
                    async for event in events:
                        if event.type == "session.started":
                            pid = event.data["pid"]
                        if event.type == "message":
                            if how == "raise":
                                raise Leave
                            if how == "cancel":
                                guard.cancel()
                                await trio.sleep_forever()
                            break
            except Leave:
                pass
        assert pid and guard.cancelled_caught == (how == "cancel")
        await wait_gone(pid, 5)
        # The server freed the session: the next turn is not a 409.
        async with client.turn(sid, "after", transport=transport) as events:
            assert (await events_of(events))[-1].end_reason == "completed"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_draining_is_503(start_server: ServerFactory, transport: Transport) -> None:
    server = await start_server()
    async with Client(server.url) as client:
        sid = (await client.create_session()).id
        server.manager.start_draining()
        assert not await client.ready()
        with pytest.raises(DrainingError) as refused:
            await client.create_session()
        assert (refused.value.code, refused.value.reason, refused.value.retry_after) == (
            503,
            "draining",
            1,
        )
        with pytest.raises(DrainingError) as turn_refused:
            async with client.turn(sid, "x", transport=transport):
                pytest.fail("entered")
        assert turn_refused.value.code == 503
        assert turn_refused.value.close_code == (4503 if transport == "websocket" else None)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_heartbeats_are_not_events(start_server: ServerFactory, transport: Transport) -> None:
    server = await start_server(heartbeat=0.2)
    async with Client(server.url) as client:
        sid = (await client.create_session()).id
        quiet = script({"sleep": 1.1}, {"end": "completed"})
        async with client.turn(sid, quiet, transport=transport) as events:
            assert [e.type for e in await events_of(events)] == ["session.started", "session.ended"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_too_large_a_turn(start_server: ServerFactory, transport: Transport) -> None:
    server = await start_server()
    async with Client(server.url) as client:
        sid = (await client.create_session()).id
        with pytest.raises(PayloadTooLargeError) as refused:
            async with client.turn(sid, "x" * (2 * 1024 * 1024), transport=transport):
                pytest.fail("entered")
        assert refused.value.code == 413
        assert refused.value.close_code == (1009 if transport == "websocket" else None)


async def test_a_server_bug_mid_turn_over_websocket_is_a_server_error(
    start_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = trioserve.ws.event_text
    calls = 0

    def broken(*args: Any) -> str:  # the first event goes out, the second hits a bug
        nonlocal calls
        calls += 1
        if calls > 1:
            raise RuntimeError("bug")
        return original(*args)

    monkeypatch.setattr(trioserve.ws, "event_text", broken)
    server = await start_server()
    async with Client(server.url) as client:
        sid = (await client.create_session()).id
        async with client.turn(sid, HANG, transport="websocket") as events:
            started = await next_event(events)
            with pytest.raises(ServerError) as failed:
                await next_event(events)
        assert (failed.value.code, failed.value.close_code) == (500, 1011)
        await wait_gone(started.data["pid"], 5)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_unreachable_server_is_a_connect_error(transport: Transport) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with Client(f"http://127.0.0.1:{port}", timeout=5) as client:
        with pytest.raises(ConnectError, match=f"127.0.0.1:{port}"):
            await client.create_session()
        with pytest.raises(ConnectError):
            async with client.turn("s_1", "x", transport=transport):
                pytest.fail("entered")


# -- a misbehaving peer (a proxy, a dying server): a raw HTTP responder -----------------


async def raw_http_server(nursery: trio.Nursery, response: bytes) -> str:
    """Answer every request with ``response`` and close the connection."""

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            request = b""
            while b"\r\n\r\n" not in request:
                request += await stream.receive_some(65536)
            head, _, body = request.partition(b"\r\n\r\n")
            length = [
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ]
            while length and len(body) < length[0]:
                body += await stream.receive_some(65536)
            await stream.send_all(response)

    listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    return f"http://127.0.0.1:{port}"


SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
STARTED = b'event: session.started\ndata: {"v":1,"type":"session.started","data":{}}\n\n'


async def test_a_stream_cut_before_the_last_event(nursery: trio.Nursery) -> None:
    url = await raw_http_server(nursery, SSE_HEAD + STARTED)
    async with Client(url) as client, client.turn("s_1", "x") as events:
        assert (await next_event(events)).type == "session.started"
        with pytest.raises(StreamInterrupted, match="before its last event"):
            await next_event(events)
        with pytest.raises(StopAsyncIteration):
            await anext(events)


async def test_seq_and_ids_from_the_stream(nursery: trio.Nursery) -> None:
    frames = (
        b'event: session.started\ndata: {"seq":1,"v":1,"type":"session.started"}\nid: 1\n\n'
        b": keep-alive\n\n"
        b'event: session.ended\ndata: {"seq":2,"v":1,"type":"session.ended",'
        b'"data":{"reason":"completed"}}\nid: 2\n\n'
    )
    url = await raw_http_server(nursery, SSE_HEAD + frames)
    async with Client(url) as client, client.turn("s_1", "x") as events:
        got = await events_of(events)
    assert [(e.seq, e.last_event_id) for e in got] == [(1, "1"), (2, "2")]


async def test_a_body_that_is_no_envelope(nursery: trio.Nursery) -> None:
    page = b"<html><body>Bad Gateway</body></html>"
    url = await raw_http_server(
        nursery,
        b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/html\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(page), page),
    )
    async with Client(url) as client:
        with pytest.raises(ServerError) as failed:
            await client.create_session()
        assert (failed.value.code, failed.value.reason) == (502, "unknown")
        assert "Bad Gateway" in failed.value.message
        with pytest.raises(ServerError):
            async with client.turn("s_1", "x"):
                pytest.fail("entered")


async def test_not_an_event_stream(nursery: trio.Nursery) -> None:
    url = await raw_http_server(
        nursery,
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n"
        b"Connection: close\r\n\r\nok",
    )
    async with Client(url) as client:
        with pytest.raises(ProtocolError, match="text/plain"):
            async with client.turn("s_1", "x"):
                pytest.fail("entered")
        with pytest.raises(ProtocolError):
            await client.get_session("s_1")
