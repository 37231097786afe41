"""Scenario l: an adapter that burns 1 s of CPU before it reads stdin (as Node loads):
20 turns back to back (pool off, then ``--warm-adapters 1`` and ``2``), 10 turns 2 s
apart, 3 bursts of 4; the time to each turn's first event."""

from __future__ import annotations

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


@dataclass(frozen=True)
class Sizes:
    burn_ms: int = 1000  # the CPU-burning start-up
    turns: int = 20  # back to back, per mode
    pools: tuple[tuple[str, ...], ...] = (  # back to back with the pool on, each
        ("--warm-adapters", "1", "--warm-adapters-max", "4"),
        ("--warm-adapters", "2", "--warm-adapters-max", "4"),
    )
    spaced_turns: int = 10
    spacing: float = 2.0
    burst: int = 4
    bursts: int = 3
    burst_gap: float = 4.0
    burst_pool: tuple[str, ...] = ("--warm-adapters", "2", "--warm-adapters-max", "4")


def _series(
    ctx: Context, p: Sizes, name: str, flags: list[str], turns: int, spacing: float
) -> dict[str, Any]:
    """``turns`` sequential turns, each on a new session, ``spacing`` s apart start to
    start (0: back to back, each sent as soon as the previous one has ended)."""
    samples: list[dict[str, Any]] = []
    pool = flags[-1] != "0"
    with (
        ctx.server(name, adapter_command("burn", str(p.burn_ms), "1"), flags) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as client,
    ):
        sids = [create(client) for _ in range(turns)]
        before = wait_pool_ready(client) if pool else pool_json(client)
        time.sleep(0.5)
        start = time.perf_counter()
        for i, sid in enumerate(sids):
            if spacing:
                time.sleep(max(0.0, start + i * spacing - time.perf_counter()))
            samples.append(first_event_turn(client, sid))
        after = pool_json(client)
    first = [s["first_event_s"] for s in samples]
    return {
        "flags": flags,
        "pool_before": before,
        "pool_after": after,
        "first_event": latency_summary(first),
        "turns": samples,
    }


def _burst(clients: list[httpx.Client], sids: list[str]) -> list[dict[str, Any]]:
    """One turn per client, all released at once (a thread each); their results."""
    gate = threading.Barrier(len(sids))
    out: list[dict[str, Any]] = [{} for _ in sids]

    def one(i: int, sid: str) -> None:
        gate.wait()
        try:
            out[i] = first_event_turn(clients[i], sid)
        except (BenchError, httpx.HTTPError) as exc:
            out[i] = {"error": str(exc)[:300]}

    threads = [threading.Thread(target=one, args=(i, sid)) for i, sid in enumerate(sids)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def _bursts(ctx: Context, p: Sizes, name: str, flags: list[str]) -> dict[str, Any]:
    """``bursts`` bursts of ``burst`` concurrent turns, ``burst_gap`` s apart."""
    n = p.burst
    bursts: list[dict[str, Any]] = []
    pool = flags[-1] != "0"
    extra = ["--max-concurrent-turns", str(4 * n), "--max-sessions", "0"]
    with (
        ctx.server(name, adapter_command("burn", str(p.burn_ms), "1"), flags + extra) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as client,
    ):
        clients = [httpx.Client(base_url=srv.url, timeout=60) for _ in range(n)]
        try:
            if pool:
                wait_pool_ready(client)
            time.sleep(0.5)
            for b in range(p.bursts):
                if b:
                    time.sleep(p.burst_gap)
                sids = [create(client) for _ in range(n)]
                state = pool_json(client)
                out = _burst(clients, sids)
                errors = [o for o in out if "error" in o or not o]
                if errors:
                    raise BenchError(f"burst {b + 1}: {len(errors)} of {n} turns failed: {errors}")
                first = [o["first_event_s"] for o in out]
                bursts.append(
                    {"pool_before": state, "first_event": latency_summary(first), "turns": out}
                )
            after = pool_json(client)
        finally:
            for c in clients:
                c.close()
    return {"flags": flags + extra, "bursts": bursts, "pool_after": after}


@scenario("l", "cpu-slow-start", full=Sizes(), quick=Sizes(turns=6, spaced_turns=3, bursts=1))
def cpu_slow_start(ctx: Context, p: Sizes) -> Result:
    """an adapter burning 1 s of CPU before stdin: back to back, spaced, bursts  [warm p50 <= 0.5 x
    cold; spaced p50 <= 60 ms; burst p50 <= 0.6 x cold]

    A start-up that burns CPU (as Node's does): is warm really ready, and does it keep up?
    """
    burn = p.burn_ms
    res = Result("l", f"CPU-burning slow start ({burn} ms of CPU before stdin)")
    off = ["--in-memory", "--warm-adapters", "0"]
    cold = _series(ctx, p, "l_b2b_off", off, p.turns, 0.0)
    warm = [
        _series(ctx, p, f"l_b2b_on{i}", ["--in-memory", *flags], p.turns, 0.0)
        for i, flags in enumerate(p.pools, start=1)
    ]
    spaced_flags = ["--in-memory", "--warm-adapters", "1"]
    spaced = _series(ctx, p, "l_spaced", spaced_flags, p.spaced_turns, p.spacing)
    burst_off = _bursts(ctx, p, "l_burst_off", off)
    burst_on = _bursts(ctx, p, "l_burst_on", ["--in-memory", *p.burst_pool])
    res.details = {
        "burn_ms": burn,
        "back_to_back_off": cold,
        "back_to_back_on": warm,
        "spaced_on": spaced,
        "burst_off": burst_off,
        "burst_on": burst_on,
    }
    cold_p50 = cold["first_event"]["p50_ms"]
    res.add(f"{p.turns} back to back, pool off: first event p50", cold_p50, "ms", "(cold)")
    res.add("  pool off: max", cold["first_event"]["max_ms"], "ms")
    half = round(cold_p50 / 2, 1)
    for series in warm:
        on = series["first_event"]
        flags = " ".join(series["flags"][1:])
        res.add(
            f"{p.turns} back to back, {flags}: p50",
            on["p50_ms"],
            "ms",
            f"<= {half:,} (0.5 x cold)",
            on["p50_ms"] <= half,
        )
        res.add("  max", on["max_ms"], "ms", f"<= {cold_p50:,} (cold p50)")
        res.metrics[-1].met = on["max_ms"] <= cold_p50
        fast = sum(1 for t in series["turns"] if t["first_event_s"] < burn / 2000)
        res.add("  turns faster than half the burn", fast, f"of {p.turns}")
        load = series["pool_after"]
        res.add("  load time / its CPU (/readyz loadMs, loadCpuMs)", load.get("loadMs") or 0, "ms")
        res.metrics[-1].unit = f"ms / {load.get('loadCpuMs') or 0:,} ms"
        res.add("  pool target after", load["target"], "procs")
    sp = spaced["first_event"]
    res.add(
        f"{p.spaced_turns} turns {p.spacing:g} s apart, --warm-adapters 1: p50",
        sp["p50_ms"],
        "ms",
        "<= 60",
        sp["p50_ms"] <= 60,
    )
    res.add("  spaced: max", sp["max_ms"], "ms")
    b_off = burst_off["bursts"][0]["first_event"]["p50_ms"]
    b_on = burst_on["bursts"][0]["first_event"]
    limit = round(0.6 * b_off, 1)
    res.add(f"burst of {p.burst}, pool off: p50", b_off, "ms", "(cold)")
    res.add(
        f"burst of {p.burst}, {' '.join(p.burst_pool)}: p50",
        b_on["p50_ms"],
        "ms",
        f"<= {limit:,} (0.6 x cold)",
        b_on["p50_ms"] <= limit,
    )
    res.add("  first burst: max", b_on["max_ms"], "ms")
    for i, burst in enumerate(burst_on["bursts"][1:], start=2):
        res.add(
            f"  burst {i} ({burst['pool_before']['ready']} ready): p50",
            burst["first_event"]["p50_ms"],
            "ms",
        )
    return res
