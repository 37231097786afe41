"""Clients that half-close (RFC 9112 §9.6) and clients that leave mid-request.

A client that shuts down its sending side after a whole request gets its
whole response, a turn's stream included; a client that closed the socket
altogether is still found gone at once; one that leaves before any answer
is logged and counted as ``499``, never ``500``.
"""

from __future__ import annotations

import json
import logging

import pytest
import trio

from tests.helpers import Raw, ServerFactory, parse_reply, script

# RFC 9112 §9.6: the whole response is read after our FIN.


async def test_a_half_closed_client_gets_its_whole_response(start_server: ServerFactory) -> None:
    server = await start_server()
    for _ in range(20):  # before, the body or the whole answer was lost now and then
        raw = await Raw.open(server.url)
        await raw.send(raw.head("GET", "/healthz"))
        await raw.stream.send_eof()
        reply = parse_reply(await raw.until_eof())
        assert (reply.status, reply.body, reply.rest) == (200, b"ok\n", b"")
        await raw.aclose()

    raw = await Raw.open(server.url)
    await raw.send(raw.head("POST", "/v1/sessions", "Content-Length: 2") + b"{}")
    await raw.stream.send_eof()
    reply = parse_reply(await raw.until_eof())
    assert reply.status == 201 and json.loads(reply.body)["status"] == "active"


async def test_a_half_closed_client_gets_its_whole_turn(start_server: ServerFactory) -> None:
    server = await start_server()
    session = (await server.create())["id"]
    steps = script({"event": "message", "data": {"n": 1}}, {"sleep": 0.3}, {"end": "completed"})
    body = json.dumps({"input": steps}).encode()
    raw = await Raw.open(server.url)
    head = raw.head("POST", f"/v1/sessions/{session}/turns", f"Content-Length: {len(body)}")
    await raw.send(head + body)
    await raw.stream.send_eof()
    received = await raw.until_eof()  # the server closes once the stream is done
    assert received.startswith(b"HTTP/1.1 200 OK\r\n")
    stream = received.partition(b"\r\n\r\n")[2]
    assert b"event: message" in stream and b"event: session.ended" in stream
    turns = (await server.client.get(f"/v1/sessions/{session}/turns")).json()
    assert [(t["status"], t["reason"]) for t in turns] == [("completed", "completed")]


async def test_a_client_that_closed_is_still_found_gone_at_once(
    start_server: ServerFactory,
) -> None:
    # A turn that prints one event and then nothing: only the probe can find the client
    # gone before the heartbeat (an hour away here).
    server = await start_server(heartbeat=3600)
    session = (await server.create())["id"]
    steps = script({"event": "message", "data": {"n": 1}}, {"hang": True})
    body = json.dumps({"input": steps}).encode()
    raw = await Raw.open(server.url)
    head = raw.head("POST", f"/v1/sessions/{session}/turns", f"Content-Length: {len(body)}")
    await raw.send(head + body)
    received = b""
    with trio.fail_after(10):
        while b"event: message" not in received:
            received += await raw.stream.receive_some(65536)
    await raw.aclose()  # a FIN, like a half-close; then a reset for the probe
    url = f"/v1/sessions/{session}/turns"
    with trio.fail_after(10):
        while (turns := (await server.client.get(url)).json())[0]["status"] == "running":
            await trio.sleep(0.05)
    assert (turns[0]["status"], turns[0]["reason"]) == ("cancelled", "client_disconnected")


# A client that leaves before its answer: 499, not 500.


@pytest.mark.parametrize("leaves", ["closes", "half-closes"])
async def test_a_client_that_leaves_mid_body_is_a_499(
    start_server: ServerFactory, caplog: pytest.LogCaptureFixture, leaves: str
) -> None:
    caplog.set_level(logging.INFO, logger="trioserve.access")
    server = await start_server()
    raw = await Raw.open(server.url)
    await raw.send(raw.head("POST", "/v1/sessions", "Content-Length: 100") + b'{"inp')
    if leaves == "closes":
        await raw.aclose()
    else:
        await raw.stream.send_eof()
        await raw.until_closed()  # whatever the server says of the cut request
    metrics = server.manager.metrics
    with trio.fail_after(10):
        while not metrics.client_aborts._value.get():
            await trio.sleep(0.02)
    lines = [r.getMessage() for r in caplog.records if r.name == "trioserve.access"]
    assert [line.split(" status=")[1].split()[0] for line in lines] == ["499"], lines
    assert (await server.client.get("/healthz")).status_code == 200
