"""A response written by ``_h11_writes`` is byte for byte what hypercorn and h11 wrote,
and a head h11 would refuse is still refused by h11."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import h11
import pytest
from hypercorn.config import Config
from hypercorn.events import RawData
from hypercorn.protocol.events import Body, EndBody, Response

from tests.helpers import Raw, ServerFactory, parse_sse
from trioserve.http import _h11_writes as writes
from trioserve.http._hypercorn_fixes import _send_with_reason

Headers = list[tuple[bytes, bytes]]
Send = Callable[[Any, Any], Awaitable[None]]


class _Protocol:
    """The parts of hypercorn's ``H11Protocol`` that ``stream_send`` uses, on a real h11
    connection that has read ``request``."""

    _send_h11_event = _send_with_reason

    def __init__(self, request: bytes = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n") -> None:
        self.connection = h11.Connection(h11.SERVER)
        self.connection.receive_data(request)
        while type(self.connection.next_event()) is not h11.EndOfMessage:
            pass
        self.config = Config()
        self.keep_alive_requests = 1
        self.written = b""

    async def send(self, event: RawData) -> None:
        self.written += event.data


async def _response(send: Send, headers: Headers, chunks: list[bytes], **kw: Any) -> bytes:
    protocol = _Protocol(**kw)
    await send(protocol, Response(stream_id=1, status_code=200, headers=headers))
    for chunk in chunks:
        await send(protocol, Body(stream_id=1, data=chunk))
    await send(protocol, EndBody(stream_id=1))
    return protocol.written


def _original() -> Send:
    return writes._stream_send  # hypercorn's own


@pytest.mark.parametrize(
    ("headers", "chunks"),
    [
        ([(b"content-type", b"text/event-stream"), (b"x-trioserve-turn", b"t_1")], [b"a", b""]),
        ([(b"content-type", b"application/json"), (b"content-length", b"2")], [b"{}"]),
        ([(b"x-empty", b""), (b"x-tab", b"a\tb")], [b"event: x\ndata: {}\n\n", b"z" * 70_000]),
    ],
)
async def test_the_same_bytes_as_hypercorn_and_h11(headers: Headers, chunks: list[bytes]) -> None:
    ours = await _response(writes.stream_send, headers, chunks)
    theirs = await _response(_original(), headers, chunks)
    date = next(line for line in theirs.split(b"\r\n") if line.startswith(b"date: "))
    ours = b"\r\n".join(
        date if line.startswith(b"date: ") else line for line in ours.split(b"\r\n")
    )
    assert ours == theirs
    assert ours.startswith(b"HTTP/1.1 200 OK\r\n")


async def test_a_head_request_gets_no_body_either_way() -> None:
    request = b"HEAD / HTTP/1.1\r\nHost: a\r\n\r\n"
    headers = [(b"content-type", b"text/event-stream")]
    ours = await _response(writes.stream_send, headers, [], request=request)
    theirs = await _response(_original(), headers, [], request=request)
    assert ours.split(b"date: ")[0] == theirs.split(b"date: ")[0]
    assert ours.endswith(b"Transfer-Encoding: chunked\r\n\r\n")


@pytest.mark.parametrize(
    "headers",
    [
        [(b"x-bad", b"a\r\nset-cookie: b")],
        [(b"x-bad", b"a\nb")],
        [(b"x-bad", b"nul\x00")],
        [(b"x-bad", b" leading")],
        [(b"x-bad", b"trailing\t")],
        [(b"bad name", b"v")],
        [(b"bad:name", b"v")],
        [(b"", b"v")],
    ],
)
async def test_a_head_h11_refuses_is_still_refused(headers: Headers) -> None:
    assert not writes.headers_ok(headers)
    with pytest.raises(h11.LocalProtocolError):
        await _response(writes.stream_send, headers, [])


def test_a_good_head_passes_the_one_check() -> None:
    assert writes.headers_ok([])
    assert writes.headers_ok([(b"a", b""), (b"b-c", b"x y\tz"), (b"d", b"\x80\xff")])


async def test_a_turn_stream_reads_back_through_h11(start_server: ServerFactory) -> None:
    """A real turn's response, read by h11 as a client would: one head, its chunks, an end."""
    server = await start_server()
    raw = await Raw.open(server.url)
    created = await raw.request("POST", "/v1/sessions", b"{}")
    session = json.loads(created.body)["id"]
    reply = await raw.request("POST", f"/v1/sessions/{session}/turns", b'{"input":"hi"}')
    assert reply.status == 200
    assert reply.headers["transfer-encoding"] == "chunked"
    assert "date" in reply.headers
    events = parse_sse(reply.body.decode())
    assert [e.event for e in events][-1] == "session.ended"
