"""Scenario c: 64 sessions x 5 turns at once (``--max-concurrent-turns 64``), over
``RawConn``, one connection per session; ``run_rounds`` also serves m and n (replicas)."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio

from bench import BenchError
from bench.adapter import adapter_command
from bench.client import RawConn, check_sse
from bench.procinfo import cpu_seconds
from bench.results import Result, latency_summary
from bench.scenarios import scenario
from bench.server import Context


@dataclass(frozen=True)
class Sizes:
    sessions: int = 64
    turns: int = 5  # per session, each after the last
    rounds: int = 3  # after one turn per session that warms up


class Workload:
    """What one session's turn is on the wire: trioserve's, here (a peer server's
    workload subclasses it, so both are driven by the same client and rounds)."""

    async def create(self, conn: RawConn) -> str:
        return await conn.create_session()

    async def turn(self, conn: RawConn, sid: str) -> None:
        status, _, body = await conn.request("POST", f"/v1/sessions/{sid}/turns", b'{"input":"hi"}')
        if status != 200:
            raise BenchError(f"turn: HTTP {status} {body[:200]!r}")
        check_sse(body, 3)


async def _c_round(
    conns: list[list[RawConn]], sids: list[str], turns: int, workload: Workload
) -> tuple[float, list[float], int]:
    """Each session's turns in turn; turn ``i`` of session ``s`` on ``conns[s][i % k]``."""
    latencies: list[float] = []
    ended = 0

    async def worker(mine: list[RawConn], sid: str) -> None:
        nonlocal ended
        for i in range(turns):
            t0 = time.perf_counter()
            await workload.turn(mine[i % len(mine)], sid)
            latencies.append(time.perf_counter() - t0)
            ended += 1

    t0 = time.perf_counter()
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            for conn, sid in zip(conns, sids, strict=True):
                nursery.start_soon(worker, conn, sid)
    return time.perf_counter() - t0, latencies, ended


async def run_rounds(
    urls: list[str],
    sessions: int,
    turns: int,
    rounds: int,
    cpu_of: Callable[[], float],
    db_cpu_of: Callable[[], float] | None = None,
    workload: Workload | None = None,
) -> list[dict[str, Any]]:
    """``rounds`` of ``sessions`` x ``turns``; with several ``urls`` (replicas) session ``s``
    starts on ``urls[s % k]`` and each next turn goes to the next replica.  ``cpu_of``: the
    server's CPU seconds so far; ``db_cpu_of``: the database's (PostgreSQL backends);
    ``workload``: what a create and a turn are (trioserve's by default)."""
    workload = workload or Workload()
    k = len(urls)
    conns = [[await RawConn.open(urls[(s + j) % k]) for j in range(k)] for s in range(sessions)]
    try:
        sids = [await workload.create(conns[0][0]) for _ in range(sessions)]
        await _c_round(conns, sids, 1, workload)  # warm-up: one turn per session
        out = []
        for _ in range(rounds):
            load = os.getloadavg()[0]
            cpu0, db0 = cpu_of(), db_cpu_of() if db_cpu_of else 0.0
            wall, latencies, ended = await _c_round(conns, sids, turns, workload)
            cpu = cpu_of() - cpu0
            if ended != sessions * turns:
                raise BenchError(f"only {ended} of {sessions * turns} turns ended")
            row: dict[str, Any] = {}
            if db_cpu_of:
                row["db_cpu_ms_per_turn"] = round((db_cpu_of() - db0) / ended * 1000, 2)
            out.append(
                row
                | {
                    "wall_s": round(wall, 4),
                    "turns_ended": ended,
                    "turns_per_s": round(ended / wall),
                    "server_cpu_s": round(cpu, 3),
                    "server_cpu_ms_per_turn": round(cpu / ended * 1000, 2),
                    "turn_latency": latency_summary(latencies),
                    "loadavg_1min_before": load,
                }
            )
        return out
    finally:
        for conn in (c for mine in conns for c in mine):
            await conn.aclose()


@scenario("c", "concurrent-turns", full=Sizes(), quick=Sizes(rounds=1))
def concurrent_turns(ctx: Context, p: Sizes) -> Result:
    """64 sessions x 5 turns concurrently, --max-concurrent-turns 64  [<= 0.5 s]"""
    s, t = p.sessions, p.turns
    res = Result("c", f"{s} sessions x {t} turns concurrently (--max-concurrent-turns {s})")
    flags = ["--in-memory", "--max-concurrent-turns", str(s), "--max-sessions", "0"]
    with ctx.server("c", adapter_command("1"), flags) as srv:
        rounds = trio.run(run_rounds, [srv.url], s, t, p.rounds, partial(cpu_seconds, srv.pid))
    walls = [r["wall_s"] for r in rounds]
    median = statistics.median(walls)
    res.details = {"client": "RawConn (trio), one connection per session", "rounds": rounds}
    res.add(f"{s}x{t} wall (median)", median, "s", "<= 0.5 s", median <= 0.5)
    res.add(f"{s}x{t} wall (best)", min(walls), "s")
    res.add("  turns/s (median)", statistics.median(r["turns_per_s"] for r in rounds), "turns/s")
    cpu_per_turn = statistics.median(r["server_cpu_ms_per_turn"] for r in rounds)
    res.add("  server CPU per turn", cpu_per_turn, "ms")
    res.add(
        "  turn latency p50 under load",
        statistics.median(r["turn_latency"]["p50_ms"] for r in rounds),
        "ms",
    )
    return res
