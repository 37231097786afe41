"""Scenario go-peer (issue 23): trioserve and the Go reference peer (``agentctl serve``
v0.8, ``bench/go_peer.py``) side by side in one run, the same C adapter, the same
clients: create + turn p50 (scenario a's raw-socket loop), events/s through one stream
(b's), 64 sessions x 5 turns (c's rounds) and the server's RSS with 500 streams open
(each turn's adapter hangs after ``session.started``).  Every figure is trioserve's over
the peer's, against issue 23's ratios.  All but the stream also run against the bare
quart-trio server of ``floor_servers.py bare turns``, the least this stack does for the
same requests: the floor under each ratio.

The peer is built from agent-controller's source (commit 2d6eaca) by the measure kit's
``build-go-peer.sh`` (Go 1.27.3, standard library only); ``--go-peer PATH`` says where
it is (default ``$TRIOSERVE_BENCH_GO_PEER``, else ``/tmp/go-peer/agentctl-peer``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio

from bench.adapter import adapter_command
from bench.client import RawConn
from bench.go_peer import running
from bench.procinfo import cpu_seconds, rss_mib
from bench.results import Result, latency_summary
from bench.scenarios import scenario
from bench.scenarios.concurrent_turns import run_rounds
from bench.scenarios.floor import bare_running
from bench.scenarios.fork_server_memory import open_turns
from bench.scenarios.stream_rate import stream_once
from bench.scenarios.turn_latency import raw_create_turns
from bench.server import Context

DEFAULT_PEER = "/tmp/go-peer/agentctl-peer"


@dataclass(frozen=True)
class Sizes:
    warmup: int = 20
    iters: int = 300  # create + turn, sequential
    events: int = 50_000  # in the streamed turn
    stream_runs: int = 3
    sessions: int = 64
    turns: int = 5
    rounds: int = 3
    streams: int = 500


def _options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("scenario go-peer")
    group.add_argument("--go-peer", metavar="PATH", help=f"the peer's binary ({DEFAULT_PEER})")


#: A server for one measurement: (its URL, its pid), given the adapter command.
Launcher = Callable[[str], contextlib.AbstractContextManager[tuple[str, int]]]


def _create_turn(launch: Launcher, p: Sizes) -> dict[str, Any]:
    with launch(adapter_command("1")) as (url, pid):
        cpu0 = cpu_seconds(pid)
        samples = trio.run(raw_create_turns, url, p.warmup, p.iters)
        cpu = cpu_seconds(pid) - cpu0
    return latency_summary(samples) | {
        "server_cpu_ms_per_iteration": round(cpu / (p.warmup + p.iters) * 1000, 3)
    }


def _stream(launch: Launcher, p: Sizes) -> dict[str, Any]:
    n, rates, cpus = p.events, [], []
    with launch(adapter_command(str(n))) as (url, pid), httpx.Client(base_url=url) as client:
        for i in range(1 + p.stream_runs):  # the first warms up
            cpu0 = cpu_seconds(pid)
            _, _, seconds, _ = stream_once(client, n)
            if i:
                rates.append(round((n + 2) / seconds))
                cpus.append(round((cpu_seconds(pid) - cpu0) / (n + 2) * 1e6, 2))
    return {"events_per_s": statistics.median(rates), "runs": rates, "cpu_us_per_event": cpus}


def _rounds(launch: Launcher, p: Sizes) -> dict[str, Any]:
    with launch(adapter_command("1")) as (url, pid):
        rounds = trio.run(
            run_rounds, [url], p.sessions, p.turns, p.rounds, partial(cpu_seconds, pid)
        )
    return {"wall_s": statistics.median(r["wall_s"] for r in rounds), "rounds": rounds}


async def _hold(url: str, pid: int, n: int) -> dict[str, float]:
    idle = rss_mib(pid)
    opened: list[RawConn] = []
    try:
        await open_turns(url, n, opened, until=b"event: session.started\n")
        await trio.sleep(0.5)
        return {"rss_idle_mib": idle, "rss_open_mib": rss_mib(pid)}
    finally:
        for conn in opened:
            await conn.aclose()


def _open_streams(launch: Launcher, p: Sizes) -> dict[str, float]:
    with launch(adapter_command("hang", "60")) as (url, pid):
        time.sleep(0.5)
        return trio.run(_hold, url, pid, p.streams)


@scenario(
    "go-peer",
    "go-peer",
    full=Sizes(),
    quick=Sizes(iters=50, events=10_000, stream_runs=1, rounds=1, streams=100),
    options=_options,
)
def go_peer(ctx: Context, p: Sizes) -> Result:
    """trioserve against the Go reference peer, same adapter and clients: create + turn,
    events/s, 64x5, RSS with 500 streams [issue 23: <= 1.5x, >= 3x, <= 1.5x, <= 1.2x];
    the bare quart-trio floor's create + turn, 64x5 and RSS beside them
    """
    binary = Path(ctx.options.go_peer or os.environ.get("TRIOSERVE_BENCH_GO_PEER") or DEFAULT_PEER)
    flags = ["--in-memory", "--max-sessions", "0", "--max-concurrent-turns", "0"]

    @contextlib.contextmanager
    def trioserve(adapter: str) -> Iterator[tuple[str, int]]:
        with ctx.server("go-peer-trioserve", adapter, flags) as srv:
            yield srv.url, srv.pid

    def go(adapter: str) -> contextlib.AbstractContextManager[tuple[str, int]]:
        return running(binary, adapter, ctx.tmp / "go-peer")

    def floor(adapter: str) -> contextlib.AbstractContextManager[tuple[str, int]]:
        return bare_running("turns", tuple(shlex.split(adapter)))

    details: dict[str, Any] = {"peer": str(binary), "trioserve_flags": flags}
    for name, measure in (
        ("create_turn", _create_turn),
        ("stream", _stream),
        ("rounds", _rounds),
        ("open_streams", _open_streams),
    ):
        details[name] = {"trioserve": measure(trioserve, p), "go": measure(go, p)}
    for name, measure in (
        ("create_turn", _create_turn),
        ("rounds", _rounds),
        ("open_streams", _open_streams),
    ):
        details[name]["floor"] = measure(floor, p)
    res = Result("go-peer", "trioserve against the Go reference peer (agentctl serve v0.8)")
    res.details = details

    def compare(label: str, key: str, fig: str, unit: str, target: float, higher: bool) -> None:
        ours, theirs = details[key]["trioserve"][fig], details[key]["go"][fig]
        ratio = round(ours / theirs, 2)
        res.add(f"{label}: trioserve", ours, unit)
        res.add(f"  {label}: Go peer", theirs, unit)
        met = ratio >= target if higher else ratio <= target
        res.add(f"  {label}: ratio", ratio, "x", f"{'>=' if higher else '<='} {target:g}", met)

    def floor_of(label: str, key: str, fig: str, unit: str) -> None:
        bare = details[key]["floor"][fig]
        res.add(f"  {label}: bare quart-trio floor", bare, unit)
        res.add(f"  {label}: floor ratio", round(bare / details[key]["go"][fig], 2), "x")

    compare("create+turn p50", "create_turn", "p50_ms", "ms", 1.5, False)
    floor_of("create+turn p50", "create_turn", "p50_ms", "ms")
    compare("events/s", "stream", "events_per_s", "ev/s", 3.0, True)
    rounds, streams = f"{p.sessions}x{p.turns} wall", f"RSS, {p.streams} streams open"
    compare(rounds, "rounds", "wall_s", "s", 1.5, False)
    floor_of(rounds, "rounds", "wall_s", "s")
    compare(streams, "open_streams", "rss_open_mib", "MiB", 1.2, False)
    floor_of(streams, "open_streams", "rss_open_mib", "MiB")
    return res
