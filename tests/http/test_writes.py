"""What a response costs the socket: a JSON response is one write, a stream's head goes
out alone and at once, and nothing is written empty."""

from __future__ import annotations

import json

import pytest

from tests.helpers import Raw, ServerFactory, parse_sse
from trioserve.http._connections import Connection


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every socket write of every connection, in order."""
    written: list[bytes] = []
    original = Connection._send_all

    async def recording(self: Connection, data: bytes) -> None:
        written.append(bytes(data))
        await original(self, data)

    monkeypatch.setattr(Connection, "_send_all", recording)
    return written


async def test_a_json_response_is_one_write(
    start_server: ServerFactory, writes: list[bytes]
) -> None:
    server = await start_server()
    raw = await Raw.open(server.url)
    reply = await raw.request("POST", "/v1/sessions", b"{}")
    assert reply.status == 201
    (write,) = writes  # head and body together; no empty write for the end
    assert write.startswith(b"HTTP/1.1 201 Created\r\n")
    assert write.endswith(b"\r\n\r\n" + reply.body)

    writes.clear()  # a response with no body: its head, written when the end comes
    reply = await raw.request("HEAD", "/healthz")
    assert (reply.status, reply.body, reply.headers["content-length"]) == (200, b"", "3")
    (write,) = writes
    assert write.startswith(b"HTTP/1.1 200 OK\r\n") and write.endswith(b"\r\n\r\n")

    writes.clear()  # a refusal made by the protocol layer, with its body
    await raw.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n\r\n")
    reply = await raw.response()
    assert reply.status == 400
    (write,) = writes
    assert write.endswith(reply.body)


async def test_a_stream_s_head_goes_out_alone_and_nothing_is_written_empty(
    start_server: ServerFactory, writes: list[bytes]
) -> None:
    server = await start_server()
    session = (await server.create())["id"]
    writes.clear()
    raw = await Raw.open(server.url)
    body = json.dumps({"input": "hi"}).encode()
    reply = await raw.request("POST", f"/v1/sessions/{session}/turns", body)
    assert parse_sse(reply.body.decode())[-1].event == "session.ended"
    head, *rest = writes
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")
    assert b"event:" in rest[0]
    assert all(rest)
