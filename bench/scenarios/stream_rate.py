"""Scenarios b and f: events/s through one SSE stream, the event log in memory (b) or
in SQLite, every event stored before it is sent (f)."""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import httpx

from bench import BenchError
from bench.adapter import adapter_command
from bench.client import JSON_HEADERS, check_sse
from bench.pipe_floor import pipe_floor
from bench.procinfo import cpu_seconds
from bench.results import Result, ms
from bench.scenarios import scenario
from bench.server import Context


@dataclass(frozen=True)
class Sizes:
    events: int = 50_000  # message events in the turn
    runs: int = 3  # after one that warms up


QUICK = Sizes(events=10_000, runs=1)


def _options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("scenarios b and f")
    group.add_argument(
        "--stream-events",
        type=int,
        metavar="N",
        help="message events in each turn (default 50,000; --quick 10,000)",
    )


def stream_once(client: httpx.Client, n: int) -> tuple[str, bytes, float, float | None]:
    """One turn of ``n`` message events; returns (session, SSE body, seconds, first byte at)."""
    r = client.post("/v1/sessions", content=b"{}", headers=JSON_HEADERS)
    sid = r.json()["id"]
    chunks: list[bytes] = []
    t0 = time.perf_counter()
    first: float | None = None
    with client.stream(
        "POST", f"/v1/sessions/{sid}/turns", content=b"{}", headers=JSON_HEADERS
    ) as resp:
        if resp.status_code != 200:
            raise BenchError(f"turn: HTTP {resp.status_code}")
        for chunk in resp.iter_raw():
            if first is None:
                first = time.perf_counter()
            chunks.append(chunk)
    body = b"".join(chunks)
    types = check_sse(body, n + 2)
    if types["message"] != n or types["session.started"] != 1:
        raise BenchError(f"unexpected event mix: {dict(types)}")
    return sid, body, time.perf_counter() - t0, None if first is None else first - t0


def _stream_rate(ctx: Context, p: Sizes, name: str, flags: list[str], target: int) -> Result:
    n = ctx.options.stream_events or p.events
    store = "SQLite" if "sqlite" in flags else "memory"
    res = Result(name, f"events/s through one SSE stream ({n:,} message events, {store} log)")
    runs: list[dict[str, float]] = []
    with (
        ctx.server(name, adapter_command(str(n)), flags) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as client,
    ):
        for i in range(1 + p.runs):  # the first run warms up
            cpu0, client0 = cpu_seconds(srv.pid), time.process_time()
            _, body, elapsed, first = stream_once(client, n)
            cpu = cpu_seconds(srv.pid) - cpu0
            client_cpu = time.process_time() - client0
            if i == 0:
                continue
            runs.append(
                {
                    "seconds": round(elapsed, 4),
                    "events_per_s": round((n + 2) / elapsed),
                    "mib_per_s": round(len(body) / elapsed / 2**20, 1),
                    "first_byte_ms": ms(first or 0.0),
                    "bytes": len(body),
                    "server_cpu_s": round(cpu, 3),
                    "server_cpu_us_per_event": round(cpu / (n + 2) * 1e6, 2),
                    "client_cpu_s": round(client_cpu, 3),
                }
            )
    rates = [r["events_per_s"] for r in runs]
    best, median = max(rates), statistics.median(rates)
    res.details = {"events": n + 2, "client": "httpx.Client.stream iter_raw", "runs": runs}
    res.add("events/s (median)", round(median), "ev/s", f">= {target:,}", median >= target)
    res.add("events/s (best)", best, "ev/s")
    res.add("  MiB/s (median)", statistics.median(r["mib_per_s"] for r in runs), "MiB/s")
    cpu_per_event = statistics.median(r["server_cpu_us_per_event"] for r in runs)
    res.add("  server CPU per event", cpu_per_event, "us")
    if store == "memory":  # the floor under it: the same events moved by bare trio
        floor = round(pipe_floor(n) * 1e6, 3)
        res.details["pipe_floor_us_per_event"] = floor
        res.add("  floor: bare trio, pipe to socket, CPU per event", floor, "us")
    res.add(
        "  client CPU / wall",
        round(sum(r["client_cpu_s"] for r in runs) / sum(r["seconds"] for r in runs), 2),
        "",
    )
    return res


#: Scenario b's figure when the core server was measured (docs/benchmarks.md).
CORE_STREAM_RATE = 104_988


@scenario("b", "stream-rate", full=Sizes(), quick=QUICK, options=_options)
def stream_rate(ctx: Context, p: Sizes) -> Result:
    """events/s through one SSE stream (50,000 message events)  [>= 120,000 /s]"""
    return _stream_rate(ctx, p, "b", ["--in-memory"], 120_000)


@scenario("f", "stream-rate-sqlite", full=Sizes(), quick=QUICK)
def stream_rate_sqlite(ctx: Context, p: Sizes) -> Result:
    """b with the event log in SQLite (every event stored before sent)  [>= 75% of core b]

    The durable log: the same stream with every event written to SQLite first.
    """
    return _stream_rate(ctx, p, "f", ["--store", "sqlite"], round(CORE_STREAM_RATE * 0.75))
