"""Scenario h: the warm pool against a slow-starting adapter (1.5 s before it reads its
spec), turns 2 s apart: the turn latency with ``--warm-adapters 1`` and without."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx

from bench.adapter import adapter_command
from bench.client import create, started_data, stream_turn, wait_pool_full, warm_state
from bench.results import Result, latency_summary, ms, percentile
from bench.scenarios import scenario
from bench.server import Context


@dataclass(frozen=True)
class Sizes:
    sleep_ms: int = 1500  # the adapter's start-up
    spacing: float = 2.0  # seconds, start to start
    turns: int = 10  # per mode (pool on, pool off)


def _slow_turns(
    ctx: Context, name: str, warm: int, turns: int, spacing: float, sleep_ms: int
) -> dict[str, Any]:
    """``turns`` sequential turns ``spacing`` s apart (start to start), alternately on a
    new session and on the previous turn's session."""
    flags = ["--in-memory", "--warm-adapters", str(warm)]
    samples: list[dict[str, Any]] = []
    with (
        ctx.server(name, adapter_command("slow", str(sleep_ms), "1"), flags) as srv,
        httpx.Client(base_url=srv.url, timeout=30) as client,
    ):
        fill = wait_pool_full(client) if warm else 0.0
        pool_state = warm_state(client)
        time.sleep(spacing)  # the pool's first adapter has finished loading by now
        sid = ""
        start = time.perf_counter()
        for i in range(turns):
            new = i % 2 == 0
            if new:
                sid = create(client)
            time.sleep(max(0.0, start + i * spacing - time.perf_counter()))
            timing = stream_turn(client, sid)
            elapsed, started = timing.ended, started_data(timing.body)
            samples.append(
                {
                    "seconds": round(elapsed, 4),
                    "session": "new" if new else "same",
                    "adapter_idle_ms": started.get("idleMs"),
                }
            )
    latencies = [s["seconds"] for s in samples]
    return {
        "flags": flags,
        "pool_fill_seconds": round(fill, 3),
        "pool_at_start": f"{pool_state[0]}/{pool_state[1]}",
        "turn_latency": latency_summary(latencies),
        "new_session_p50_ms": ms(
            percentile([s["seconds"] for s in samples if s["session"] == "new"], 50)
        ),
        "same_session_p50_ms": ms(
            percentile([s["seconds"] for s in samples if s["session"] == "same"] or [0.0], 50)
        ),
        "turns": samples,
    }


@scenario("h", "warm-pool-spaced", full=Sizes(), quick=Sizes(turns=3))
def warm_pool_spaced(ctx: Context, p: Sizes) -> Result:
    """slow-start adapter (1.5 s before it reads stdin), turns 2 s apart, --warm-adapters 1 vs 0
    [on p50 <= 60 ms; off >= 1.5 s]

    A slow-starting adapter (1.5 s before it reads its spec), turns 2 s apart.
    """
    sleep_ms, n = p.sleep_ms, p.turns
    res = Result("h", f"slow-start adapter ({sleep_ms} ms), {n} turns {p.spacing:g} s apart")
    on = _slow_turns(ctx, "h_pool_on", 1, n, p.spacing, sleep_ms)
    off = _slow_turns(ctx, "h_pool_off", 0, n, p.spacing, sleep_ms)
    res.details = {"adapter_sleep_ms": sleep_ms, "spacing_s": p.spacing, "on": on, "off": off}
    on_p50, off_p50 = on["turn_latency"]["p50_ms"], off["turn_latency"]["p50_ms"]
    res.add("pool on (--warm-adapters 1) turn p50", on_p50, "ms", "<= 60 ms", on_p50 <= 60)
    res.add("  pool on: turn p90", on["turn_latency"]["p90_ms"], "ms")
    res.add("  pool on: max", on["turn_latency"]["max_ms"], "ms")
    res.add("  pool on: new session p50", on["new_session_p50_ms"], "ms")
    res.add("  pool on: same session p50", on["same_session_p50_ms"], "ms")
    target = f">= {sleep_ms:,} ms (baseline)"
    res.add("pool off (--warm-adapters 0) turn p50", off_p50, "ms", target, off_p50 >= sleep_ms)
    res.add("  pool off: turn p90", off["turn_latency"]["p90_ms"], "ms")
    res.add("  pool off: max", off["turn_latency"]["max_ms"], "ms")
    res.add("  off p50 / on p50", round(off_p50 / on_p50, 1), "x")
    return res
