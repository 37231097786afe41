"""Scenario i: a burst of 8 turns against 2 warm adapters of a slow-starting adapter:
the rest start cold, none fails, the pool refills."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import httpx
import trio

from bench import BenchError
from bench.adapter import adapter_command
from bench.client import RawConn, check_sse, started_data, wait_pool_full, warm_state
from bench.procinfo import children_of
from bench.results import Result, ms
from bench.scenarios import scenario
from bench.server import Context


@dataclass(frozen=True)
class Sizes:
    sleep_ms: int = 1500  # the adapter's start-up
    turns: int = 8  # in the burst
    pool: int = 2  # --warm-adapters
    max_turns: int = 16  # --max-concurrent-turns


async def _burst(url: str, n: int, within: float, server_pid: int) -> dict[str, Any]:
    conns = [await RawConn.open(url) for _ in range(n)]
    outcomes: list[dict[str, Any]] = []
    peak = 0
    try:
        sids = [await conns[0].create_session() for _ in range(n)]
        done = trio.Event()

        async def watch() -> None:  # the server's adapter processes, warm ones included
            nonlocal peak
            while not done.is_set():
                peak = max(peak, len(children_of(server_pid)))
                await trio.sleep(0.02)

        async def turn(conn: RawConn, sid: str) -> None:
            t0 = time.perf_counter()
            status, _, body = await conn.request(
                "POST", f"/v1/sessions/{sid}/turns", b'{"input":"hi"}'
            )
            out: dict[str, Any] = {"seconds": round(time.perf_counter() - t0, 4)}
            out["status"] = status
            try:
                if status != 200:
                    raise BenchError(f"HTTP {status} {body[:200]!r}")
                check_sse(body, 3)
                out["adapter_idle_ms"] = started_data(body).get("idleMs")
            except (BenchError, ValueError, KeyError) as exc:
                out["error"] = str(exc)[:300]
            outcomes.append(out)

        with trio.fail_after(within):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                async with trio.open_nursery() as burst:
                    for conn, sid in zip(conns, sids, strict=True):
                        burst.start_soon(turn, conn, sid)
                done.set()
    finally:
        for conn in conns:
            await conn.aclose()
    return {"turns": outcomes, "adapters_peak": peak}


@scenario("i", "warm-pool-burst", full=Sizes(), quick=Sizes())
def warm_pool_burst(ctx: Context, p: Sizes) -> Result:
    """a burst of 8 turns, --warm-adapters 2, slow-start adapter: the rest start cold  [0 errors]

    A burst of more turns than warm adapters: the rest start cold, without errors.
    """
    n, pool, cap, sleep_ms = p.turns, p.pool, p.max_turns, p.sleep_ms
    res = Result("i", f"a burst of {n} turns, {pool} warm adapters, slow start ({sleep_ms} ms)")
    flags = ["--in-memory", "--warm-adapters", str(pool), "--max-concurrent-turns", str(cap)]
    flags += ["--max-sessions", "0"]
    with (
        ctx.server("i", adapter_command("slow", str(sleep_ms), "1"), flags) as srv,
        httpx.Client(base_url=srv.url, timeout=30) as client,
    ):
        fill = wait_pool_full(client)
        time.sleep(sleep_ms / 1000 + 0.5)  # every warm adapter has finished loading
        details = trio.run(_burst, srv.url, n, 60.0, srv.pid)
        ready_after, _ = warm_state(client)  # the replacements started during the burst
        time.sleep(0.5)
        details["adapters_after"] = len(children_of(srv.pid))
    details.update(flags=flags, pool_fill_seconds=round(fill, 3), warm_ready_after=ready_after)
    res.details = details
    turns = details["turns"]
    errors = [t for t in turns if "error" in t]
    # A turn that got a process which had finished loading is fast; the others
    # waited for a start-up (all of it, or the rest of a replacement's).
    fast = [t["seconds"] for t in turns if "error" not in t and t["seconds"] < sleep_ms / 2000]
    slow = [t["seconds"] for t in turns if "error" not in t and t["seconds"] >= sleep_ms / 2000]
    res.add("errors", len(errors), f"of {n}", "0", not errors and len(turns) == n)
    res.add("  finished fast (a loaded warm adapter)", len(fast), f"of {n}")
    if fast:
        res.add("  fast turns: p50", ms(statistics.median(fast)), "ms")
    res.add("  finished slow (waited for a start-up)", len(slow), f"of {n}")
    if slow:
        res.add("  slow turns: p50", ms(statistics.median(slow)), "ms")
        res.add("  slow turns: max", ms(max(slow)), "ms")
    limit = cap + pool
    peak = details["adapters_peak"]
    res.add("  adapter processes at peak", peak, "procs", f"<= {limit}", peak <= limit)
    res.add("  warm adapters ready after the burst", ready_after, f"of {pool}", str(pool))
    res.metrics[-1].met = ready_after == pool
    if errors:
        raise BenchError(f"{len(errors)} of {n} turns failed: {errors[:3]}")
    return res
