"""Scenario k: ``GET /v1/sessions?limit=50`` over 100,000 sessions in SQLite: the first
page, deep pages (by token and by session id), filtered pages, every page in turn,
and the unpaged v0.8 list."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import BenchError
from bench.adapter import adapter_command
from bench.procinfo import cpu_seconds, rss_mib
from bench.results import Result, latency_summary, ms, percentile
from bench.scenarios import scenario
from bench.server import Context


@dataclass(frozen=True)
class Sizes:
    sessions: int = 100_000
    requests: int = 500  # per kind of page


#: A CompiledSpec as the bench agent's sessions store it (each row keeps one).
K_SPEC = json.dumps(
    {
        "v": 1,
        "metadata": {"name": "bench"},
        "model": {"provider": "anthropic", "name": "bench-model"},
        "task": "bench",
        "tools": [],
        "extensions": [],
        "skills": [],
        "runtime": {"type": "echo", "command": ["bench/.build/tinyadapter", "1"]},
    },
    separators=(",", ":"),
)


def _k_fill(db: Path, n: int) -> dict[str, Any]:
    """Insert ``n`` sessions straight into the (migrated) file, in one transaction.

    Every 100th is active, every 10th expired, the rest ended; two sessions
    share each activity time (ties are broken by id), ten seconds apart, all
    within the last 6 days, so neither the TTL nor the retention touches them.
    """
    now = int(time.time() * 1_000_000)
    rows = []
    for i in range(n):
        last = now - ((n - i) // 2) * 10_000_000
        status = "active" if i % 100 == 0 else "expired" if i % 10 == 1 else "ended"
        ended = None if status == "active" else last + 1_000_000
        sid = f"s_bench{i:07d}{(i * 2654435761) % 2**32:08x}"
        rows.append((sid, "bench", "echo", status, last - 60_000_000, last, K_SPEC, "{}", ended))
    t0 = time.perf_counter()
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO sessions (id, agent_name, runtime_type, status, created_at, "
            "last_active_at, spec, inputs, ended_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return {"fill_seconds": round(time.perf_counter() - t0, 2), "db_mib": file_mib(db)}


def file_mib(path: Path) -> float:
    return round(path.stat().st_size / 2**20, 1)


def _k_ids(db: Path, where: str = "") -> list[str]:
    """Every session id in the list's order (what the pages must add up to)."""
    conn = sqlite3.connect(db)
    try:
        sql = f"SELECT id FROM sessions {where} ORDER BY last_active_at DESC, id DESC"
        return [sid for (sid,) in conn.execute(sql)]
    finally:
        conn.close()


def _k_get(client: httpx.Client, target: str) -> tuple[float, list[str], str | None]:
    t0 = time.perf_counter()
    r = client.get(target)
    elapsed = time.perf_counter() - t0
    if r.status_code != 200:
        raise BenchError(f"GET {target}: HTTP {r.status_code} {r.text[:200]}")
    return elapsed, [s["id"] for s in r.json()], r.headers.get("Trioserve-Next-Page")


def _k_measure(
    client: httpx.Client, target: str, expected: list[str], iters: int, warmup: int = 20
) -> dict[str, Any]:
    """``iters`` timed GETs of ``target`` (after ``warmup``), each checked against ``expected``."""
    samples = []
    for i in range(warmup + iters):
        elapsed, got, _ = _k_get(client, target)
        if got != expected:
            raise BenchError(f"GET {target}: {got[:3]}... is not {expected[:3]}...")
        if i >= warmup:
            samples.append(elapsed)
    return {"target": target, **latency_summary(samples)}


@scenario("k", "paging", full=Sizes(), quick=Sizes(sessions=20_000, requests=100))
def paging(ctx: Context, p: Sizes) -> Result:
    """GET /v1/sessions?limit=50 over 100,000 SQLite sessions, first and deep pages  [p50 < 5 ms]

    ``GET /v1/sessions?limit=50``: first and deep pages over 100,000 SQLite sessions.
    """
    n, iters = p.sessions, p.requests
    res = Result("k", f"GET /v1/sessions?limit=50 over {n:,} sessions in SQLite")
    db = ctx.tmp / "k" / "sessions.db"
    flags = ["--store", f"sqlite:{db}", "--max-sessions", "0"]
    with ctx.server("k_migrate", adapter_command("1"), flags):
        pass  # the server makes the file and its schema
    fill = _k_fill(db, n)
    order = _k_ids(db)
    ended = _k_ids(db, "WHERE status = 'ended'")
    if len(order) != n:
        raise BenchError(f"the store holds {len(order)} sessions, not {n}")
    mid, deep = n // 2, n - 100
    pages: dict[str, dict[str, Any]] = {}
    with (
        ctx.server("k", adapter_command("1"), flags) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as client,
    ):
        health = []  # the HTTP floor at the same time, for comparison
        cpu0 = cpu_seconds(srv.pid)
        for _ in range(iters):
            t0 = time.perf_counter()
            client.get("/healthz").raise_for_status()
            health.append(time.perf_counter() - t0)
        cpu_health = (cpu_seconds(srv.pid) - cpu0) / iters
        cpu0 = cpu_seconds(srv.pid)
        pages["first"] = _k_measure(client, "/v1/sessions?limit=50", order[:50], iters)
        cpu_first = (cpu_seconds(srv.pid) - cpu0) / (iters + 20)
        for name, depth in (("middle", mid), ("deepest", deep)):
            # a token from the API: the next page after the page ending at depth - 1
            _, _, token = _k_get(client, f"/v1/sessions?limit=1&before={order[depth - 2]}")
            expected = order[depth : depth + 50]
            target = f"/v1/sessions?limit=50&before={token}"
            pages[f"{name} (token)"] = _k_measure(client, target, expected, iters)
            target = f"/v1/sessions?limit=50&before={order[depth - 1]}"
            pages[f"{name} (session id)"] = _k_measure(client, target, expected, iters)
        active = [sid for sid in order if int(sid[7:14]) % 100 == 0]
        target = "/v1/sessions?status=active&limit=50"
        pages["first, status=active"] = _k_measure(client, target, active[:50], iters)
        _, _, token = _k_get(
            client, f"/v1/sessions?status=ended&limit=1&before={ended[len(ended) // 2 - 2]}"
        )
        target = f"/v1/sessions?status=ended&limit=50&before={token}"
        expected = ended[len(ended) // 2 : len(ended) // 2 + 50]
        pages["middle, status=ended (token)"] = _k_measure(client, target, expected, iters)
        # every session, following the pages of 1,000: each once, in order
        t0 = time.perf_counter()
        walked: list[str] = []
        token = None
        while True:
            target = "/v1/sessions?limit=1000" + (f"&before={token}" if token else "")
            _, got, token = _k_get(client, target)
            walked += got
            if token is None:
                break
        walk = time.perf_counter() - t0
        if walked != order:
            raise BenchError(f"the pages hold {len(walked)} sessions, not the {n} in order")
        # the v0.8 behaviour: no limit, every session in one response
        t0 = time.perf_counter()
        r = client.get("/v1/sessions")
        unpaged = time.perf_counter() - t0
        if r.status_code != 200 or len(r.json()) != n:
            raise BenchError(f"GET /v1/sessions: HTTP {r.status_code}, not {n} sessions")
        unpaged_mib = round(len(r.content) / 2**20, 1)
        rss = rss_mib(srv.pid, "VmHWM")
    res.details = {
        "sessions": n,
        **fill,
        "requests_per_page_kind": iters,
        "client": "httpx.Client (sync, one keep-alive connection)",
        "pages": pages,
        "server_cpu_ms_per_first_page": ms(cpu_first),
        "healthz": latency_summary(health),
        "server_cpu_ms_per_healthz": ms(cpu_health),
        "walk_pages_of_1000_s": round(walk, 3),
        "unpaged_s": round(unpaged, 3),
        "unpaged_mib": unpaged_mib,
        "server_rss_peak_mib": rss,
    }
    for name, page in pages.items():
        p50 = page["p50_ms"]
        target = "< 5 ms" if name in ("first", "deepest (token)") else ""
        res.add(f"{name}: p50", p50, "ms", target, p50 < 5 if target else None)
        res.add(f"  {name}: p99", page["p99_ms"], "ms")
    res.add("  server CPU per first page", ms(cpu_first), "ms")
    res.add("  GET /healthz p50 (the HTTP floor, same server)", ms(percentile(health, 50)), "ms")
    res.add("  server CPU per GET /healthz", ms(cpu_health), "ms")
    res.add(f"every session, {-(-n // 1000)} pages of 1,000", round(walk, 3), "s")
    res.add(f"  no limit (v0.8): all {n:,} at once", round(unpaged, 3), "s")
    res.add("  no limit: response size", unpaged_mib, "MiB")
    res.add("  server RSS peak (VmHWM)", rss, "MiB")
    res.add(f"  filling the store ({n:,} rows, one transaction)", fill["fill_seconds"], "s")
    return res
