"""Scenario keep-alive-errors (issue 29): transport errors that reach an httpx client at
its default pool settings, 64 sessions x 5 turns at once.

The issue's finding: a client with keep-alive (httpx's pool keeps an idle
connection 5 s) met a server that closed idle connections after 5 s (the old
default ``--keep-alive``); a request sent on a connection the server was
closing got no response (``httpx.ReadError`` / ``RemoteProtocolError``), and
httpx does not send a POST again.  Here each session pauses before each turn
for a time drawn from ``pause_from``..``pause_to`` seconds, across httpx's
``keepalive_expiry`` (5 s): the pool reuses the connections idle for just under
5 s and replaces the others, so requests go out on connections at the
boundary the race lives at.

Two configurations, each ``runs`` times on its own server:

- the defaults (``--keep-alive`` 75 s): the goal is 0 transport errors over all
  runs;
- ``--keep-alive 5`` (the old default), fewer runs: the same boundary on the
  server's side, for comparison (it shows what the scenario can see; no target).

A transport error is counted and the session goes on to its next turn; any
other wrong answer (a status other than 200/201, an SSE body that does not end
with ``session.ended`` ``completed``) fails the scenario.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import trio

from bench import BenchError
from bench.adapter import adapter_command
from bench.client import JSON_HEADERS, check_sse
from bench.results import Result
from bench.scenarios import scenario
from bench.server import Context

OLD_KEEP_ALIVE = 5.0  # seconds: the default --keep-alive before issue 29, httpx's expiry


@dataclass(frozen=True)
class Sizes:
    sessions: int = 64
    turns: int = 5  # per session, one after the other, each after a pause
    runs: int = 10  # with the server's defaults
    compare_runs: int = 3  # with --keep-alive 5
    pause_from: float = 4.9  # seconds before each turn: uniform in [pause_from, pause_to]
    pause_to: float = 5.05


@dataclass
class Tally:
    """One run: turns that completed, transport errors by type, when they came."""

    turns: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    error_at: list[float] = field(default_factory=list)  # seconds into the run


async def _turn(client: httpx.AsyncClient, sid: str) -> None:
    async with client.stream(
        "POST", f"/v1/sessions/{sid}/turns", content=b'{"input":"hi"}', headers=JSON_HEADERS
    ) as resp:
        body = await resp.aread()
    if resp.status_code != 200:
        raise BenchError(f"turn: HTTP {resp.status_code} {body[:200]!r}")
    check_sse(body, 3)


async def _session(
    client: httpx.AsyncClient, p: Sizes, pauses: random.Random, tally: Tally, t0: float
) -> None:
    """Create a session, then its turns, each after a pause; count transport errors."""

    def failed(exc: httpx.TransportError) -> None:
        tally.errors[type(exc).__name__] += 1
        tally.error_at.append(round(time.perf_counter() - t0, 2))

    try:
        resp = await client.post("/v1/sessions", content=b"{}", headers=JSON_HEADERS)
    except httpx.TransportError as exc:
        failed(exc)
        return
    if resp.status_code != 201:
        raise BenchError(f"create: HTTP {resp.status_code} {resp.text[:200]}")
    sid: str = resp.json()["id"]
    for _ in range(p.turns):
        await trio.sleep(pauses.uniform(p.pause_from, p.pause_to))
        try:
            await _turn(client, sid)
        except httpx.TransportError as exc:
            failed(exc)
        else:
            tally.turns += 1


async def _run(url: str, p: Sizes, seed: int) -> Tally:
    """One run: ``sessions`` at once through one ``httpx.AsyncClient``, default limits."""
    tally = Tally()
    pauses = random.Random(seed)
    t0 = time.perf_counter()
    # httpx's defaults: 100 connections, 20 kept idle, each for 5 s.
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        with trio.fail_after(60 + p.turns * (p.pause_to + 30)):
            async with trio.open_nursery() as nursery:
                for _ in range(p.sessions):
                    nursery.start_soon(_session, client, p, pauses, tally, t0)
    return tally


def _configuration(
    ctx: Context, name: str, flags: list[str], p: Sizes, runs: int
) -> dict[str, Any]:
    base = ["--in-memory", "--max-concurrent-turns", str(p.sessions), "--max-sessions", "0"]
    tallies = []
    with ctx.server(name, adapter_command("1"), base + flags) as srv:
        for run in range(runs):
            tallies.append(trio.run(_run, srv.url, p, run))
    errors = sum((t.errors for t in tallies), Counter[str]())
    return {
        "flags": flags or ["(defaults)"],
        "runs": runs,
        "turns_sent": runs * p.sessions * p.turns,
        "turns_completed": sum(t.turns for t in tallies),
        "transport_errors": sum(errors.values()),
        "errors_by_type": dict(errors),
        "errors_per_run": [sum(t.errors.values()) for t in tallies],
        "error_seconds_into_run": [t.error_at for t in tallies if t.error_at],
    }


def _options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("scenario keep-alive-errors")
    group.add_argument("--ka-runs", type=int, metavar="N", help="runs with the defaults")
    group.add_argument(
        "--ka-compare-runs", type=int, metavar="N", help="runs with --keep-alive 5 (0: none)"
    )


@scenario(
    "keep-alive-errors",
    "keep-alive-errors",
    full=Sizes(),
    quick=Sizes(sessions=16, runs=1, compare_runs=1),
    options=_options,
)
def keep_alive_errors(ctx: Context, p: Sizes) -> Result:
    """64 sessions x 5 turns, httpx at its default pool, idle ~5 s: transport errors  [0 in 10 runs]

    With the defaults, and with --keep-alive 5 (the old default) for comparison.
    """
    if ctx.options.ka_runs is not None:
        p = replace(p, runs=ctx.options.ka_runs)
    if ctx.options.ka_compare_runs is not None:
        p = replace(p, compare_runs=ctx.options.ka_compare_runs)
    s, t = p.sessions, p.turns
    res = Result(
        "keep-alive-errors",
        f"{s} sessions x {t} turns at once, httpx.AsyncClient at its default limits, a"
        f" {p.pause_from}-{p.pause_to} s pause before each turn",
    )
    default = _configuration(ctx, "keep-alive-errors", [], p, p.runs)
    res.details = {"defaults": default}
    errors = default["transport_errors"]
    runs = f"{p.runs} run{'s' if p.runs != 1 else ''}"
    res.add(f"transport errors, defaults, {runs}", errors, "errors", "0", errors == 0)
    sent = default["turns_sent"]
    res.add(f"  turns completed (of {sent})", default["turns_completed"], "turns")
    if p.compare_runs:
        flags = ["--keep-alive", f"{OLD_KEEP_ALIVE:g}s"]
        old = _configuration(ctx, "keep-alive-errors-5s", flags, p, p.compare_runs)
        res.details["keep_alive_5s"] = old
        n = p.compare_runs
        res.add(
            f"transport errors, --keep-alive 5s, {n} run{'s' if n != 1 else ''}",
            old["transport_errors"],
            "errors",
        )
    return res
