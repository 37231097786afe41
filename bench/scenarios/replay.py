"""Scenario g: the cost of resume, replaying a 50,000-event log from SQLite from seq 0,
as SSE and as the JSON export."""

from __future__ import annotations

import statistics
import time

import httpx

from bench import BenchError
from bench.adapter import adapter_command
from bench.results import Result, ms
from bench.scenarios import scenario
from bench.scenarios.stream_rate import QUICK, Sizes, stream_once
from bench.server import Context


@scenario("g", "replay", full=Sizes(), quick=QUICK)
def replay(ctx: Context, p: Sizes) -> Result:
    """resume: replay a 50,000-event log from SQLite, as SSE and JSON

    The cost of resume: replay a 50,000-event log from seq 0 (SSE and JSON export).
    """
    n = p.events
    res = Result("g", f"resume: replay {n + 2:,} logged events from SQLite")
    sse: list[float] = []
    export: list[float] = []
    with (
        ctx.server("g", adapter_command(str(n)), ["--store", "sqlite"]) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as client,
    ):
        sid, turn_body, _, _ = stream_once(client, n)
        for _ in range(1 + p.runs):
            t0 = time.perf_counter()
            with client.stream("GET", f"/v1/sessions/{sid}/events") as resp:
                body = b"".join(resp.iter_raw())
            sse.append(time.perf_counter() - t0)
            if body != turn_body:
                raise BenchError("the replay differs from the turn's own stream")
            t0 = time.perf_counter()
            resp = client.get(f"/v1/sessions/{sid}/events", params={"format": "json"})
            export.append(time.perf_counter() - t0)
            if len(resp.json()) != n + 2:
                raise BenchError(f"export: {len(resp.json())} events, expected {n + 2}")
    sse, export = sse[1:], export[1:]  # the first run warms up
    res.details = {"events": n + 2, "sse_seconds": sse, "json_seconds": export}
    res.add("replay as SSE (median)", ms(statistics.median(sse)), "ms")
    res.add("  events/s", round((n + 2) / statistics.median(sse)), "ev/s")
    res.add("export as JSON (median)", ms(statistics.median(export)), "ms")
    return res
