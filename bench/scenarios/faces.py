"""Scenario o: one turn of 50,000 events through each protocol face, as a ratio to native SSE.

The same server (event log in memory) and adapter as scenario b; each run
streams one turn through the v0.8 API's SSE, then one each through MCP
(``tools/call`` with a progress token: a progress notification per batch
of events),
AG-UI (``POST /ag-ui``) and A2A (``SendStreamingMessage``), each over one
httpx connection, and divides each face's events/s by the native one of
the same run.  Every stream is checked: the frames each face makes of the
turn's events, ending as the face ends a completed turn.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from bench import BenchError
from bench.adapter import adapter_command
from bench.client import JSON_HEADERS
from bench.procinfo import cpu_seconds
from bench.results import Result
from bench.scenarios import scenario
from bench.scenarios.stream_rate import stream_once
from bench.server import Context

MCP_HEADERS = JSON_HEADERS | {"Accept": "application/json, text/event-stream"}
MCP_VERSION = "2025-06-18"
#: What each face's stream must hold for a turn of n message events.
FRAMES: dict[str, Callable[[int], int]] = {
    "ag-ui": lambda n: 3 * n + 4,  # RUN_STARTED, RAW, 3 per message, RAW, RUN_FINISHED
    "a2a": lambda n: n + 4,  # the task, a status update, a piece per message, two statuses
}


@dataclass(frozen=True)
class Sizes:
    events: int = 50_000
    runs: int = 3  # after one that warms up


def _frames(body: bytes) -> list[bytes]:
    """The frames of an SSE body (the MCP SDK's lines end with CRLF)."""
    return [f for f in body.replace(b"\r\n", b"\n").split(b"\n\n") if b"data: " in f]


def _timed(
    client: httpx.Client, url: str, body: object, headers: dict[str, str]
) -> tuple[bytes, float]:
    t0 = time.perf_counter()
    with client.stream("POST", url, content=json.dumps(body), headers=headers) as resp:
        if resp.status_code != 200:
            raise BenchError(f"{url}: HTTP {resp.status_code}: {resp.read()[:300]!r}")
        data = b"".join(resp.iter_raw())
    return data, time.perf_counter() - t0


def mcp_turn(client: httpx.Client, run: int) -> tuple[bytes, float]:
    """initialize, initialized, then the timed ``tools/call``."""
    hello = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": MCP_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "0"},
        },
    }
    r = client.post("/mcp", content=json.dumps(hello), headers=MCP_HEADERS)
    session = r.headers.get("mcp-session-id")
    if r.status_code != 200 or not session:
        raise BenchError(f"MCP initialize: HTTP {r.status_code}")
    headers = MCP_HEADERS | {"Mcp-Session-Id": session, "MCP-Protocol-Version": MCP_VERSION}
    done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    client.post("/mcp", content=json.dumps(done), headers=headers)
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "bench", "arguments": {"message": ""}, "_meta": {"progressToken": run}},
    }
    body, seconds = _timed(client, "/mcp", call, headers)
    client.request("DELETE", "/mcp", headers=headers)
    return body, seconds


def agui_turn(client: httpx.Client, run: int) -> tuple[bytes, float]:
    said = [{"id": "m", "role": "user", "content": "go"}]
    body = {"threadId": f"bench-{run}", "runId": "r", "messages": said}
    return _timed(client, "/ag-ui", body, JSON_HEADERS)


def a2a_turn(client: httpx.Client, run: int) -> tuple[bytes, float]:
    said = {"messageId": f"m{run}", "role": "ROLE_USER", "parts": [{"text": "go"}]}
    body = {"jsonrpc": "2.0", "id": run, "method": "SendStreamingMessage"}
    return _timed(client, "/a2a", body | {"params": {"message": said}}, JSON_HEADERS)


TURNS = {"mcp": mcp_turn, "ag-ui": agui_turn, "a2a": a2a_turn}


def _mcp_events(frames: list[bytes]) -> int:
    """The events the progress notifications of an MCP call's frames carry (one a line)."""
    count = 0
    for frame in frames:
        data = frame[frame.index(b"data: ") + 6 :]
        message = json.loads(data)
        if message.get("method") == "notifications/progress":
            count += len(message["params"]["message"].split("\n"))
    return count


def _check(face: str, body: bytes, n: int) -> None:
    frames = _frames(body)
    if face == "mcp":  # a notification per batch of events, then the result
        if _mcp_events(frames) != n + 2:
            raise BenchError(f"mcp: {_mcp_events(frames)} events in progress, expected {n + 2}")
    elif len(frames) != FRAMES[face](n):
        raise BenchError(f"{face}: {len(frames)} frames, expected {FRAMES[face](n)}")
    last = frames[-1]
    ended = {
        "mcp": b'"result"',
        "ag-ui": b'"RUN_FINISHED"',
        "a2a": b"TASK_STATE_COMPLETED",
    }[face]
    if ended not in last:
        raise BenchError(f"{face}: the last frame is not a completed end: {last[:300]!r}")


@scenario("o", "faces", full=Sizes(), quick=Sizes(events=10_000, runs=1))
def faces(ctx: Context, p: Sizes) -> Result:
    """events/s of one 50,000-event turn through MCP, AG-UI and A2A, as a ratio to native SSE
    in the same run  [>= 0.8x]"""
    n = p.events
    res = Result("o", f"one turn of {n:,} message events through each face / native SSE")
    rates: dict[str, list[float]] = {face: [] for face in ("native", *TURNS)}
    # The server's CPU per event (the adapter is another process): on a shared machine
    # the steadier figure, where events/s moves with what else runs.
    cpu: dict[str, list[float]] = {face: [] for face in ("native", *TURNS)}
    with (
        ctx.server("o", adapter_command(str(n)), ["--in-memory"]) as srv,
        httpx.Client(base_url=srv.url, timeout=120) as client,
    ):
        for i in range(1 + p.runs):  # the first run warms up
            cpu0 = cpu_seconds(srv.pid)
            _, _, seconds, _ = stream_once(client, n)
            measured = {"native": ((n + 2) / seconds, cpu_seconds(srv.pid) - cpu0)}
            for face, turn in TURNS.items():
                cpu0 = cpu_seconds(srv.pid)
                body, seconds = turn(client, i)
                measured[face] = ((n + 2) / seconds, cpu_seconds(srv.pid) - cpu0)
                _check(face, body, n)
            if i == 0:
                continue
            for face, (rate, used) in measured.items():
                rates[face].append(rate)
                cpu[face].append(used / (n + 2) * 1e6)
    native = statistics.median(rates["native"])
    native_cpu = statistics.median(cpu["native"])
    res.details = {face: [round(r) for r in values] for face, values in rates.items()}
    res.details["cpu_us_per_event"] = {f: [round(c, 2) for c in v] for f, v in cpu.items()}
    res.add("native SSE events/s (median)", round(native), "ev/s")
    res.add("native SSE server CPU per event", round(native_cpu, 2), "us")
    for face in TURNS:
        median = statistics.median(rates[face])
        res.add(f"{face} events/s (median)", round(median), "ev/s")
        ratio = round(median / native, 2)
        res.add(f"  {face} / native", ratio, "x", ">= 0.8", ratio >= 0.8)
        used = statistics.median(cpu[face])
        res.add(f"  {face} server CPU per event", round(used, 2), "us")
        res.add(f"  {face} CPU / native", round(used / native_cpu, 2), "x")
    return res
