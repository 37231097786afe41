"""No lock-out: one address, one tenant or a keyless client cannot take every connection.

Each test's clients come from their own loopback addresses (127.0.0.2,
127.0.0.3, ...: one host, but other client addresses to the server), so the
per-address cap is seen as it is on a network.
"""

from __future__ import annotations

import json

import h11
import trio
from trio_websocket import ConnectionRejected, open_websocket_url

from tests.helpers import (
    KEY_A,
    KEY_B,
    Raw,
    Reply,
    ServerFactory,
    auth,
    parse_reply,
    two_tenants,
)

KEYLESS, TENANT_A, TENANT_B, OTHER = "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"


async def test_one_address_over_its_cap_gets_429_and_others_are_served(
    start_server: ServerFactory,
) -> None:
    server = await start_server(max_connections_per_ip=3, keep_alive=60)
    held = [await Raw.open(server.url, source=KEYLESS) for _ in range(3)]
    for raw in held:
        assert (await raw.request("GET", "/healthz")).status == 200

    extra = await Raw.open(server.url, source=KEYLESS)
    reply = parse_reply(await extra.until_closed())  # answered without asking, then closed
    assert reply.status == 429
    assert reply.headers["connection"] == "close" and reply.headers["retry-after"] == "1"
    error = reply.error()
    assert error["reason"] == "address_connection_cap" and "3 connections" in error["message"]

    # Another address is served; the held connections are undisturbed.
    other = await Raw.open(server.url, source=OTHER)
    assert (await other.request("GET", "/healthz")).status == 200
    for raw in held:
        assert (await raw.request("GET", "/healthz")).status == 200

    # A slot the address frees is its own again.
    await held.pop().aclose()
    with trio.fail_after(10):
        while True:
            raw = await Raw.open(server.url, source=KEYLESS)
            if (await raw.request("GET", "/healthz")).status == 200:
                break
            await raw.aclose()  # the close was not seen yet
            await trio.sleep(0.05)


async def test_a_connection_is_closed_after_its_401(start_server: ServerFactory) -> None:
    server = await start_server(keys=two_tenants(), keep_alive=60)
    for headers in ([], [("Authorization", "Bearer ts_wrong")]):
        raw = await Raw.open(server.url)
        reply = await raw.request("GET", "/v1/sessions", headers=headers)
        assert (reply.status, reply.headers["connection"]) == (401, "close")
        assert await raw.until_closed() == b""
    # With a valid key the connection stays open for the next request.
    raw = await Raw.open(server.url)
    for _ in range(2):
        reply = await raw.request("GET", "/v1/sessions", headers=list(auth(KEY_A).items()))
        assert reply.status == 200 and "connection" not in reply.headers


async def _follow(server_url: str, session: str, key: str, source: str) -> tuple[Raw, int]:
    raw = await Raw.open(server_url, source=source)
    target = f"/v1/sessions/{session}/events?follow=true"
    reply = await raw.open_stream("GET", target, list(auth(key).items()))
    return raw, reply.status


async def test_a_tenant_holds_at_most_its_streams(start_server: ServerFactory) -> None:
    server = await start_server(keys=two_tenants(), max_streams_per_tenant=2, keep_alive=60)
    a = auth(KEY_A)
    session = (await server.client.post("/v1/sessions", headers=a)).json()["id"]
    held = []
    for _ in range(2):
        raw, status = await _follow(server.url, session, KEY_A, TENANT_A)
        assert status == 200
        held.append(raw)

    # A third stream of the tenant: an SSE read, a streamed turn, a WebSocket.
    resp = await server.client.get(f"/v1/sessions/{session}/events?follow=true", headers=a)
    assert resp.status_code == 429 and resp.json()["error"]["reason"] == "tenant_stream_cap"
    assert resp.headers["retry-after"] == "1"
    turn = await server.client.post(f"/v1/sessions/{session}/turns", json={"input": "x"}, headers=a)
    assert turn.status_code == 429 and turn.json()["error"]["reason"] == "tenant_stream_cap"
    turns = await server.client.get(f"/v1/sessions/{session}/turns", headers=a)
    assert turns.json() == [], "a refused stream starts no turn"
    ws = await Raw.open(server.url, source=TENANT_A)
    upgrade = [
        ("Connection", "Upgrade"),
        ("Upgrade", "websocket"),
        ("Sec-WebSocket-Version", "13"),
        ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
        *auth(KEY_A).items(),
    ]
    reply = await ws.request("GET", f"/v1/sessions/{session}/ws", headers=upgrade)
    assert reply.status == 429 and reply.error()["reason"] == "tenant_stream_cap"

    # What holds no stream still works: a detached turn, a JSON export.
    detached = await server.client.post(
        f"/v1/sessions/{session}/turns", json={"input": "x", "detach": True}, headers=a
    )
    assert detached.status_code == 202
    # The other tenant is not counted against the first.
    b = {"Authorization": f"Bearer {KEY_B}"}
    other = (await server.client.post("/v1/sessions", headers=b)).json()["id"]
    raw, status = await _follow(server.url, other, KEY_B, TENANT_B)
    assert status == 200

    # A stream that ends gives its slot back.
    await held.pop().aclose()
    with trio.fail_after(10):
        while True:
            raw, status = await _follow(server.url, session, KEY_A, TENANT_A)
            if status == 200:
                break
            await raw.aclose()
            await trio.sleep(0.05)


async def test_tenant_b_is_served_while_a_and_a_keyless_client_try_to_hold_everything(
    start_server: ServerFactory,
) -> None:
    """The issue's lock-out, both ways at once, with 20 connections in all: a keyless
    client opening idle connections (and reconnecting when cut) and tenant A opening
    follow streams, each from 25 tasks; tenant B still creates sessions and runs turns.
    """
    server = await start_server(
        keys=two_tenants(),
        max_connections=20,
        max_connections_per_ip=8,
        max_streams_per_tenant=5,
        keep_alive=60,
    )
    a = list(auth(KEY_A).items())
    session_a = (await server.client.post("/v1/sessions", headers=auth(KEY_A))).json()["id"]
    refused: dict[str, set[str]] = {"keyless": set(), "a": set()}

    def refusal(data: bytes) -> str:
        return str(parse_reply(data).error()["reason"])

    async def keyless() -> None:
        while True:  # an idle connection, held until the server closes it
            raw = await Raw.open(server.url, source=KEYLESS)
            if received := await raw.until_closed():
                refused["keyless"].add(refusal(received))
            await raw.aclose()
            await trio.sleep(0.01)

    async def tenant_a() -> None:
        target = f"/v1/sessions/{session_a}/events?follow=true"
        while True:  # a follow stream, or an idle connection if refused one
            raw = await Raw.open(server.url, source=TENANT_A)
            try:
                reply = await raw.open_stream("GET", target, a)
            except (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError):
                reply = None  # closed at once: more refusals in flight than the server sends
            if reply is not None and reply.status != 200:
                body = await raw.read_body()
                refused["a"].add(Reply(reply.status, reply.headers, body).error()["reason"])
            await raw.until_closed()
            await raw.aclose()
            await trio.sleep(0.01)

    async with trio.open_nursery() as attackers:
        for _ in range(25):
            attackers.start_soon(keyless)
            attackers.start_soon(tenant_a)
        with trio.fail_after(20):
            while not (refused["keyless"] and refused["a"]):
                await trio.sleep(0.05)
        # Both are at their caps and keep trying; B is served meanwhile.
        b = list(auth(KEY_B).items())
        client_b = await Raw.open(server.url, source=TENANT_B)
        for _ in range(3):
            created = await client_b.request("POST", "/v1/sessions", b"{}", b)
            assert created.status == 201, created
            url = f"/v1/sessions/{json.loads(created.body)['id']}/turns"
            reply = await client_b.request("POST", url, json.dumps({"input": "hi"}).encode(), b)
            assert reply.status == 200, reply
            assert b"session.ended" in reply.body
        await client_b.aclose()
        attackers.cancel_scope.cancel()
    assert refused["keyless"] == {"address_connection_cap"}
    assert "tenant_stream_cap" in refused["a"]
    assert refused["a"] <= {"tenant_stream_cap", "address_connection_cap"}


async def test_a_closed_websocket_frees_its_slot_before_the_next_ping(
    start_server: ServerFactory,
) -> None:
    # Two connections per address (the test's HTTP client holds one), and pings a
    # minute apart: a closed WebSocket's slot must be free long before its ping task
    # would have woken.
    server = await start_server(max_connections_per_ip=2, heartbeat=60, keep_alive=60)
    session = (await server.create())["id"]
    url = server.url.replace("http://", "ws://") + f"/v1/sessions/{session}/ws"
    for _ in range(3):
        with trio.fail_after(10):
            while True:
                try:
                    async with open_websocket_url(url, disconnect_timeout=5) as ws:
                        await ws.send_message('{"type":"ping"}')
                        assert json.loads(await ws.get_message())["type"] == "trioserve.pong"
                    break
                except ConnectionRejected as refused:  # the previous close not seen yet
                    assert refused.status_code == 429
                    await trio.sleep(0.05)
