"""MCP calls resumed with ``Last-Event-ID``, replayed from the session log.

The ``mcp`` SDK's own client, unmodified, through a TCP proxy on 127.0.0.1
that cuts the call's stream after its first progress notification: the
client reconnects by itself (``GET /mcp`` with ``Last-Event-ID``) and gets
the rest of the turn and the result, nothing missing or doubled.  Two MCP
sessions whose calls have the same JSON-RPC id replay only their own events
(raw HTTP, to pick the ids).
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import mcp_types as types
import trio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.helpers import CuttingProxy, ServerFactory, parse_sse, script

JSONRPC = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


class Progress:
    """A call's progress notifications: every event they carried, and the counts."""

    def __init__(self, until: int) -> None:
        self.events: list[dict[str, Any]] = []
        self.counts: list[float] = []
        self.until = until
        self.reached = trio.Event()

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self.counts.append(progress)
        self.events += [json.loads(line) for line in (message or "").split("\n")]
        if len(self.events) >= self.until:
            self.reached.set()


async def test_a_call_cut_mid_stream_is_resumed_from_the_log(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    server = await start_server()
    proxy = CuttingProxy(int(server.url.rsplit(":", 1)[1]), cut_at=b"notifications/progress")
    await proxy.run(nursery)
    # session.started, 30 messages, then the turn hangs until it is cancelled over REST.
    ticking = script({"tick": 30, "every": 0.01}, {"hang": True})
    progress = Progress(until=31)
    results: list[types.CallToolResult] = []
    async with httpx2.AsyncClient(timeout=120) as http:
        transport = streamable_http_client(f"{proxy.url}/mcp", http_client=http)
        async with Client(transport, mode="legacy") as client:

            async def call() -> None:
                message = {"message": ticking}
                results.append(
                    await client.call_tool("test-agent", message, progress_callback=progress)
                )

            async with trio.open_nursery() as calls:
                calls.start_soon(call)
                with trio.fail_after(60):
                    await progress.reached.wait()
                sid = progress.events[0]["sessionId"]
                cancel = await server.client.delete(f"/v1/sessions/{sid}/turns/current")
                assert cancel.status_code == 202, cancel.text
    assert proxy.cuts == 1
    assert any(b"last-event-id:" in r.lower() for r in proxy.requests), proxy.requests
    # Every event of the turn once, in order; the progress counts them.
    seqs = [e["seq"] for e in progress.events]
    assert seqs == list(range(1, 33)), seqs
    assert progress.events[-1]["type"] == "session.ended"
    assert progress.counts == sorted(set(progress.counts)) and progress.counts[-1] == 32
    [result] = results
    out = result.structured_content
    assert out is not None and result.is_error
    assert (out["status"], out["sessionId"], out["lastSeq"]) == ("cancelled", sid, 32)
    log = parse_sse((await server.client.get(f"/v1/sessions/{sid}/events")).text)
    assert [f.data for f in log] == progress.events


class Sent:
    """One SSE event of the MCP server: its ``id`` and its message (``None``: priming)."""

    def __init__(self, block: str) -> None:
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
        self.id = fields.get("id")
        data = fields.get("data", "")
        self.message: dict[str, Any] | None = json.loads(data) if data else None


def sent(text: str) -> list[Sent]:
    blocks = text.replace("\r\n", "\n").split("\n\n")
    return [Sent(b) for b in blocks if b.strip() and not b.startswith(":")]


async def open_session(http: httpx2.AsyncClient) -> dict[str, str]:
    """An MCP session of the handshake era (resumable: 2025-11-25); its request headers."""
    hello = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }
    opened = await http.post("/mcp", headers=JSONRPC, json=hello)
    assert opened.status_code == 200, opened.text
    headers = JSONRPC | {
        "Mcp-Session-Id": opened.headers["mcp-session-id"],
        "MCP-Protocol-Version": "2025-11-25",
    }
    done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert (await http.post("/mcp", headers=headers, json=done)).status_code == 202
    return headers


async def call(http: httpx2.AsyncClient, headers: dict[str, str], text: str) -> list[Sent]:
    """``tools/call`` with JSON-RPC id 7 and a progress token, read to its result."""
    request = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {
            "name": "test-agent",
            "arguments": {"message": text},
            "_meta": {"progressToken": "p"},
        },
    }
    resp = await http.post("/mcp", headers=headers, json=request)
    assert resp.status_code == 200, resp.text
    return sent(resp.text)


async def replay(
    http: httpx2.AsyncClient, headers: dict[str, str], last_event_id: str
) -> httpx2.Response:
    """``GET /mcp`` with ``Last-Event-ID``, in the MCP session of ``headers``."""
    get = {"Accept": "text/event-stream", "Last-Event-ID": last_event_id}
    get |= {k: v for k, v in headers.items() if k.lower().startswith("mcp-")}
    return await http.get("/mcp", headers=get)


def carried(events: list[Sent]) -> list[dict[str, Any]]:
    """The logged events that progress notifications carried."""
    return [
        json.loads(line)
        for e in events
        if e.message is not None and e.message.get("method") == "notifications/progress"
        for line in e.message["params"]["message"].split("\n")
    ]


async def test_two_sessions_with_the_same_request_id_replay_their_own(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    async with httpx2.AsyncClient(base_url=server.url, timeout=60) as http:
        alpha = await open_session(http)
        beta = await open_session(http)
        calls = {
            "alpha": (alpha, await call(http, alpha, script({"many": 3}, {"end": "completed"}))),
            "beta": (beta, await call(http, beta, script({"many": 5}, {"end": "completed"}))),
        }
        for name, (headers, events) in calls.items():
            assert all(e.id for e in events), events  # every event has an id
            assert events[0].message is None  # the priming event: nothing of the call yet
            answer = events[-1].message
            assert answer is not None and answer["id"] == 7
            # From the priming id: every event of that call's turn, then its result, again.
            resp = await replay(http, headers, events[0].id or "")
            assert resp.status_code == 200, resp.text
            again = sent(resp.text)
            assert carried(again) == carried(events), name
            assert {e["sessionId"] for e in carried(again)} == {
                answer["result"]["structuredContent"]["sessionId"]
            }
            assert again[-1].message == answer
            # From the middle (the first progress' id): only what came after it.
            middle = next(e for e in events if e.message and "method" in e.message)
            resp = await replay(http, headers, middle.id or "")
            rest = sent(resp.text)
            assert carried(rest) == carried(events)[len(carried([middle])) :]
            assert rest[-1].message == answer
            # From the result's id: nothing more.
            resp = await replay(http, headers, events[-1].id or "")
            assert resp.status_code == 200 and sent(resp.text) == []
        # An id of the other MCP session is not one of this one's: refused, naming the header.
        for mine, theirs in (("alpha", "beta"), ("beta", "alpha")):
            headers = calls[mine][0]
            for event in calls[theirs][1]:
                resp = await replay(http, headers, event.id or "")
                assert resp.status_code == 400, (resp.status_code, resp.text)
                assert "Last-Event-ID" in resp.json()["error"]["message"]
        for bogus in ("x", "1.2.3", "." * 300, calls["alpha"][0]["Mcp-Session-Id"] + ".999.0"):
            resp = await replay(http, alpha, bogus)
            assert resp.status_code == 400, (bogus, resp.text)
