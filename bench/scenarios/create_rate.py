"""Scenario e: session creates/s with the SQLite store up to ``--max-sessions``, then
one over the cap (429); ``create_sessions`` also serves m."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio

from bench import BenchError
from bench.adapter import adapter_command
from bench.client import RawConn
from bench.procinfo import cpu_seconds
from bench.results import Result, latency_summary
from bench.scenarios import scenario
from bench.server import Context, Server


@dataclass(frozen=True)
class Sizes:
    sessions: int = 1000  # also the cap
    clients: int = 8  # concurrent connections


async def create_sessions(
    srv: Server,
    n: int,
    clients: int,
    cpu_of: Callable[[], float] | None = None,
    db_cpu_of: Callable[[], float] | None = None,
) -> dict[str, Any]:
    cpu_of = cpu_of or partial(cpu_seconds, srv.pid)
    url = srv.url
    conns = [await RawConn.open(url) for _ in range(clients)]
    statuses: Counter[int] = Counter()
    latencies: list[float] = []
    issued = 0

    async def worker(conn: RawConn) -> None:
        nonlocal issued
        while issued < n:
            issued += 1
            t0 = time.perf_counter()
            status, _, _ = await conn.request("POST", "/v1/sessions", b"{}")
            latencies.append(time.perf_counter() - t0)
            statuses[status] += 1

    try:
        for conn in conns:  # warm-up: create and end one session per client
            sid = await conn.create_session()
            status, _, _ = await conn.request("DELETE", f"/v1/sessions/{sid}")
            if status != 204:
                raise BenchError(f"DELETE: HTTP {status}")
        load = os.getloadavg()[0]
        cpu0, db0 = cpu_of(), db_cpu_of() if db_cpu_of else 0.0
        t0 = time.perf_counter()
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for conn in conns:
                    nursery.start_soon(worker, conn)
        wall = time.perf_counter() - t0
        cpu = cpu_of() - cpu0
        db = db_cpu_of() - db0 if db_cpu_of else None
        over_status, _, over_body = await conns[0].request("POST", "/v1/sessions", b"{}")
        list_status, _, listing = await conns[0].request("GET", "/v1/sessions?status=active")
    finally:
        for conn in conns:
            await conn.aclose()
    active = len(json.loads(listing)) if list_status == 200 else -1
    out: dict[str, Any] = {} if db is None else {"db_cpu_ms_per_create": round(db / n * 1000, 3)}
    return out | {
        "clients": clients,
        "wall_s": round(wall, 4),
        "creates_per_s": round(n / wall),
        "server_cpu_s": round(cpu, 3),
        "server_cpu_ms_per_create": round(cpu / n * 1000, 3),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "create_latency": latency_summary(latencies),
        "loadavg_1min_before": load,
        "over_cap_status": over_status,
        "over_cap_body": json.loads(over_body) if over_body.strip() else None,
        "active_listed": active,
    }


@scenario("e", "create-rate", full=Sizes(), quick=Sizes(sessions=200))
def create_rate(ctx: Context, p: Sizes) -> Result:
    """session creates/s with the SQLite store, --max-sessions 1000  [>= 1,500 /s]"""
    n = p.sessions
    res = Result("e", f"session creates/s, SQLite store, --max-sessions {n}")
    db = ctx.tmp / "e" / "sessions.db"
    flags = ["--store", f"sqlite:{db}", "--max-sessions", str(n)]
    with ctx.server("e", adapter_command("1"), flags) as srv:
        details = trio.run(create_sessions, srv, n, p.clients)
    details["client"] = f"RawConn (trio), {p.clients} concurrent connections"
    res.details = details
    rate = details["creates_per_s"]
    created = details["statuses"].get("201", 0)
    res.add("creates/s", rate, "/s", ">= 1,500", rate >= 1500 and created == n)
    res.add("  created (201)", created, f"of {n}")
    res.add(f"  create #{n + 1} status", details["over_cap_status"], "", "429")
    res.metrics[-1].met = details["over_cap_status"] == 429
    listed = details["active_listed"]
    res.add("  active sessions listed", listed, "", str(n), listed == n)
    res.add("  create latency p50", details["create_latency"]["p50_ms"], "ms")
    res.add("  server CPU per create", details["server_cpu_ms_per_create"], "ms")
    return res
