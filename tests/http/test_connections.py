"""Connection discipline over raw sockets: closing, keep-alive, caps, refusals below the app.

httpx hides when a connection closes, so these tests speak HTTP/1.1 over
their own TCP streams (h11 frames the requests they mean to be valid).  A
deadline in them is only a hang guard: the behaviour under test is that the
server closes the connection at all.
"""

from __future__ import annotations

import json
import os
import resource
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio
from hypercorn.config import Config as HypercornConfig
from trio_websocket import open_websocket_url

from tests.helpers import (
    GUARD,
    Raw,
    ServerFactory,
    fake_adapters,
    parse_reply,
    parse_sse,
    run_cli,
    script,
    start_cli_server,
    write_spec,
)
from trioserve.http import auto_max_connections
from trioserve.http._connections import serve_http
from trioserve.sessions._limits import Limits

# -- closing ------------------------------------------------------------------


async def test_connection_close_closes_after_the_response(start_server: ServerFactory) -> None:
    server = await start_server()
    raw = await Raw.open(server.url)
    reply = await raw.request("GET", "/healthz", headers=[("Connection", "close")])
    assert (reply.status, reply.body) == (200, b"ok\n")
    assert await raw.until_closed() == b""

    # A streamed turn read to EOF, as `curl -N` does.
    session = await server.create()
    raw = await Raw.open(server.url)
    body = json.dumps({"input": "hi"}).encode()
    url = f"/v1/sessions/{session['id']}/turns"
    reply = await raw.request("POST", url, body, headers=[("Connection", "close")])
    assert reply.status == 200
    assert parse_sse(reply.body.decode())[-1].event == "session.ended"
    assert await raw.until_closed() == b""


async def test_idle_connections_close_after_the_keep_alive(start_server: ServerFactory) -> None:
    server = await start_server(keep_alive=1.0)
    silent = await Raw.open(server.url)  # never sends a byte
    assert await silent.until_closed() == b""

    raw = await Raw.open(server.url)
    for _ in range(3):  # the connection serves the next request, then times out again
        reply = await raw.request("GET", "/healthz")
        assert (reply.status, reply.body) == (200, b"ok\n")
        assert "connection" not in reply.headers
    assert await raw.until_closed() == b""


async def test_a_slow_request_head_is_cut_at_the_keep_alive(start_server: ServerFactory) -> None:
    server = await start_server(keep_alive=1.0)
    raw = await Raw.open(server.url)
    assert (await raw.request("GET", "/healthz")).status == 200
    await raw.send(b"GET /healthz HTTP/1.1\r\nHost: test\r\n")

    async def trickle() -> None:
        try:
            while True:  # a header name, one byte at a time, never finished
                await raw.send(b"x")
                await trio.sleep(0.1)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trickle)
        assert await raw.until_closed() == b""  # closed, never answered
        nursery.cancel_scope.cancel()


async def test_a_client_that_stops_reading_is_cut_off_and_its_turn_cancelled(
    start_server: ServerFactory,
) -> None:
    server = await start_server(write_timeout=0.5, warm_adapters=0)
    session = (await server.create())["id"]
    raw = await Raw.open(server.url, receive_buffer=4096)
    # 12 MB of events, more than the socket buffers hold, then the adapter waits.
    steps = script(*[{"big": 1_000_000}] * 12, {"hang": True})
    body = json.dumps({"input": steps}).encode()
    url = f"/v1/sessions/{session}/turns"
    await raw.send(raw.head("POST", url, f"Content-Length: {len(body)}") + body)  # never read
    try:
        # The stuck write is given up: the client counts as gone, so its turn is cancelled.
        with trio.fail_after(GUARD):
            while True:
                turns = (await server.client.get(url)).json()
                if turns and turns[0]["status"] != "running":
                    break
                await trio.sleep(0.05)
        assert (turns[0]["status"], turns[0]["reason"]) == ("cancelled", "client_disconnected")
        with trio.fail_after(GUARD):
            while fake_adapters():
                await trio.sleep(0.05)
        # The connection was aborted: what was in flight, then a reset (no hang).
        received = await raw.until_closed()
        assert received.startswith(b"HTTP/1.1 200 OK\r\n")
        assert len(received) < 12_000_000
    finally:
        await raw.aclose()  # without the fix, this is what unblocks the server
    # The session takes its next turn.
    frames = await server.turn(session, script({"end": "completed"}))
    assert frames[-1].data["data"]["reason"] == "completed"


async def test_a_response_the_socket_cannot_take_at_once_arrives_whole(
    start_server: ServerFactory,
) -> None:
    """A write is tried at once (no wait), and what the socket did not take is written
    as the client reads: 4 MB of events to a client with a small buffer that reads late."""
    server = await start_server(warm_adapters=0)
    session = (await server.create())["id"]
    raw = await Raw.open(server.url, receive_buffer=4096)
    try:
        steps = script(*[{"big": 1_000_000}] * 4, {"end": "completed"})
        body = json.dumps({"input": steps}).encode()
        fields = f"Content-Length: {len(body)}", "Content-Type: application/json"
        await raw.send(raw.head("POST", f"/v1/sessions/{session}/turns", *fields) + body)
        await trio.sleep(0.5)  # the server's writes meet a full socket: in parts, then waits
        reply = await raw.response()
    finally:
        await raw.aclose()
    assert reply.status == 200
    frames = parse_sse(reply.body.decode())
    kinds = ["session.started", *["message"] * 4, "session.ended"]
    assert [f.event for f in frames] == kinds
    assert [len(f.data["data"]["content"]) for f in frames[1:5]] == [1_000_000] * 4
    assert [f.seq for f in frames] == list(range(frames[0].seq, frames[0].seq + 6))


async def test_keep_alive_does_not_cut_long_responses(start_server: ServerFactory) -> None:
    server = await start_server(keep_alive=0.5, heartbeat=0)
    session = await server.create()
    frames = await server.turn(session["id"], script({"sleep": 1.5}, {"end": "completed"}))
    assert frames[-1].data["data"]["reason"] == "completed"

    ws_url = server.url.replace("http://", "ws://", 1) + f"/v1/sessions/{session['id']}/ws"
    async with open_websocket_url(ws_url, disconnect_timeout=5) as ws:
        await trio.sleep(1.5)  # idle past the keep-alive: a WebSocket is a request in flight
        await ws.send_message(json.dumps({"type": "ping"}))
        with trio.fail_after(GUARD):
            assert json.loads(await ws.get_message())["type"] == "trioserve.pong"


# -- refusals below the application -----------------------------------------------


async def test_content_length_with_transfer_encoding_is_400_and_closed(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    raw = await Raw.open(server.url)
    smuggled = b"POST /v1/sessions HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\n\r\n"
    await raw.send(
        b"POST /v1/sessions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        b"Content-Length: 7\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\n{}\r\n0\r\n\r\n" + smuggled
    )
    reply = parse_reply(await raw.until_closed())
    assert reply.status == 400 and reply.headers["connection"] == "close"
    error = reply.error()
    assert error["reason"] == "bad_request"
    assert "Content-Length" in error["message"] and "Transfer-Encoding" in error["message"]
    assert reply.rest == b""  # one answer, then the close: the rest was never served
    assert (await server.client.get("/v1/sessions")).json() == []


async def test_paths_with_empty_segments_are_404(start_server: ServerFactory) -> None:
    server = await start_server()
    raw = await Raw.open(server.url)
    for method, target in [
        ("GET", "/v1//sessions"),
        ("GET", "//v1/sessions"),
        ("POST", "/v1//sessions"),
        ("POST", "//v1/sessions"),
        ("GET", "/v1/sessions//"),
    ]:
        reply = await raw.request(method, target, b"{}" if method == "POST" else b"")
        assert reply.status == 404, (target, reply)
        assert "location" not in reply.headers
        error = reply.error()
        assert error["reason"] == "route_not_found"
        assert target in error["message"]
    assert (await server.client.get("/v1/sessions")).json() == []


async def test_an_oversized_request_head_is_431(start_server: ServerFactory) -> None:
    server = await start_server()
    raw = await Raw.open(server.url)
    # Over 64 KiB and still no end of the head.
    await raw.send(b"GET /healthz HTTP/1.1\r\nHost: test\r\nX-Big: " + b"a" * 70_000)
    reply = parse_reply(await raw.until_closed())
    assert reply.status == 431 and reply.headers["connection"] == "close"
    error = reply.error()
    assert error["reason"] == "headers_too_large"
    assert "65536 bytes" in error["message"]


async def test_a_complete_request_head_over_the_limit_is_431(start_server: ServerFactory) -> None:
    server = await start_server()
    raw = await Raw.open(server.url)
    # 70,000 bytes in two writes: the head is never incomplete and over 64 KiB at once.
    head = raw.head("GET", "/healthz", "X-Big: " + "a" * 70_000)
    await raw.send(head[:40_000])
    await raw.send(head[40_000:])
    reply = parse_reply(await raw.until_eof())
    assert reply.status == 431 and reply.headers["connection"] == "close"
    error = reply.error()
    assert error["reason"] == "headers_too_large" and "65536 bytes" in error["message"]
    assert reply.rest == b""

    # Just under the limit is served.
    raw = await Raw.open(server.url)
    filler = 65_536 - len(raw.head("GET", "/healthz", "X-Big: "))
    reply = await raw.request("GET", "/healthz", headers=[("X-Big", "a" * filler)])
    assert (reply.status, reply.body) == (200, b"ok\n")


async def test_refusals_reach_a_client_still_sending(start_server: ServerFactory) -> None:
    """The server answers before the request is in, then lets the client finish sending."""
    server = await start_server()  # --max-body-bytes 1MiB
    body = b"[" + b" " * (2 * 1024 * 1024) + b"]"
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    cases = [
        (("Content-Type: application/json", f"Content-Length: {len(body)}"), body, 413),
        (("Content-Type: application/json", "Transfer-Encoding: chunked"), chunked, 413),
        ((f"X-Big: {'a' * 2 * 1024 * 1024}",), b"", 431),  # refused by h11 at 64 KiB
    ]
    for fields, payload, code in cases:
        raw = await Raw.open(server.url)
        with trio.fail_after(GUARD):
            # As curl does: the whole request, then the answer; no reset on the way.
            await raw.send(raw.head("POST", "/v1/sessions", *fields) + payload)
        reply = parse_reply(await raw.until_eof())
        assert reply.status == code and reply.headers["connection"] == "close", reply
        assert reply.error()["reason"] == {413: "payload_too_large", 431: "headers_too_large"}[code]
        assert reply.rest == b""
        await raw.aclose()
    assert (await server.client.get("/v1/sessions")).json() == []


async def test_malformed_requests_get_the_envelope(start_server: ServerFactory) -> None:
    server = await start_server()
    cases = [
        (b"GET /he llo HTTP/1.1\r\nHost: t\r\n\r\n", 400, "bad_request", "request line"),
        (b"GET /healthz HTTP/1.1\r\nBad Header: 1\r\n\r\n", 400, "bad_request", "header"),
        (b"GET /healthz HTTP/1.1\r\n\r\n", 400, "bad_request", "Host"),
        (
            b"POST /v1/sessions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n",
            501,
            "not_implemented",
            "chunked",
        ),
    ]
    for request, code, reason, needle in cases:
        raw = await Raw.open(server.url)
        await raw.send(request)
        reply = parse_reply(await raw.until_closed())
        assert reply.status == code and reply.headers["connection"] == "close", reply
        error = reply.error()
        assert error["reason"] == reason and needle in error["message"], error


async def test_an_http2_upgrade_is_ignored(start_server: ServerFactory) -> None:
    server = await start_server()
    raw = await Raw.open(server.url)
    upgrade = [
        ("Connection", "Upgrade, HTTP2-Settings"),
        ("Upgrade", "h2c"),
        ("HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA"),
    ]
    reply = await raw.request("GET", "/healthz", headers=upgrade)
    assert (reply.status, reply.body) == (200, b"ok\n")


async def test_an_app_that_ends_without_a_response_gets_a_500_envelope(
    nursery: trio.Nursery,
) -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
        # an HTTP request: no response at all

    config = HypercornConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    stop = trio.Event()
    binds = await nursery.start(
        partial(serve_http, app, config, 0, write_timeout=30, shutdown_trigger=stop.wait)
    )
    raw = await Raw.open(binds[0])
    reply = await raw.request("GET", "/")
    assert reply.status == 500
    assert reply.error()["reason"] == "internal"
    stop.set()


# -- the connection cap ---------------------------------------------------------


async def test_connections_over_the_cap_get_503_and_are_closed(
    start_server: ServerFactory,
) -> None:
    server = await start_server(max_connections=3, keep_alive=60)
    held = [await Raw.open(server.url) for _ in range(3)]
    session = json.loads((await held[0].request("POST", "/v1/sessions", b"{}")).body)["id"]
    follow = f"/v1/sessions/{session}/events?follow=true"
    for raw in held:  # each holds a request in progress: none is idle, none is evicted
        assert (await raw.open_stream("GET", follow)).status == 200

    extra = await Raw.open(server.url)
    reply = parse_reply(await extra.until_closed())  # answered without asking
    assert reply.status == 503
    assert reply.headers["connection"] == "close" and reply.headers["retry-after"] == "1"
    error = reply.error()
    assert error["reason"] == "too_many_connections" and "3 connections" in error["message"]

    # A client that sends its request first reads the same answer.
    extra = await Raw.open(server.url)
    assert (await extra.request("GET", "/healthz")).status == 503

    # A freed slot serves again; the others were never disturbed.
    await held.pop().aclose()
    with trio.fail_after(GUARD):
        while True:
            raw = await Raw.open(server.url)
            reply = await raw.request("GET", "/healthz")
            if reply.status == 200:
                break
            await raw.aclose()  # the close was not seen yet
            await trio.sleep(0.05)
    assert (await raw.request("DELETE", f"/v1/sessions/{session}")).status == 204
    for follower in held:  # their streams end with the session; then they serve again
        await follower.read_body()
        follower.h11.start_next_cycle()
        assert (await follower.request("GET", "/healthz")).status == 200


def test_auto_max_connections_keeps_descriptors_for_adapters() -> None:
    cores = len(os.sched_getaffinity(0))  # the pool's default maximum: one per core
    limits = Limits(max_concurrent_turns=8, warm_adapters=1)
    assert auto_max_connections(limits, 1024) == 1024 - 4 * (8 + max(1, cores)) - 64
    assert auto_max_connections(Limits(max_concurrent_turns=0, warm_adapters=2), 1024) == (
        (1024 - 4 * max(2, cores) - 64) // 2
    )
    fixed = Limits(max_concurrent_turns=8, warm_adapters=1, warm_adapters_max=1)
    assert auto_max_connections(fixed, 1024) == 1024 - 4 * 9 - 64
    off = Limits(max_concurrent_turns=8, warm_adapters=0)
    assert auto_max_connections(off, 1024) == 1024 - 4 * 8 - 64
    grown = Limits(max_concurrent_turns=8, warm_adapters=1, warm_adapters_max=4)
    assert auto_max_connections(grown, 1024) == 1024 - 4 * 12 - 64  # the pool's maximum
    assert auto_max_connections(limits, 64) == 1  # far too few: one, with the fds it has
    assert auto_max_connections(limits, None) == 0  # no limit, no cap


def test_bad_connection_flags_are_one_line(tmp_path: Path) -> None:
    spec = str(write_spec(tmp_path, runtime="echo"))
    for args, needle in [
        (["--keep-alive", "0"], "argument --keep-alive: must be more than 0, got '0'"),
        (["--keep-alive", "soon"], "argument --keep-alive: invalid duration 'soon'"),
        (["--write-timeout", "0"], "argument --write-timeout: must be more than 0, got '0'"),
        (
            ["--max-connections", "-1"],
            "argument --max-connections: expected a whole number or auto",
        ),
        (["--max-connections", "lots"], "expected a whole number or auto, got 'lots'"),
    ]:
        result = run_cli(tmp_path, "run", spec, "--in-memory", "--port", "0", *args)
        assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
        assert needle in result.stderr, result.stderr


# -- under a low RLIMIT_NOFILE, as a real process ------------------------------------


def _nofile(limit: int) -> Any:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    return apply


async def _turn(client: httpx.AsyncClient, steps: str) -> str:
    session = (await client.post("/v1/sessions")).json()["id"]
    resp = await client.post(f"/v1/sessions/{session}/turns", json={"input": steps}, timeout=60)
    assert resp.status_code == 200, resp.text
    ended = parse_sse(resp.text)[-1]
    assert ended.event == "session.ended", resp.text
    return str(ended.data["data"]["reason"])


async def test_the_default_cap_leaves_descriptors_for_turns(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    nofile = 128
    args = ["--max-concurrent-turns", "2", "--warm-adapters", "1", "--keep-alive", "60s"]
    server = await start_cli_server(
        nursery, tmp_path, write_spec(tmp_path), *args, preexec_fn=_nofile(nofile)
    )
    cap = auto_max_connections(Limits(max_concurrent_turns=2, warm_adapters=1), nofile)
    assert f"at most {cap} connections" in server.log

    held: list[Raw] = []
    for _ in range(cap):  # fill every slot
        raw = await Raw.open(server.url)
        assert (await raw.request("GET", "/healthz")).status == 200
        held.append(raw)
    # Full: one more is served once the connection idle longest is closed for it.
    extra = await Raw.open(server.url)
    assert (await extra.request("GET", "/healthz")).status == 200
    assert await held.pop(0).until_closed() == b""

    # Two turns at once, on connections of the full server: their adapters start.
    async def turn(raw: Raw) -> None:
        body = json.dumps({"inputs": {}}).encode()
        session = json.loads((await raw.request("POST", "/v1/sessions", body)).body)["id"]
        steps = json.dumps({"input": script({"sleep": 0.5}, {"end": "completed"})}).encode()
        reply = await raw.request("POST", f"/v1/sessions/{session}/turns", steps)
        assert reply.status == 200, reply
        frames = parse_sse(reply.body.decode())
        assert [f.data["data"].get("reason") for f in frames[-1:]] == ["completed"], frames

    async with trio.open_nursery() as turns:
        turns.start_soon(turn, held[0])
        turns.start_soon(turn, held[1])
    assert "EMFILE" not in server.log and "Traceback" not in server.log
    for raw in held:
        await raw.aclose()
    server.signal()
    assert await server.wait() == 0


async def test_running_out_of_descriptors_is_logged_once_a_second_and_recovers(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    args = ["--max-connections", "0", "--keep-alive", "60s", "--warm-adapters", "1"]
    server = await start_cli_server(
        nursery, tmp_path, write_spec(tmp_path), *args, preexec_fn=_nofile(64)
    )
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    held = [await trio.open_tcp_stream(host, int(port)) for _ in range(80)]
    with trio.fail_after(GUARD):
        while "EMFILE" not in server.log:
            await trio.sleep(0.05)
    start = trio.current_time()
    await trio.sleep(2.5)  # the accept loop retries every 0.1 s meanwhile
    lines = [line for line in server.log.splitlines() if "EMFILE" in line]
    assert 1 <= len(lines) <= (trio.current_time() - start) + 2, lines
    assert "Traceback" not in server.log

    for stream in held:
        await stream.aclose()
    async with httpx.AsyncClient(base_url=server.url, timeout=GUARD) as client:
        with trio.fail_after(GUARD):
            assert (await client.get("/healthz")).text == "ok\n"
        assert await _turn(client, script({"end": "completed"})) == "completed"
    assert "accepting connections again" in server.log
    assert "Traceback" not in server.log
    server.signal()
    assert await server.wait() == 0
