"""Scenario langgraph (issue 30): 64 sessions x 5 turns on LangGraph's own server
(``langgraph dev``, in-memory, 64 jobs, a one-node echo graph: ``bench/langgraph_peer.py``)
against trioserve's built-in echo adapter forked from the fork server, in one run, through
the same client and rounds as scenario c (``RawConn``, one keep-alive connection per
session; the sessions, threads on LangGraph, made and warmed up with one turn first).

A LangGraph turn is ``POST /threads/{id}/runs/stream`` (``stream_mode: values``), read to
the end of its SSE body, which must hold the graph's answer; LangGraph is installed on
first use (a minute, into ``bench/.build/langgraph``).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio

from bench import BenchError
from bench.client import RawConn
from bench.langgraph_peer import JOBS, running, versions
from bench.procinfo import tree_cpu_seconds
from bench.results import Result
from bench.scenarios import scenario
from bench.scenarios.concurrent_turns import Workload, run_rounds
from bench.scenarios.fork_server import MODES
from bench.server import Context

_RUN = json.dumps(
    {"assistant_id": "echo", "input": {"input": "hi"}, "stream_mode": "values"}
).encode()


class LangGraphWorkload(Workload):
    """A thread for a session, a streamed run for a turn."""

    async def create(self, conn: RawConn) -> str:
        status, _, body = await conn.request("POST", "/threads", b"{}")
        if status != 200:
            raise BenchError(f"POST /threads: {status} {body[:200]!r}")
        thread_id: str = json.loads(body)["thread_id"]
        return thread_id

    async def turn(self, conn: RawConn, sid: str) -> None:
        status, _, body = await conn.request("POST", f"/threads/{sid}/runs/stream", _RUN)
        if status != 200:
            raise BenchError(f"LangGraph run: HTTP {status} {body[:200]!r}")
        if b"echo: hi" not in body or b"event: error" in body:
            raise BenchError(f"LangGraph run: unexpected stream {body[-300:]!r}")


@dataclass(frozen=True)
class Sizes:
    sessions: int = 64
    turns: int = 5
    rounds: int = 3


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "wall_s_median": statistics.median(r["wall_s"] for r in rounds),
        "cpu_ms_per_turn": statistics.median(r["server_cpu_ms_per_turn"] for r in rounds),
        "rounds": rounds,
    }


@scenario("langgraph", "langgraph", full=Sizes(), quick=Sizes(rounds=1))
def langgraph(ctx: Context, p: Sizes) -> Result:
    """64 x 5 on LangGraph's dev server against trioserve's forked echo, same client
    [trioserve <= 0.3 x LangGraph]
    """
    res = Result("langgraph", f"{p.sessions} x {p.turns}: LangGraph dev server, trioserve fork")
    with running(ctx.tmp / "langgraph") as (url, pid):
        lg = _summary(
            trio.run(
                partial(run_rounds, workload=LangGraphWorkload()),
                [url],
                p.sessions,
                p.turns,
                p.rounds,
                partial(tree_cpu_seconds, pid),
            )
        )
    flags = ["--in-memory", "--max-concurrent-turns", str(p.sessions), "--max-sessions", "0"]
    with ctx.server("langgraph-trioserve", "", [*flags, *MODES["fork"]]) as srv:
        ts = _summary(
            trio.run(
                run_rounds,
                [srv.url],
                p.sessions,
                p.turns,
                p.rounds,
                partial(tree_cpu_seconds, srv.pid),
            )
        )
    ratio = round(ts["wall_s_median"] / lg["wall_s_median"], 3)
    res.add("LangGraph dev: wall (median)", lg["wall_s_median"], "s")
    res.add("  LangGraph: CPU per turn", lg["cpu_ms_per_turn"], "ms")
    res.add("trioserve fork: wall (median)", ts["wall_s_median"], "s")
    res.add("  trioserve: CPU per turn", ts["cpu_ms_per_turn"], "ms")
    res.add("trioserve / LangGraph", ratio, "x", "<= 0.3", ratio <= 0.3)
    res.details = {
        "langgraph": lg | {"versions": versions(), "n_jobs_per_worker": JOBS},
        "trioserve": ts | {"flags": [*flags, *MODES["fork"]]},
    }
    return res
