"""Scenario warm-pool-node (issue 23): an adapter shaped like the Node one (0.85 s of CPU
before it reads stdin), the server at its *default* pool flags against the pool off:
16 turns back to back that end 45 ms after their first event, 16 that last 0.4 s after
it, turns 3 s apart, and 8 sessions x 3 turns in parallel against the CPU bound."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx

from bench import BenchError
from bench.adapter import adapter_command
from bench.client import create, first_event_turn, pool_json, wait_pool_ready
from bench.results import Result, latency_summary
from bench.scenarios import scenario
from bench.server import Context

OFF = ["--in-memory", "--warm-adapters", "0"]
DEFAULT = ["--in-memory"]  # the pool's defaults: what the issue measures


@dataclass(frozen=True)
class Sizes:
    burn_ms: int = 850  # the CPU-burning load, before stdin
    short_ms: int = 45  # a short turn: CPU after its first event
    long_ms: int = 400  # a long turn
    turns: int = 16  # back to back, per series
    spaced_turns: int = 8
    spacing: float = 3.0
    parallel: int = 8  # sessions
    parallel_turns: int = 3  # turns each, one after the other


def _command(p: Sizes, tail_ms: int) -> str:
    return adapter_command("burn", str(p.burn_ms), "1", str(tail_ms))


def _series(
    ctx: Context, name: str, command: str, flags: list[str], turns: int, spacing: float
) -> dict[str, Any]:
    """``turns`` turns, each on a new session, back to back (``spacing`` 0: each sent once
    the previous one ended) or ``spacing`` s apart, start to start."""
    samples: list[dict[str, Any]] = []
    with (
        ctx.server(name, command, flags) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as client,
    ):
        sids = [create(client) for _ in range(turns)]
        before = wait_pool_ready(client) if flags != OFF else None
        time.sleep(0.5)
        start = time.perf_counter()
        for i, sid in enumerate(sids):
            if spacing:
                time.sleep(max(0.0, start + i * spacing - time.perf_counter()))
            samples.append(first_event_turn(client, sid))
        after = pool_json(client) if flags != OFF else None
    first = [s["first_event_s"] for s in samples]
    return {
        "flags": flags,
        "pool_before": before,
        "pool_after": after,
        "first_event": latency_summary(first),
        "turns": samples,
    }


def _parallel(ctx: Context, p: Sizes, command: str) -> dict[str, Any]:
    """``parallel`` sessions, each running ``parallel_turns`` turns one after another, all
    sessions at once; the wall time from the first request to the last turn's end."""
    extra = ["--max-concurrent-turns", str(2 * p.parallel)]
    errors: list[str] = []
    with (
        ctx.server("warm_pool_node_parallel", command, DEFAULT + extra) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as client,
    ):
        wait_pool_ready(client)
        sids = [create(client) for _ in range(p.parallel)]
        time.sleep(0.5)
        gate = threading.Barrier(p.parallel + 1)

        def one(sid: str) -> None:
            with httpx.Client(base_url=srv.url, timeout=120) as own:
                gate.wait()
                for _ in range(p.parallel_turns):
                    try:
                        first_event_turn(own, sid)
                    except (BenchError, httpx.HTTPError) as exc:
                        errors.append(str(exc)[:300])

        threads = [threading.Thread(target=one, args=(sid,)) for sid in sids]
        for t in threads:
            t.start()
        gate.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join(300)
        wall = time.perf_counter() - t0
    if errors:
        raise BenchError(f"parallel turns failed: {errors[:3]}")
    return {"wall_s": round(wall, 3)}


@scenario(
    "warm-pool-node",
    "warm-pool-node",
    full=Sizes(),
    quick=Sizes(turns=6, spaced_turns=3, parallel=4, parallel_turns=2),
)
def warm_pool_node(ctx: Context, p: Sizes) -> Result:
    """0.85 s CPU-burning load, default pool flags vs off: back to back, 3 s apart, 8 x 3
    parallel  [short turns p50 <= 0.5 x cold, max <= cold p50; 0.4 s turns p50 <= 0.2 x cold,
    max <= 0.6 x cold; spaced p50 <= 50 ms; parallel within 10 % of the CPU bound]

    Issue 23's targets.  Every adapter burns CPU (its load and its turn), none sleeps.
    """
    res = Result("warm-pool-node", f"Node-shaped adapter ({p.burn_ms} ms of CPU before stdin)")
    short, long_ = _command(p, p.short_ms), _command(p, p.long_ms)
    cold = _series(ctx, "wpn_short_off", short, OFF, p.turns, 0.0)
    warm = _series(ctx, "wpn_short_on", short, DEFAULT, p.turns, 0.0)
    cold_long = _series(ctx, "wpn_long_off", long_, OFF, p.turns, 0.0)
    warm_long = _series(ctx, "wpn_long_on", long_, DEFAULT, p.turns, 0.0)
    spaced = _series(ctx, "wpn_spaced", short, DEFAULT, p.spaced_turns, p.spacing)
    par = _parallel(ctx, p, short)
    res.details = {
        "burn_ms": p.burn_ms,
        "short_off": cold,
        "short_on": warm,
        "long_off": cold_long,
        "long_on": warm_long,
        "spaced_on": spaced,
        "parallel": par,
    }
    for label, off, on, p50_x, max_x in (
        (f"{p.short_ms} ms turns", cold, warm, 0.5, 1.0),
        (f"{p.long_ms} ms turns", cold_long, warm_long, 0.2, 0.6),
    ):
        c50 = off["first_event"]["p50_ms"]
        res.add(f"{p.turns} back to back, {label}, pool off: first event p50", c50, "ms")
        res.add("  pool off: max", off["first_event"]["max_ms"], "ms")
        on50, onmax = on["first_event"]["p50_ms"], on["first_event"]["max_ms"]
        res.add(
            "  default flags: p50",
            on50,
            "ms",
            f"<= {p50_x * c50:,.0f} ({p50_x} x cold)",
            on50 <= p50_x * c50,
        )
        res.add(
            "  default flags: max",
            onmax,
            "ms",
            f"<= {max_x * c50:,.0f} ({max_x} x cold p50)",
            onmax <= max_x * c50,
        )
        after = on["pool_after"] or {}
        res.add("  pool target after / load ms", after.get("target", 0), "procs")
        res.metrics[-1].unit = f"procs / {after.get('loadMs') or 0:,} ms"
    sp = spaced["first_event"]
    res.add(f"{p.spaced_turns} turns {p.spacing:g} s apart: p50", sp["p50_ms"], "ms", "<= 50")
    res.metrics[-1].met = sp["p50_ms"] <= 50
    res.add("  spaced: max", sp["max_ms"], "ms")
    loads = p.parallel * p.parallel_turns
    cores = len(os.sched_getaffinity(0))
    bound = loads * p.burn_ms / 1000 / cores
    res.add(
        f"{p.parallel} sessions x {p.parallel_turns} turns in parallel: wall",
        par["wall_s"],
        "s",
        f"<= {1.1 * bound:.2f} (CPU bound {bound:.2f} s + 10 %)",
        par["wall_s"] <= 1.1 * bound,
    )
    return res
