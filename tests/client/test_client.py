"""The Python client: the SSE parser (pure), error mapping, and the real server."""

from __future__ import annotations

import itertools
import json
import math
import socket
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Ping
from wsproto.events import Event as WSEvent
from wsproto.events import Request as WSRequest

import trioserve.http._ws as ws_module
from tests.helpers import CuttingProxy, ServerFactory, pid_alive, script, wait_gone
from tests.helpers.backends import DURABLE
from tests.helpers.responder import Responder
from trioserve import protocol
from trioserve.client import (
    APIError,
    AsyncEventStream,
    BadRequestError,
    Client,
    ConnectError,
    CursorExpiredError,
    DrainingError,
    Event,
    LogStream,
    NotFoundError,
    PayloadTooLargeError,
    ProtocolError,
    RateLimitedError,
    Reconnect,
    Retry,
    ServerError,
    ServerSentEvent,
    SessionBusyError,
    SSEParser,
    StreamInterrupted,
    Transport,
    TransportError,
    TrioserveClientError,
    Turn,
)
from trioserve.client.errors import error_class, from_error_object, from_response, parse_retry_after
from trioserve.client.log import parse_event_array
from trioserve.errors import TrioserveError
from trioserve.http import _errors as http_errors
from trioserve.protocol import CLOSE_CODES

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
    for server_class in http_errors.STATUS_OF:
        for cls in [server_class, *server_class.__subclasses__()]:
            if issubclass(cls, TrioserveError) and cls.reason in expected:
                assert error_class(http_errors.status_for(cls("x"))) is expected[cls.reason]
                seen.add(cls.reason)
    assert seen == set(expected)
    assert error_class(413) is PayloadTooLargeError
    assert error_class(500) is ServerError and error_class(502) is ServerError
    assert error_class(405) is APIError
    assert issubclass(APIError, TrioserveClientError)
    assert issubclass(StreamInterrupted, TransportError)
    assert issubclass(ConnectError, TransportError)


def test_close_codes_match_the_server() -> None:
    assert CLOSE_CODES[protocol.CLOSE_NOT_FOUND] == (404, "not_found")
    assert CLOSE_CODES[protocol.CLOSE_DRAINING] == (503, "draining")
    assert CLOSE_CODES[protocol.CLOSE_SHUTDOWN][0] == 503


def test_error_from_an_envelope_and_from_anything_else() -> None:
    body = json.dumps(http_errors.error_body(429, "turn_cap", "too many concurrent turns (max 1)"))
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


async def events_of(stream: AsyncEventStream) -> list[Event]:
    with trio.fail_after(30):
        return [event async for event in stream]


async def next_event(stream: AsyncEventStream) -> Event:
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
        assert await client.list_sessions(status="bogus") == []  # as in v0.8
        with pytest.raises(BadRequestError) as bad:
            await client.list_sessions(limit=0)
        assert (bad.value.code, bad.value.reason) == (400, "invalid_request")
        assert "limit must be a positive integer" in bad.value.message
        with pytest.raises(NotFoundError) as missing:
            await client.get_session("s_nope")
        assert (missing.value.code, missing.value.reason) == (404, "not_found")
        with pytest.raises(NotFoundError):
            await client.end_session("s_nope")


async def test_sessions_in_pages(start_server: ServerFactory) -> None:
    server = await start_server()
    async with Client(server.url) as client:
        created = [(await client.create_session()).id for _ in range(7)]
        await client.end_session(created[1])
        newest_first = created[::-1]
        page = await client.sessions_page(limit=3)
        assert [s.id for s in page.sessions] == newest_first[:3]
        assert page.next_page is not None
        rest = await client.list_sessions(before=page.next_page)
        assert [s.id for s in rest] == newest_first[3:]
        last = await client.sessions_page(limit=4, before=page.next_page)
        assert last.next_page is None and len(last.sessions) == 4
        assert [s.id for s in await client.list_sessions(before=created[2])] == created[1::-1]
        assert [s.id async for s in client.iter_sessions(page_size=2)] == newest_first
        assert [s.id async for s in client.iter_sessions(page_size=7)] == newest_first
        active = [s.id async for s in client.iter_sessions("active", page_size=2)]
        assert active == [sid for sid in newest_first if sid != created[1]]
        # sessions created while the pages are read come before the first page
        seen = []
        async for session in client.iter_sessions(page_size=2):
            seen.append(session.id)
            await client.create_session()
        assert seen == newest_first
        for kwargs, needle in (
            ({"limit": 0}, "limit must be a positive integer (at most 10000)"),
            ({"limit": 10_001}, "limit must be"),
            ({"before": ""}, "before must be a page token"),
            ({"before": "s_nope"}, "neither a page token nor the id of a session"),
        ):
            with pytest.raises(BadRequestError) as bad:
                await client.sessions_page(**kwargs)
            assert bad.value.code == 400 and needle in bad.value.message, kwargs


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
            assert got[1].data == {"role": "assistant", "text": f"echo: {text}"}
            assert got[2].end_reason == "completed" and events.finished
            assert all(e.session_id == sid for e in got)
            # Each event's number in the session's log; over SSE also the frame's id.
            seqs = [e.seq for e in got if e.seq is not None]
            assert len(seqs) == len(got), got
            assert seqs == sorted(seqs) and len(set(seqs)) == 3
            ids = [e.last_event_id for e in got]
            assert ids == ([str(n) for n in seqs] if transport == "sse" else [None] * 3)
        # An empty input runs the session's task.
        async with client.turn(sid, transport=transport) as events:
            assert (await events_of(events))[1].data["text"] == "echo: Say hello."


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
    server = await start_server(processes=True)
    async with Client(server.url) as client:
        sid = (await client.create_session()).id
        async with client.turn(sid, HANG, transport=transport) as events:
            started = await next_event(events)
            assert (await next_event(events)).data["content"] == "working"
            await client.cancel(sid)
            rest = await events_of(events)
        assert [e.type for e in rest] == ["session.ended"]
        assert rest[0].end_reason == "cancelled"
        await wait_gone(started.data["pid"])
        assert (await client.get_session(sid)).status == "active"
        async with client.turn(sid, "next", transport=transport) as events:
            assert (await events_of(events))[-1].end_reason == "completed"


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("how", ["break", "raise", "cancel"])
async def test_leaving_the_block_early_cancels_the_turn(
    start_server: ServerFactory, transport: Transport, how: str
) -> None:
    server = await start_server(processes=True)
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
        await wait_gone(pid)
        # The server freed the session: the next turn is not a 409.
        async with client.turn(sid, "after", transport=transport) as events:
            assert (await events_of(events))[-1].end_reason == "completed"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_draining_is_503(start_server: ServerFactory, transport: Transport) -> None:
    server = await start_server()
    # Not sent again after Retry-After (test_loops has the retries): the refusal, at once.
    async with Client(server.url, retry=Retry(attempts=0)) as client:
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
    original = ws_module.event_text
    calls = 0

    def broken(*args: Any) -> str:  # the first event goes out, the second hits a bug
        nonlocal calls
        calls += 1
        if calls > 1:
            raise RuntimeError("bug")
        return original(*args)

    monkeypatch.setattr(ws_module, "event_text", broken)
    server = await start_server(processes=True)
    async with Client(server.url) as client:
        sid = (await client.create_session()).id
        async with client.turn(sid, HANG, transport="websocket") as events:
            started = await next_event(events)
            with pytest.raises(ServerError) as failed:
                await next_event(events)
        assert (failed.value.code, failed.value.close_code) == (500, 1011)
        await wait_gone(started.data["pid"])


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
        # The first connection of events() is not retried.
        with pytest.raises(ConnectError):
            async with client.events("s_1", transport=transport):
                pytest.fail("entered")
        with pytest.raises(ConnectError):
            await client.detach("s_1")


# -- a misbehaving peer (a proxy, a dying server): a raw HTTP responder -----------------


async def raw_http_server(nursery: trio.Nursery, response: bytes) -> str:
    """Answer every request with ``response`` and close the connection."""
    return await Responder(response).start(nursery)


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


async def answer_with_the_handshake(frames: list[WSEvent], stream: trio.SocketStream) -> None:
    """A WebSocket server that accepts and sends ``frames`` in the same write (as a server
    whose writes go out back to back, or a proxy that joins them, does)."""
    ws = WSConnection(ConnectionType.SERVER)
    async with stream:
        while True:
            ws.receive_data(await stream.receive_some(65536))
            if any(isinstance(event, WSRequest) for event in ws.events()):
                break
        answer = ws.send(AcceptConnection()) + b"".join(map(ws.send, frames))
        await stream.send_all(answer)
        with trio.move_on_after(5):  # the client's close, then its EOF
            while await stream.receive_some(65536):
                pass


@pytest.mark.parametrize(
    ("frames", "error", "code"),
    [
        ([CloseConnection(code=4503, reason="server is draining")], DrainingError, 503),
        ([Ping(), CloseConnection(code=4404, reason="session not found")], NotFoundError, 404),
    ],
    ids=["close", "ping-then-close"],
)
async def test_a_refusal_read_with_the_handshake_is_its_close_code(
    nursery: trio.Nursery, frames: list[WSEvent], error: type[APIError], code: int
) -> None:
    serve = partial(answer_with_the_handshake, frames)
    listeners = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
    url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
    async with Client(url, retry=Retry(attempts=0)) as client:
        with pytest.raises(error) as refused:
            async with client.turn("s_1", "x", transport="websocket"):
                pytest.fail("entered")
    assert (refused.value.close_code, refused.value.code) == (code + 4000, code)


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


# -- turn records, detached turns, the event log -----------------------------------------

TICKS = 300
TICKING = script({"tick": TICKS, "every": 0.002}, {"end": "completed"})


def ticks(events: list[Event]) -> list[int]:
    return [e.data["i"] for e in events if e.type == "message" and "i" in e.data]


def assert_contiguous(events: list[Event], first: int) -> None:
    """Each event once, in seq order, without a gap, from ``first``."""
    assert [e.seq for e in events] == list(range(first, first + len(events)))


async def read_log(client: Client, session_id: str, **kw: Any) -> list[Event]:
    with trio.fail_after(30):
        async with client.events(session_id, **kw) as stream:
            return [event async for event in stream]


async def wait_finished(client: Client, session_id: str, turn_id: str) -> Turn:
    with trio.fail_after(15):
        while (record := await client.get_turn(session_id, turn_id)).running:
            await trio.sleep(0.02)
    return record


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_turn_ids_status_and_typed_records(
    start_server: ServerFactory, transport: Transport
) -> None:
    server = await start_server()
    async with Client(server.url) as client:
        sid = (await client.create_session()).id
        assert await client.list_turns(sid) == []
        async with client.turn(sid, "one", transport=transport) as events:
            if transport == "sse":  # the response header, known at once
                assert events.turn_id is not None and events.turn_id.startswith("t_")
            got = await events_of(events)
        assert events.turn_id is not None and events.turn_id.startswith("t_")
        assert events.last_seq == got[-1].seq == 3
        # Over WebSocket the final status comes with trioserve.turn.end; SSE has none.
        final = ("completed", "completed") if transport == "websocket" else (None, None)
        assert (events.status, events.reason) == final
        async with client.turn(sid, script({"exit": 3}), transport=transport) as crashed:
            await events_of(crashed)
        records = await client.list_turns(sid)
        assert [r.id for r in records] == [events.turn_id, crashed.turn_id]
        one, two = records
        assert isinstance(one, Turn) and one.session_id == sid and one.input == "one"
        assert (one.status, one.reason, one.first_seq, one.last_seq) == (
            "completed",
            "completed",
            1,
            3,
        )
        assert one.started_at is not None and one.ended_at is not None
        assert one.created_at <= one.started_at <= one.ended_at
        assert one.created_at.tzinfo is not None and not one.running
        assert one.json == (await server.client.get(f"/v1/sessions/{sid}/turns/{one.id}")).json()
        assert (two.status, two.reason, two.first_seq, two.last_seq) == (
            "failed",
            "adapter_exit",
            4,
            5,
        )
        assert await client.get_turn(sid, two.id) == two
        with pytest.raises(NotFoundError) as missing:
            await client.get_turn(sid, "t_nope")
        assert missing.value.reason == "not_found"
        with pytest.raises(NotFoundError):
            await client.list_turns("s_nope")


async def test_websocket_turn_ends_on_turn_end_not_on_error_text(
    start_server: ServerFactory,
) -> None:
    """The end of a WebSocket turn is trioserve.turn.end, whatever the events say."""
    server = await start_server()
    async with Client(server.url) as client:
        sid = (await client.create_session()).id
        # An adapter crash: no session.ended; the turn still ends, as failed.
        async with client.turn(sid, script({"exit": 3}), transport="websocket") as events:
            got = await events_of(events)
            assert events.finished
        assert [e.type for e in got] == ["session.started", "error"]
        assert (events.status, events.reason, events.last_seq) == ("failed", "adapter_exit", 2)
        # Error events that look like a crash's, from the adapter, mid-turn: the turn goes on.
        lookalikes = script(
            {"event": "error", "data": {"message": "adapter stopped", "exitCode": 1}},
            {"event": "error", "data": {"message": "internal error"}},
            {"event": "message", "data": {"role": "assistant", "content": "still here"}},
            {"end": "completed"},
        )
        async with client.turn(sid, lookalikes, transport="websocket") as events:
            got = await events_of(events)
        assert [e.type for e in got] == [
            "session.started",
            "error",
            "error",
            "message",
            "session.ended",
        ]
        assert (events.status, events.reason) == ("completed", "completed")
        # Leaving right after session.ended still picks up the final status.
        async with client.turn(sid, "x", transport="websocket") as events:
            async for event in events:
                if event.is_end:
                    break
        assert (events.status, events.reason) == ("completed", "completed")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_detach_then_read_the_whole_turn(
    start_server: ServerFactory, transport: Transport
) -> None:
    server = await start_server()
    async with Client(server.url) as client:
        sid = (await client.create_session()).id
        async with client.turn(sid, "before") as before:
            await events_of(before)
        record = await client.detach(sid, TICKING)
        assert isinstance(record, Turn) and record.running and record.reason is None
        assert (record.session_id, record.input, record.ended_at) == (sid, TICKING, None)
        with pytest.raises(SessionBusyError):  # it holds the session like any turn
            await client.detach(sid, "again")
        got = await read_log(client, sid, turn=record.id, transport=transport)
        assert_contiguous(got, 4)
        assert ticks(got) == list(range(TICKS))
        assert got[0].type == "session.started" and got[-1].end_reason == "completed"
        done = await wait_finished(client, sid, record.id)
        assert (done.status, done.first_seq, done.last_seq) == ("completed", 4, got[-1].seq)
        # The whole log, and from a cursor.
        whole = await read_log(client, sid, transport=transport)
        assert_contiguous(whole, 1)
        assert whole[3:] == got
        assert await read_log(client, sid, after=100, transport=transport) == whole[100:]
        assert await read_log(client, sid, after=whole[-1].seq, transport=transport) == []


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_on_disconnect_continue_survives_leaving_the_block(
    start_server: ServerFactory, transport: Transport
) -> None:
    server = await start_server(processes=True)
    text = script(
        {"event": "message", "data": {"n": 1}},
        {"sleep": 0.5},
        {"event": "message", "data": {"n": 2}},
        {"end": "completed"},
    )
    async with Client(server.url) as client:
        sid = (await client.create_session()).id
        async with client.turn(sid, text, transport=transport, on_disconnect="continue") as events:
            first = await next_event(events)
            pid = first.data["pid"]
        assert pid_alive(pid), "the turn runs on without its client"
        turn_id = (await client.list_turns(sid))[-1].id
        record = await wait_finished(client, sid, turn_id)
        assert (record.status, record.reason) == ("completed", "completed")
        got = await read_log(client, sid, after=first.seq or 0, transport=transport)
        assert [e.data.get("n") for e in got] == [1, 2, None]
        assert got[-1].end_reason == "completed"
        # The default (cancel) stops it, and its record says why.
        async with client.turn(sid, HANG, transport=transport) as events:
            await next_event(events)
            await next_event(events)
        cancelled = (await client.list_turns(sid))[-1]
        cancelled = await wait_finished(client, sid, cancelled.id)
        assert (cancelled.status, cancelled.reason) == ("cancelled", "client_disconnected")


async def test_leaving_events_never_cancels_the_turn(start_server: ServerFactory) -> None:
    server = await start_server()
    async with Client(server.url) as client:
        sid = (await client.create_session()).id
        record = await client.detach(sid, TICKING)
        for transport in TRANSPORTS:
            async with client.events(sid, turn=record.id, transport=transport) as stream:
                await next_event(stream)
        done = await wait_finished(client, sid, record.id)
        assert (done.status, done.reason) == ("completed", "completed")


async def test_events_follow_across_turns_until_the_session_ends(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    server = await start_server(heartbeat=0.1)
    async with Client(server.url) as client:
        sid = (await client.create_session()).id
        seen: list[Event] = []
        ended = trio.Event()

        async def follow() -> None:
            async with client.events(sid, follow=True) as stream:
                async for event in stream:
                    seen.append(event)
            ended.set()

        nursery.start_soon(follow)
        one = [e async for e in (await _turn(client, sid, "one"))]
        two = [e async for e in (await _turn(client, sid, "two"))]
        with trio.fail_after(10):
            while len(seen) < len(one) + len(two):
                await trio.sleep(0.01)
        assert [e.json for e in seen] == [e.json for e in one + two]
        await trio.sleep(0.3)  # heartbeats only
        assert not ended.is_set()
        await client.end_session(sid)
        with trio.fail_after(10):
            await ended.wait()
        with pytest.raises(ValueError, match="follow"):
            async with client.events(sid, follow=True, transport="websocket"):
                pytest.fail("entered")


async def _turn(client: Client, session_id: str, text: str) -> AsyncIterator[Event]:
    """A whole turn's events (read before returning), as an async iterator."""
    async with client.turn(session_id, text) as events:
        got = await events_of(events)

    async def replay() -> AsyncIterator[Event]:
        for event in got:
            yield event

    return replay()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_export_is_the_concatenated_turns(
    start_server: ServerFactory, transport: Transport
) -> None:
    server = await start_server()
    async with Client(server.url) as client:
        sid = (await client.create_session()).id
        turns = []
        for text in ["one", script({"many": 50}, {"end": "completed"}), "three"]:
            async with client.turn(sid, text, transport=transport) as events:
                turns.append((await events_of(events), events))
        concatenated = [e for got, _ in turns for e in got]
        exported = await client.export(sid)
        assert [e.json for e in exported] == [e.json for e in concatenated]
        assert [e.raw for e in exported] == [e.raw for e in concatenated]
        assert_contiguous(exported, 1)
        assert all(e.last_event_id is None for e in exported)
        assert await client.export(sid, after=5) == exported[5:]
        second = (await client.list_turns(sid))[1]
        assert [e.json for e in await client.export(sid, turn=second.id)] == [
            e.json for e in turns[1][0]
        ]
        assert await client.export((await client.create_session()).id) == []
        with pytest.raises(BadRequestError, match="past the end"):
            await client.export(sid, after=10_000)
        with pytest.raises(NotFoundError):
            await client.export(sid, turn="t_nope")


async def test_refusals_of_events_raise_on_entering(start_server: ServerFactory) -> None:
    server = await start_server()
    async with Client(server.url) as client:
        sid = (await client.create_session()).id
        async with client.turn(sid, "one") as events:
            await events_of(events)
        for transport in TRANSPORTS:
            with pytest.raises(BadRequestError, match="past the end"):
                async with client.events(sid, after=99, transport=transport):
                    pytest.fail("entered")
            with pytest.raises(NotFoundError):
                async with client.events(sid, turn="t_nope", transport=transport):
                    pytest.fail("entered")
            with pytest.raises(NotFoundError):
                async with client.events("s_nope", transport=transport):
                    pytest.fail("entered")
        with pytest.raises(ValueError, match="after"):
            async with client.events(sid, after=-1):
                pytest.fail("entered")


async def test_an_expired_cursor_is_cursor_expired_error(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    server = await start_server(store=f"sqlite:{tmp_path / 's.db'}")
    async with Client(server.url) as client:
        sid = (await client.create_session()).id
        async with client.turn(sid, "old") as events:
            await events_of(events)
        old = events.turn_id
        assert old is not None
        # What the retention sweep does, with a cutoff between the two turns' ends (not
        # a short retention: under load the new turn's events expired too).
        between = datetime.now(UTC)
        async with client.turn(sid, "new") as events:
            new = await events_of(events)
        assert await server.manager.store.drop_events(between) == 3
        for transport in TRANSPORTS:
            with pytest.raises(CursorExpiredError) as expired:
                async with client.events(sid, transport=transport):
                    pytest.fail("entered")
            error = expired.value
            assert (error.code, error.reason, error.earliest_seq) == (410, "cursor_expired", 4)
            assert isinstance(error, APIError) and "no longer retained" in error.message
            with pytest.raises(CursorExpiredError):
                async with client.events(sid, turn=old, transport=transport):
                    pytest.fail("entered")
            # From the earliest retained seq on, the log is all there.
            assert error.earliest_seq is not None
            got = await read_log(client, sid, after=error.earliest_seq - 1, transport=transport)
            assert [e.json for e in got] == [e.json for e in new]
        with pytest.raises(CursorExpiredError) as exported:
            await client.export(sid)
        assert exported.value.earliest_seq == 4
        record = await client.get_turn(sid, old)
        assert (record.first_seq, record.last_seq) == (1, 3)


async def test_a_cancelled_read_loses_nothing(start_server: ServerFactory) -> None:
    """Over SSE a cancelled read closes the connection; the next one resumes after it."""
    server = await start_server()
    async with Client(server.url) as client:
        sid = (await client.create_session()).id
        record = await client.detach(sid, TICKING)
        got: list[Event] = []
        cancelled = 0
        with trio.fail_after(30):
            async with client.events(sid, turn=record.id) as stream:
                for i in itertools.count():
                    # Every third read is cancelled as soon as it has to wait.
                    with trio.move_on_after(0 if i % 3 == 0 else math.inf) as waited:
                        try:
                            got.append(await anext(stream))
                        except StopAsyncIteration:
                            break
                    cancelled += waited.cancelled_caught
        assert cancelled > 0 and stream.reconnects > 0, "the test must cancel some reads"
        assert_contiguous(got, 1)
        assert ticks(got) == list(range(TICKS))
        assert got[-1].end_reason == "completed"


# -- reconnecting through a cut: a TCP proxy --------------------------------------------


def server_port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def test_without_reconnect_a_cut_raises(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    server = await start_server()
    proxy = CuttingProxy(server_port(server.url), cut_after=12_000)
    await proxy.run(nursery)
    async with Client(server.url) as direct, Client(proxy.url) as client:
        sid = (await direct.create_session()).id
        record = await direct.detach(sid, TICKING)
        got: list[Event] = []
        with trio.fail_after(30), pytest.raises(StreamInterrupted, match="broke"):
            async with client.events(sid, turn=record.id, reconnect=False) as stream:
                async for event in stream:
                    got.append(event)
        assert got and stream.finished and stream.reconnects == 0
        # What was delivered is a prefix: resume from its last seq.
        rest = await read_log(direct, sid, after=stream.last_seq, turn=record.id)
        assert_contiguous(got + rest, 1)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_reconnect_gives_up_when_the_server_is_gone(
    start_server: ServerFactory, nursery: trio.Nursery, transport: Transport
) -> None:
    server = await start_server()
    proxy = CuttingProxy(server_port(server.url), cut_after=12_000)
    await proxy.run(nursery)
    policy = Reconnect(attempts=3, initial_delay=0.05, max_delay=0.1)
    start = 0.0
    async with Client(server.url) as direct, Client(proxy.url) as client:
        sid = (await direct.create_session()).id
        record = await direct.detach(sid, TICKING)
        got: list[Event] = []
        with trio.fail_after(30), pytest.raises(StreamInterrupted) as gave_up:
            async with client.events(
                sid, turn=record.id, transport=transport, reconnect=policy
            ) as stream:
                proxy.stop_accepting()  # the open connection goes on; new ones are refused
                async for event in stream:
                    got.append(event)
                    if proxy.cuts and not start:
                        start = trio.current_time()
        assert isinstance(gave_up.value, TransportError)
        assert "3 attempt(s) to re-open it failed" in str(gave_up.value)
        assert f"cut after seq {got[-1].seq}" in str(gave_up.value)
        assert isinstance(gave_up.value.__cause__, ConnectError)
        # It waited between attempts: 0.05 s, then 0.1 s (less up to 20 % jitter).
        assert trio.current_time() - start >= (0.05 + 0.1) * 0.8
        assert stream.finished and stream.last_seq == got[-1].seq
        assert_contiguous(got, 1)


async def test_reconnect_honours_retry_after_on_503(nursery: trio.Nursery) -> None:
    """A cut, then a 503 with Retry-After: 1, then the rest of the stream."""
    frames = [
        b'event: message\ndata: {"seq":%d,"v":1,"type":"message","data":{"i":%d}}\nid: %d\n\n'
        % (n, n, n)
        for n in range(1, 5)
    ]
    ended = b'event: session.ended\ndata: {"seq":5,"v":1,"type":"session.ended","data":{}}\n\n'
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"

    def chunk(data: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(data), data)

    busy = json.dumps(http_errors.error_body(503, "draining", "server is draining")).encode()
    answers = [
        # A cut: two whole frames and half of the third, no terminating chunk.
        head + b"\r\n" + chunk(frames[0] + frames[1] + frames[2][:20]),
        b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json"
        b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(busy), busy),
        head + b"Connection: close\r\n\r\n" + chunk(frames[2] + frames[3] + ended) + b"0\r\n\r\n",
    ]
    requests: list[tuple[float, bytes]] = []

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            request = b""
            while b"\r\n\r\n" not in request:
                request += await stream.receive_some(65536)
            requests.append((trio.current_time(), request))
            await stream.send_all(answers[len(requests) - 1])

    listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
    url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
    async with Client(url) as client:
        got = await read_log(client, "s_1", turn="t_1")
    assert [e.seq for e in got] == [1, 2, 3, 4, 5]
    assert len(requests) == 3
    assert requests[2][0] - requests[1][0] >= 1.0, "Retry-After: 1 was not honoured"
    for _, request in requests[1:]:
        assert b"last-event-id: 2\r\n" in request.lower()
        assert b"after=2&turn=t_1" in request


@pytest.mark.backends(*DURABLE)
async def test_follow_rides_out_a_server_restart(
    start_server: ServerFactory, nursery: trio.Nursery, backend_url: str
) -> None:
    """A stream open across a restart (each durable store): the events of both servers, in
    order."""
    db = backend_url
    first = await start_server(store=db, heartbeat=0.1)
    proxy = CuttingProxy(server_port(first.url), cut_after=10**9)
    await proxy.run(nursery)
    policy = Reconnect(attempts=50, initial_delay=0.05, max_delay=0.2)
    async with Client(proxy.url) as client:
        sid = (await client.create_session()).id
        async with client.turn(sid, "before") as events:
            before = await events_of(events)
        seen: list[Event] = []
        ended = trio.Event()
        streams: list[LogStream] = []

        async def follow() -> None:
            async with client.events(sid, follow=True, reconnect=policy) as stream:
                streams.append(stream)
                async for event in stream:
                    seen.append(event)
            ended.set()

        nursery.start_soon(follow)
        with trio.fail_after(10):
            while len(seen) < len(before):
                await trio.sleep(0.01)
        first.stop.drain.set()  # a graceful stop: the follow stream ends cleanly
        with trio.fail_after(30):
            await first.done.wait()
        second = await start_server(store=db, heartbeat=0.1)
        proxy.port = server_port(second.url)
        async with client.turn(sid, "after") as events:
            after = await events_of(events)
        with trio.fail_after(20):
            while len(seen) < len(before) + len(after):
                await trio.sleep(0.01)
        assert not ended.is_set()
        assert [e.json for e in seen] == [e.json for e in before + after]
        assert_contiguous(seen, 1)
        assert streams[0].reconnects >= 1
        await client.end_session(sid)
        with trio.fail_after(20):
            await ended.wait()


def test_reconnect_policy() -> None:
    policy = Reconnect(attempts=5, initial_delay=0.1, max_delay=1.0, jitter=0)
    assert [policy.delay(n) for n in range(1, 7)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert policy.delay(1, retry_after=3) == 3
    assert policy.delay(10_000) == 1.0
    jittery = Reconnect(initial_delay=1, max_delay=1, jitter=0.5)
    assert all(0.5 <= jittery.delay(1) <= 1 for _ in range(100))
    for bad in [
        {"attempts": 0},
        {"initial_delay": 2, "max_delay": 1},
        {"jitter": 2},
        {"read_timeout": 0},
    ]:
        with pytest.raises(ValueError):
            Reconnect(**bad)


def test_cursor_expired_from_the_envelope() -> None:
    body = http_errors.error_body(410, "cursor_expired", "gone", earliestSeq=42)
    error = from_response(410, {}, json.dumps(body).encode())
    assert isinstance(error, CursorExpiredError)
    assert (error.code, error.reason, error.message, error.earliest_seq) == (
        410,
        "cursor_expired",
        "gone",
        42,
    )
    from_body = from_error_object(body["error"])
    assert isinstance(from_body, CursorExpiredError) and from_body.earliest_seq == 42
    plain = from_response(410, {}, b"gone")
    assert isinstance(plain, CursorExpiredError) and plain.earliest_seq is None


def test_parse_event_array() -> None:
    a = '{"seq":1,"v":1,"type":"a","data":{"x":[1, 2]}}'
    b = '{"v":1,"type":"b","seq":2}'
    events = parse_event_array(f"[{a},{b}]\n")
    assert [(e.type, e.seq, e.raw) for e in events] == [("a", 1, a), ("b", 2, b)]
    assert parse_event_array(" [ ]\n") == []
    assert [e.raw for e in parse_event_array(f"[ {a} ,\n{b} ]")] == [a, b]
    for bad in ["", "{}", "[", f"[{a}", f"[{a},]", f"[{a}] x", f"[{a} {b}]", '[{"v":2}]']:
        with pytest.raises(ProtocolError):
            parse_event_array(bad)
