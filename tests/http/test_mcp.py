"""The MCP face: the ``mcp`` SDK's own client, unmodified, against a real server on 127.0.0.1.

Both of the SDK's eras are driven (``auto``: the 2026-07-28 per-request
envelope; ``legacy``: the ``initialize`` handshake with ``Mcp-Session-Id``
sessions); the turns are the fake adapter's scripts (in-process) and, in
one test, the built-in echo adapter as a process.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import mcp_types as types
import pytest
import trio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.helpers import (
    KEY_A,
    KEY_B,
    Server,
    ServerFactory,
    auth,
    compiled_spec,
    parse_sse,
    script,
    two_tenants,
)

MODES = ["auto", "legacy"]
ECHO_ADAPTER = [sys.executable, "-m", "trioserve.runtime.echo_adapter"]
JSONRPC = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


@asynccontextmanager
async def mcp_client(
    server: Server, mode: str = "auto", key: str | None = None
) -> AsyncIterator[Client]:
    """The SDK's client of ``server``'s ``/mcp`` (with ``key``'s ``Authorization``)."""
    headers = auth(key) if key is not None else None
    async with httpx2.AsyncClient(headers=headers, timeout=120) as http:
        transport = streamable_http_client(f"{server.url}/mcp", http_client=http)
        async with Client(transport, mode=mode) as client:
            yield client


class Progress:
    """The progress notifications of one call: each message is logged events' JSON, one a
    line (a notification per batch the log hands over)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.counts: list[float] = []
        self.arrived = trio.Event()

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        assert message is not None
        self.counts.append(progress)
        self.events += [json.loads(line) for line in message.split("\n")]
        assert progress == len(self.events)  # the place in the turn of the last event
        self.arrived.set()


@pytest.mark.parametrize("mode", MODES)
async def test_the_tool_runs_a_turn_with_its_events_as_progress(
    start_server: ServerFactory, mode: str
) -> None:
    server = await start_server()
    async with mcp_client(server, mode) as client:
        listed = await client.list_tools()
        [tool] = listed.tools
        assert tool.name == "test-agent"
        assert tool.input_schema["required"] == ["message"]
        progress = Progress()
        result = await client.call_tool(
            "test-agent", {"message": "hello"}, progress_callback=progress
        )
        assert not result.is_error
        assert [c.text for c in result.content if isinstance(c, types.TextContent)] == [
            "echo: hello"
        ]
        out = result.structured_content
        assert out is not None and out["reply"] == "echo: hello"
        assert out["status"] == "completed" and out["reason"] == "completed"
        sid, tid = out["sessionId"], out["turnId"]
        # Every event of the turn, in order, the progress counting them; the last seq is the
        # result's.
        assert [e["type"] for e in progress.events] == [
            "session.started",
            "message",
            "session.ended",
        ]
        assert progress.counts == sorted(set(progress.counts)) and progress.counts[-1] == 3
        assert [e["seq"] for e in progress.events] == [1, 2, 3] and out["lastSeq"] == 3
        assert all(e["sessionId"] == sid for e in progress.events)

        # The same session and turn over the v0.8 API: one log, one cursor.
        record = (await server.client.get(f"/v1/sessions/{sid}/turns/{tid}")).json()
        assert record["status"] == "completed" and record["input"] == "hello"
        log = parse_sse((await server.client.get(f"/v1/sessions/{sid}/events")).text)
        assert [f.data for f in log] == progress.events

        # sessionId continues the session: the next turn's seqs follow.
        again = await client.call_tool("test-agent", {"message": "more", "sessionId": sid})
        assert again.structured_content is not None
        assert again.structured_content["sessionId"] == sid
        assert again.structured_content["lastSeq"] == 6
        turns = (await server.client.get(f"/v1/sessions/{sid}/turns")).json()
        assert [t["input"] for t in turns] == ["hello", "more"]


@pytest.mark.parametrize("mode", MODES)
async def test_a_cancelled_call_cancels_its_turn(start_server: ServerFactory, mode: str) -> None:
    server = await start_server()
    async with mcp_client(server, mode) as client:
        progress = Progress()
        with trio.CancelScope() as call:

            async def cancel_once_running() -> None:
                await progress.arrived.wait()
                call.cancel()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel_once_running)
                await client.call_tool(
                    "test-agent", {"message": script({"hang": True})}, progress_callback=progress
                )
        assert call.cancelled_caught
        sid = progress.events[0]["sessionId"]
        # The turn ends cancelled, its log with session.ended; the session takes the next one.
        with trio.fail_after(30):
            while True:
                [turn] = (await server.client.get(f"/v1/sessions/{sid}/turns")).json()
                if turn["status"] != "running":
                    break
                await trio.sleep(0.02)
        assert turn["status"] == "cancelled"
        log = parse_sse((await server.client.get(f"/v1/sessions/{sid}/events")).text)
        assert log[-1].event == "session.ended"
        after = await client.call_tool("test-agent", {"message": "next", "sessionId": sid})
        assert after.structured_content is not None
        assert after.structured_content["reply"] == "echo: next"


async def test_a_turn_started_over_mcp_is_followed_and_cancelled_over_rest(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    async with mcp_client(server) as client:
        progress = Progress()
        result: list[types.CallToolResult] = []

        async def call() -> None:
            ticking = script({"tick": 1000, "every": 0.01})
            result.append(
                await client.call_tool(
                    "test-agent", {"message": ticking}, progress_callback=progress
                )
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            await progress.arrived.wait()
            sid = progress.events[0]["sessionId"]
            # Resumed over SSE after the first event (Last-Event-ID), then cancelled over REST.
            async with server.client.stream(
                "GET", f"/v1/sessions/{sid}/events", headers={"Last-Event-ID": "1"}
            ) as stream:
                lines = stream.aiter_lines()
                async for line in lines:
                    if line.startswith("id: "):
                        assert line == "id: 2"
                        break
                cancel = await server.client.delete(f"/v1/sessions/{sid}/turns/current")
                assert cancel.status_code == 202
                async for _ in lines:
                    pass  # the stream ends with the turn
        [out] = result
        assert out.is_error and out.structured_content is not None
        assert out.structured_content["status"] == "cancelled"
        assert progress.events[-1]["type"] == "session.ended"
        assert out.structured_content["lastSeq"] == progress.events[-1]["seq"]


async def test_refusals_are_error_results_and_bad_arguments_protocol_errors(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    async with mcp_client(server) as client:
        unknown = await client.call_tool("test-agent", {"message": "x", "sessionId": "s_nope"})
        assert unknown.is_error
        [text] = unknown.content
        assert isinstance(text, types.TextContent) and text.text.startswith("not_found: ")
        with pytest.raises(MCPError) as missing:
            await client.call_tool("test-agent", {"sessionId": "s_1"})
        assert missing.value.code == types.INVALID_PARAMS
        assert "arguments.message" in missing.value.error.message
        with pytest.raises(MCPError) as wrong:
            await client.call_tool("test-agent", {"message": 3})
        assert "arguments.message" in wrong.value.error.message
        with pytest.raises(MCPError) as other:
            await client.call_tool("another-tool", {"message": "x"})
        assert "unknown tool" in other.value.error.message


async def test_tenants_see_only_their_own(start_server: ServerFactory) -> None:
    server = await start_server(keys=two_tenants())
    # No key: the guard's 401, before the SDK sees anything.
    refused = await server.client.post("/mcp", headers=JSONRPC, content=b"{}")
    assert refused.status_code == 401
    async with mcp_client(server, key=KEY_A) as alpha:
        result = await alpha.call_tool("test-agent", {"message": "mine"})
        assert result.structured_content is not None
        sid = result.structured_content["sessionId"]
        owned = await server.client.get(f"/v1/sessions/{sid}", headers=auth(KEY_A))
        assert owned.status_code == 200
    async with mcp_client(server, key=KEY_B) as beta:
        theirs = await beta.call_tool("test-agent", {"message": "x", "sessionId": sid})
        assert theirs.is_error
        [text] = theirs.content
        assert isinstance(text, types.TextContent) and text.text.startswith("not_found: ")
    # An MCP session opened with one tenant's key is not the other's.
    async with httpx2.AsyncClient(base_url=server.url, timeout=30) as http:
        opened = await http.post("/mcp", headers=JSONRPC | auth(KEY_A), json=_initialize(1))
        assert opened.status_code == 200, opened.text
        session = opened.headers["mcp-session-id"]
        listed = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        other = await http.post(
            "/mcp", headers=JSONRPC | auth(KEY_B) | {"Mcp-Session-Id": session}, json=listed
        )
        assert other.status_code == 404


def _initialize(request_id: int) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }


async def test_hostile_input_gets_the_protocols_errors(start_server: ServerFactory) -> None:
    server = await start_server()
    http = server.client
    initialize = json.dumps(_initialize(1)).encode()
    cases: list[tuple[dict[str, str], bytes]] = [
        (JSONRPC, b"{not json"),
        (JSONRPC, b"[]"),
        (JSONRPC, b'"a string"'),
        (JSONRPC, json.dumps({"jsonrpc": "2.0", "id": 1, "method": "no/such"}).encode()),
        (JSONRPC, json.dumps({"jsonrpc": "2.0", "id": "9" * 5000, "method": "ping"}).encode()),
        (JSONRPC, json.dumps({"jsonrpc": "1.0", "id": 1, "method": "ping"}).encode()),
        (JSONRPC | {"Mcp-Session-Id": "x" * 200}, initialize),
        ({"Content-Type": "text/plain", "Accept": JSONRPC["Accept"]}, b"hello"),
        (
            {"Content-Type": "application/json", "Accept": "text/html"},
            json.dumps(_initialize(1)).encode(),
        ),
        (JSONRPC | {"MCP-Protocol-Version": "1999-01-01"}, initialize),
    ]
    for headers, body in cases:
        resp = await http.post("/mcp", headers=headers, content=body)
        assert 400 <= resp.status_code < 500, (headers, body[:60], resp.status_code, resp.text)
        if resp.headers.get("content-type", "").startswith("application/json"):
            answer = resp.json()
            assert answer["jsonrpc"] == "2.0" and "error" in answer, answer
    for method in ("GET", "DELETE"):
        resp = await http.request(method, "/mcp", headers={"Accept": "text/event-stream"})
        assert 400 <= resp.status_code < 500, (method, resp.status_code, resp.text)
    too_big = await http.post("/mcp", headers=JSONRPC, content=b"[" + b" " * (2 << 20) + b"]")
    assert too_big.status_code == 413
    # The server is as it was: a call runs.
    async with mcp_client(server) as client:
        result = await client.call_tool("test-agent", {"message": "still here"})
        assert result.structured_content is not None
        assert result.structured_content["reply"] == "echo: still here"


async def test_the_echo_adapter_over_mcp(start_server: ServerFactory) -> None:
    spec = compiled_spec(runtime="echo") | {
        "runtime": {"type": "echo", "options": {"chunkSize": 4}}
    }
    server = await start_server(spec=spec, command=ECHO_ADAPTER)
    async with mcp_client(server, "legacy") as client:
        progress = Progress()
        result = await client.call_tool("test-agent", {"message": "hi"}, progress_callback=progress)
        assert result.structured_content is not None
        reply = result.structured_content["reply"]
        pieces = [e["data"]["text"] for e in progress.events if e["type"] == "message"]
        assert len(pieces) > 1 and "".join(pieces) == reply
        assert 'you said "hi"' in reply


async def test_no_mcp_serves_no_route(start_server: ServerFactory) -> None:
    server = await start_server(mcp=False)
    resp = await server.client.post("/mcp", headers=JSONRPC, json=_initialize(1))
    assert resp.status_code == 404 and resp.json()["error"]["reason"] == "route_not_found"
    document = (await server.client.get("/openapi.json")).json()
    assert "/mcp" not in document["paths"]


async def test_a_call_holds_one_of_its_tenants_streams(start_server: ServerFactory) -> None:
    server = await start_server(keys=two_tenants(), max_streams_per_tenant=1)
    async with mcp_client(server, key=KEY_A) as alpha:
        progress = Progress()
        async with trio.open_nursery() as nursery:

            async def call() -> None:
                await alpha.call_tool(
                    "test-agent", {"message": script({"hang": True})}, progress_callback=progress
                )

            nursery.start_soon(call)
            await progress.arrived.wait()
            over = await server.client.post(
                "/mcp", headers=JSONRPC | auth(KEY_A), json=_initialize(1)
            )
            assert over.status_code == 429
            assert over.json()["error"]["reason"] == "tenant_stream_cap"
            # Another tenant is served.
            beta = await server.client.post(
                "/mcp", headers=JSONRPC | auth(KEY_B), json=_initialize(1)
            )
            assert beta.status_code == 200
            nursery.cancel_scope.cancel()
