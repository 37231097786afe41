"""Scenario m: c's 64 x 5 and creates/s without a cap on one server: in memory, SQLite,
then PostgreSQL (a fresh schema) with ``--workers`` 1 and 2; CPU over the supervisor and
its workers, RSS per worker, the PostgreSQL backends' CPU and round trips."""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any

import httpx
import trio

from bench import BenchError
from bench.adapter import adapter_command
from bench.client import check_sse, create
from bench.pg import pg_meter, pg_segments, pg_store
from bench.procinfo import rss_mib, server_workers, tree_meter
from bench.results import Result
from bench.scenarios import scenario
from bench.scenarios.concurrent_turns import run_rounds
from bench.scenarios.create_rate import create_sessions
from bench.server import Context


@dataclass(frozen=True)
class Sizes:
    sessions: int = 64  # c's rounds
    turns: int = 5
    rounds: int = 3
    creates: int = 3000  # creates without a cap, per configuration
    clients: int = 16  # enough connections for SO_REUSEPORT to spread over the workers
    trips: int = 50  # sequential creates, then turns, whose PostgreSQL round trips are counted
    workers: tuple[int, ...] = (1, 2)  # --workers values on PostgreSQL (bench --workers)


def _worker_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(n) for n in text.split(",") if n.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated numbers, not {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError("at least one number, each >= 1")
    return counts


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workers",
        type=_worker_counts,
        default=None,
        metavar="N[,N...]",
        help="scenario m: the --workers values run on PostgreSQL (default: 1,2)",
    )


def _pg_round_trips(url: str, app: str, n: int) -> dict[str, float]:
    """Sequential creates, then sequential turns: the backends' segments per create and per turn."""
    with httpx.Client(base_url=url, timeout=30) as client:
        sid = create(client)  # warm-up: the connection pool has a connection
        before = pg_segments(app)
        for _ in range(n):
            create(client)
        mid = pg_segments(app)
        for _ in range(n):
            resp = client.post(f"/v1/sessions/{sid}/turns", json={"input": "hi"})
            if resp.status_code != 200:
                raise BenchError(f"turn: HTTP {resp.status_code} {resp.text[:200]}")
            check_sse(resp.content, 3)
        after = pg_segments(app)
    return {
        "round_trips_per_create": round((mid["out"] - before["out"]) / n, 2),
        "requests_per_create": round((mid["in"] - before["in"]) / n, 2),
        "round_trips_per_turn": round((after["out"] - mid["out"]) / n, 2),
        "requests_per_turn": round((after["in"] - mid["in"]) / n, 2),
    }


def _config(ctx: Context, p: Sizes, name: str, store: list[str], app: str | None) -> dict[str, Any]:
    """Scenario c's rounds, then creates without a cap, on one server (and its workers)."""
    flags = [*store, "--max-concurrent-turns", str(p.sessions), "--max-sessions", "0"]
    with ctx.server(name, adapter_command("1"), flags) as srv:
        cpu = tree_meter(srv.pid)
        db = pg_meter(app) if app else None
        rounds = trio.run(run_rounds, [srv.url], p.sessions, p.turns, p.rounds, cpu, db)
        rss = [rss_mib(pid) for pid in server_workers(srv.pid)]
        creates = trio.run(create_sessions, srv, p.creates, p.clients, cpu, db)
        trips = _pg_round_trips(srv.url, app, p.trips) if app else {}
    return {"flags": flags, "rounds": rounds, "worker_rss_mib": rss, "creates": creates, **trips}


def _metrics(res: Result, label: str, out: dict[str, Any], targets: bool) -> None:
    rounds, creates = out["rounds"], out["creates"]
    wall = statistics.median(r["wall_s"] for r in rounds)
    res.add(f"{label}: 64x5 wall (median)", wall, "s", "<= 0.40 s" if targets else "")
    if targets:
        res.metrics[-1].met = wall <= 0.40
    res.add("  load average (1 min) before", max(r["loadavg_1min_before"] for r in rounds), "")
    per_turn = statistics.median(r["server_cpu_ms_per_turn"] for r in rounds)
    res.add("  server CPU per turn (all processes)", per_turn, "ms")
    db_turn = 0.0
    if "db_cpu_ms_per_turn" in rounds[0]:
        db_turn = statistics.median(r["db_cpu_ms_per_turn"] for r in rounds)
        res.add("  PostgreSQL CPU per turn", db_turn, "ms")
    bound = (per_turn + db_turn) * rounds[0]["turns_ended"] / 2000
    res.add("  64x5 wall if CPU-bound on 2 cores", round(bound, 3), "s")
    res.add("  RSS per worker (max)", max(out["worker_rss_mib"]), "MiB")
    rate = creates["creates_per_s"]
    res.add("  creates/s, no cap", rate, "/s", ">= 5,000" if targets else "")
    if targets:
        res.metrics[-1].met = rate >= 5000
    res.add("  load average (1 min) before creates", creates["loadavg_1min_before"], "")
    res.add("  server CPU per create", creates["server_cpu_ms_per_create"], "ms")
    db_create = creates.get("db_cpu_ms_per_create", 0.0)
    if "db_cpu_ms_per_create" in creates:
        res.add("  PostgreSQL CPU per create", db_create, "ms")
    ceiling = 2000 / (creates["server_cpu_ms_per_create"] + db_create)
    res.add("  creates/s if CPU-bound on 2 cores", round(ceiling), "/s")
    if "round_trips_per_create" in out:
        res.add("  PostgreSQL round trips per create", out["round_trips_per_create"], "")
        res.add("  PostgreSQL round trips per turn", out["round_trips_per_turn"], "")


@scenario(
    "m", "workers", full=Sizes(), quick=Sizes(rounds=1, creates=600, trips=20), options=_options
)
def workers(ctx: Context, p: Sizes) -> Result:
    """c and creates/s on one server: memory, SQLite, PostgreSQL --workers 1 and 2  [workers 2: 64 x
    5 <= 0.40 s, >= 5,000 creates/s]"""
    if ctx.options.workers:
        p = dataclasses.replace(p, workers=ctx.options.workers)
    res = Result(
        "m", f"{p.sessions}x{p.turns} and creates/s: one process vs --workers N on PostgreSQL"
    )
    configs = {"memory": ["--in-memory"], "sqlite": ["--store", f"sqlite:{ctx.tmp / 'm.db'}"]}
    for label, store in configs.items():
        res.details[label] = out = _config(ctx, p, f"m-{label}", store, None)
        _metrics(res, label, out, targets=False)
    for n in p.workers:
        with pg_store(f"m{n}") as (url, app):
            store = ["--store", url, "--workers", str(n)]
            res.details[f"pg-w{n}"] = out = _config(ctx, p, f"m-pg-w{n}", store, app)
        _metrics(res, f"postgresql --workers {n}", out, targets=n == 2)
    return res
