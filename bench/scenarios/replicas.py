"""Scenario n: two replicas (two ``trioserve run`` on one PostgreSQL schema), 64 x 5 with
every session's turns on one replica, then alternating between the two: turns/s of
each, and the CPU per turn of the servers and of PostgreSQL."""

from __future__ import annotations

import statistics

import trio

from bench.adapter import adapter_command
from bench.pg import pg_meter, pg_store
from bench.procinfo import tree_meter
from bench.results import Result
from bench.scenarios import scenario
from bench.scenarios.concurrent_turns import Sizes, run_rounds
from bench.server import Context


@scenario("n", "replicas", full=Sizes(), quick=Sizes(rounds=1))
def replicas(ctx: Context, p: Sizes) -> Result:
    """two replicas on one PostgreSQL schema: 64 x 5 on one, then alternating between both"""
    s, t = p.sessions, p.turns
    res = Result("n", f"two replicas on one PostgreSQL schema: {s}x{t} turns, one vs both")
    with pg_store("n") as (url, app):
        flags = ["--store", url, "--max-concurrent-turns", str(s), "--max-sessions", "0"]
        with (
            ctx.server("n-a", adapter_command("1"), flags) as a,
            ctx.server("n-b", adapter_command("1"), flags) as b,
        ):
            db = pg_meter(app)
            one = trio.run(run_rounds, [a.url], s, t, p.rounds, tree_meter(a.pid), db)
            two = trio.run(run_rounds, [a.url, b.url], s, t, p.rounds, tree_meter(a.pid, b.pid), db)
    res.details = {"client": "each session's turns alternate between the replicas", "one": one}
    res.details["two"] = two
    for label, rounds in (("one replica", one), ("two replicas", two)):
        res.add(
            f"{label}: turns/s (median)", statistics.median(r["turns_per_s"] for r in rounds), "/s"
        )
        res.add("  load average (1 min) before", max(r["loadavg_1min_before"] for r in rounds), "")
        res.add("  64x5 wall (median)", statistics.median(r["wall_s"] for r in rounds), "s")
        per_turn = statistics.median(r["server_cpu_ms_per_turn"] for r in rounds)
        res.add("  servers' CPU per turn", per_turn, "ms")
        res.add(
            "  PostgreSQL CPU per turn",
            statistics.median(r["db_cpu_ms_per_turn"] for r in rounds),
            "ms",
        )
    return res
