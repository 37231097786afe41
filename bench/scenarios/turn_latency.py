"""Scenario a: create + one turn end to end, sequential (the latency of one request at a
time), with the server CPU per request, ``/healthz`` for the HTTP floor, and the cost
of spawning the adapter without any server (the floor under a turn)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
import trio

from bench import BenchError
from bench.adapter import ADAPTER, adapter_command
from bench.client import JSON_HEADERS, RawConn, check_sse
from bench.procinfo import cpu_seconds, rss_mib
from bench.results import Result, latency_summary, ms, percentile
from bench.scenarios import scenario
from bench.server import Context


@dataclass(frozen=True)
class Sizes:
    warmup: int = 20
    iters: int = 300
    spawn_iters: int = 100


def _pdeathsig_hook() -> Callable[[], None]:
    """The same preexec hook as the server's (PR_SET_PDEATHSIG=SIGKILL via libc)."""
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

    def hook() -> None:
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)

    return hook


async def _trio_spawn_samples(iters: int, spec: bytes, **kwargs: Any) -> list[float]:
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        proc = await trio.lowlevel.open_process(
            [str(ADAPTER), "1"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            **kwargs,
        )
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        await proc.stdin.send_all(spec)
        await proc.stdin.aclose()
        while await proc.stdout.receive_some(65536):
            pass
        await proc.wait()
        samples.append(time.perf_counter() - t0)
        await proc.stdout.aclose()
        await proc.stderr.aclose()
    return samples


def spawn_floor(iters: int) -> dict[str, float]:
    """p50 of running the adapter from the bench process itself (no server, no HTTP).

    ``preexec_fn`` (the server sets one for PR_SET_PDEATHSIG) makes CPython use
    fork() instead of vfork(), which costs more the bigger the parent is.
    """
    spec = b'{"sessionId":"s_x","task":"bench"}'
    hook = _pdeathsig_hook()

    def run(**kwargs: Any) -> float:
        samples = []
        for _ in range(iters):
            t0 = time.perf_counter()
            subprocess.run(
                [str(ADAPTER), "1"], input=spec, capture_output=True, check=True, **kwargs
            )
            samples.append(time.perf_counter() - t0)
        return ms(percentile(samples, 50))

    like_server = {"start_new_session": True, "preexec_fn": hook}
    return {
        "subprocess_plain_p50_ms": run(),
        "subprocess_new_session_p50_ms": run(start_new_session=True),
        "subprocess_new_session_preexec_p50_ms": run(**like_server),
        "trio_open_process_new_session_p50_ms": ms(
            percentile(
                trio.run(partial(_trio_spawn_samples, iters, spec, start_new_session=True)), 50
            )
        ),
        "trio_open_process_like_server_p50_ms": ms(
            percentile(trio.run(partial(_trio_spawn_samples, iters, spec, **like_server)), 50)
        ),
        "bench_process_rss_mib": rss_mib(os.getpid()),
    }


async def raw_create_turns(url: str, warmup: int, iters: int) -> list[float]:
    """Seconds of each create + turn (``tinyadapter 1``) over one ``RawConn``, after
    ``warmup`` not counted; also scenario go-peer's loop."""
    conn = await RawConn.open(url)
    samples = []
    try:
        for i in range(warmup + iters):
            t0 = time.perf_counter()
            sid = await conn.create_session()
            status, _, body = await conn.request(
                "POST", f"/v1/sessions/{sid}/turns", b'{"input":"hi"}'
            )
            elapsed = time.perf_counter() - t0
            if status != 200:
                raise BenchError(f"turn: HTTP {status}")
            check_sse(body, 3)
            if i >= warmup:
                samples.append(elapsed)
    finally:
        await conn.aclose()
    return samples


@scenario("a", "turn-latency", full=Sizes(), quick=Sizes(warmup=5, iters=50, spawn_iters=20))
def turn_latency(ctx: Context, p: Sizes) -> Result:
    """create + one turn end to end, sequential, sync httpx.Client  [p50 <= 2 ms]"""
    res = Result("a", "create + one turn end to end (sequential, sync httpx.Client)")
    total: list[float] = []
    create: list[float] = []
    turn: list[float] = []
    health: list[float] = []
    cpu0 = 0.0
    with (
        ctx.server("a", adapter_command("1"), ["--in-memory", "--max-sessions", "0"]) as srv,
        httpx.Client(base_url=srv.url, timeout=30) as client,
    ):
        for i in range(p.warmup + p.iters):
            if i == p.warmup:
                cpu0 = cpu_seconds(srv.pid)
            t0 = time.perf_counter()
            r = client.post("/v1/sessions", content=b"{}", headers=JSON_HEADERS)
            t1 = time.perf_counter()
            if r.status_code != 201:
                raise BenchError(f"create: HTTP {r.status_code} {r.text[:200]}")
            sid = r.json()["id"]
            t2 = time.perf_counter()
            r = client.post(
                f"/v1/sessions/{sid}/turns", content=b'{"input":"hi"}', headers=JSON_HEADERS
            )
            body = r.content
            t3 = time.perf_counter()
            if r.status_code != 200:
                raise BenchError(f"turn: HTTP {r.status_code} {r.text[:200]}")
            check_sse(body, 3)
            if i >= p.warmup:
                total.append(t3 - t0)
                create.append(t1 - t0)
                turn.append(t3 - t2)
        cpu_per_iter = (cpu_seconds(srv.pid) - cpu0) / p.iters
        cpu0 = cpu_seconds(srv.pid)
        for _ in range(p.iters):
            t0 = time.perf_counter()
            client.get("/healthz").raise_for_status()
            health.append(time.perf_counter() - t0)
        cpu_per_health = (cpu_seconds(srv.pid) - cpu0) / p.iters
        raw = trio.run(raw_create_turns, srv.url, p.warmup, p.iters)
    summary = latency_summary(total)
    res.details = {
        "client": "httpx.Client (sync, one keep-alive connection)",
        "warmup": p.warmup,
        "create_plus_turn": summary,
        "create_only": latency_summary(create),
        "turn_only": latency_summary(turn),
        "server_cpu_ms_per_iteration": ms(cpu_per_iter),
        "server_cpu_ms_per_healthz": ms(cpu_per_health),
        "healthz_round_trip": latency_summary(health),
        "raw_client_create_plus_turn": latency_summary(raw),
        "adapter_spawn_floor_no_server": spawn_floor(p.spawn_iters),
    }
    p50 = summary["p50_ms"]
    res.add("create+turn p50", p50, "ms", "<= 2 ms", p50 <= 2.0)
    res.add("create+turn p90", summary["p90_ms"], "ms")
    res.add("create+turn p99", summary["p99_ms"], "ms")
    res.add("  server CPU per create+turn", ms(cpu_per_iter), "ms")
    res.add("  create only p50", res.details["create_only"]["p50_ms"], "ms")
    res.add("  turn only p50", res.details["turn_only"]["p50_ms"], "ms")
    res.add("  GET /healthz p50", res.details["healthz_round_trip"]["p50_ms"], "ms")
    res.add("  server CPU per GET /healthz", ms(cpu_per_health), "ms")
    res.add("  raw-socket client p50", res.details["raw_client_create_plus_turn"]["p50_ms"], "ms")
    floor = res.details["adapter_spawn_floor_no_server"]
    res.add("  spawn floor, vfork (no server)", floor["trio_open_process_new_session_p50_ms"], "ms")
    res.add("  spawn floor, fork+preexec", floor["trio_open_process_like_server_p50_ms"], "ms")
    return res
