"""Scenario client-ws (issue 21): the client's WebSocket layer against the alternatives
(docs/client.md, "How it is built").

One server (``--in-memory``, the tests' fake adapter) logs one turn of N small
events; then, for each WebSocket layer and loop, in this process:

- replay: connect, send ``{"type":"resume","after":0}``, receive the N events
  and ``trioserve.resume.end``: messages/s (wall) and client CPU time per
  message (``time.process_time``, this process only: the server runs in its
  own);
- connect: a new connection, a resume with nothing to send, its
  ``resume.end``, the close: p50 of ``connects`` rounds, in ms.

Layers: the client's own (wsproto driven by its flows: ``AsyncDriver`` on Trio
and asyncio, ``SyncDriver`` blocking), trio-websocket (what the client used
before; Trio only), and httpx-ws (async on both loops, and sync) if it is
installed (``pip install httpx-ws``; it is not a dependency).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import trio

from bench.adapter import BENCH
from bench.results import Result
from bench.scenarios import scenario
from bench.server import Context
from trioserve.client import SyncClient
from trioserve.client.async_io import AsyncDriver
from trioserve.client.sync_io import SyncDriver
from trioserve.client.websocket import WebSocket

FAKE = BENCH.parent / "tests" / "helpers" / "fakeadapter.py"
END = "trioserve.resume.end"


@dataclass(frozen=True)
class Sizes:
    events: int = 20_000  # in the logged turn
    connects: int = 100  # connect rounds


def _options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("scenario client-ws")
    group.add_argument("--ws-events", type=int, metavar="N", help="events in the replayed log")
    group.add_argument("--ws-connects", type=int, metavar="N", help="connect rounds")


# -- the layers: each returns (replay seconds, replay CPU seconds, messages, connect seconds)


async def ours_async(url: str, connects: int) -> tuple[float, float, int, list[float]]:
    driver = AsyncDriver(httpx.Limits())

    async def resume(after: int) -> int:
        ws = await driver.run(WebSocket.connect(httpx.URL(url), {}, timeout=30))
        await driver.run(ws.send(json.dumps({"type": "resume", "after": after})))
        count = 0
        while END not in (await driver.run(ws.receive()) or END):
            count += 1
        await driver.run(ws.close())
        return count

    return await _measure_async(resume, connects)


def ours_sync(url: str, connects: int) -> tuple[float, float, int, list[float]]:
    driver = SyncDriver(httpx.Limits())

    def resume(after: int) -> int:
        ws = driver.run(WebSocket.connect(httpx.URL(url), {}, timeout=30))
        driver.run(ws.send(json.dumps({"type": "resume", "after": after})))
        count = 0
        while END not in (driver.run(ws.receive()) or END):
            count += 1
        driver.run(ws.close())
        return count

    return _measure_sync(resume, connects)


async def trio_websocket(url: str, connects: int) -> tuple[float, float, int, list[float]]:
    from trio_websocket import open_websocket_url

    async def resume(after: int) -> int:
        async with open_websocket_url(url, max_message_size=64 << 20) as ws:
            await ws.send_message(json.dumps({"type": "resume", "after": after}))
            count = 0
            while END not in await ws.get_message():
                count += 1
            return count

    return await _measure_async(resume, connects)


async def httpx_ws_async(url: str, connects: int) -> tuple[float, float, int, list[float]]:
    from httpx_ws import aconnect_ws

    async with httpx.AsyncClient() as client:

        async def resume(after: int) -> int:
            async with aconnect_ws(url.replace("ws://", "http://"), client) as ws:
                await ws.send_text(json.dumps({"type": "resume", "after": after}))
                count = 0
                while END not in await ws.receive_text():
                    count += 1
                return count

        return await _measure_async(resume, connects)


def httpx_ws_sync(url: str, connects: int) -> tuple[float, float, int, list[float]]:
    from httpx_ws import connect_ws

    with httpx.Client() as client:

        def resume(after: int) -> int:
            with connect_ws(url.replace("ws://", "http://"), client) as ws:
                ws.send_text(json.dumps({"type": "resume", "after": after}))
                count = 0
                while END not in ws.receive_text():
                    count += 1
                return count

        return _measure_sync(resume, connects)


async def _measure_async(
    resume: Callable[[int], Awaitable[int]], connects: int
) -> tuple[float, float, int, list[float]]:
    await resume(0)  # warm up
    wall, cpu = time.perf_counter(), time.process_time()
    count = await resume(0)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    rounds = []
    for _ in range(connects):
        start = time.perf_counter()
        await resume(count)
        rounds.append(time.perf_counter() - start)
    return wall, cpu, count, rounds


def _measure_sync(
    resume: Callable[[int], int], connects: int
) -> tuple[float, float, int, list[float]]:
    resume(0)
    wall, cpu = time.perf_counter(), time.process_time()
    count = resume(0)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    rounds = []
    for _ in range(connects):
        start = time.perf_counter()
        resume(count)
        rounds.append(time.perf_counter() - start)
    return wall, cpu, count, rounds


def layers() -> list[tuple[str, Callable[[str, int], Any], str]]:
    found: list[tuple[str, Callable[[str, int], Any], str]] = [
        ("trioserve (wsproto flows)", ours_async, "trio"),
        ("trioserve (wsproto flows)", ours_async, "asyncio"),
        ("trioserve (wsproto flows)", ours_sync, "blocking"),
        ("trio-websocket", trio_websocket, "trio"),
    ]
    try:
        import httpx_ws  # noqa: F401
    except ImportError:
        return found
    return [
        *found,
        ("httpx-ws", httpx_ws_async, "trio"),
        ("httpx-ws", httpx_ws_async, "asyncio"),
        ("httpx-ws", httpx_ws_sync, "blocking"),
    ]


@scenario("client-ws", "client-ws", full=Sizes(), quick=Sizes(5_000, 50), options=_options)
def client_ws(ctx: Context, p: Sizes) -> Result:
    """the client's WebSocket layer (Trio, asyncio, blocking) against trio-websocket and
    httpx-ws: a replay's messages/s and client CPU a message, connect-to-close p50

    The figures and the choice they support are in docs/client.md.
    """
    events = ctx.options.ws_events or p.events
    connects = ctx.options.ws_connects or p.connects
    res = Result("client-ws", f"WebSocket layers: a {events:,}-event replay, {connects} connects")
    fake = shlex.join([sys.executable, str(FAKE)])
    with ctx.server("client-ws", fake, ["--in-memory"]) as srv:
        with SyncClient(srv.url, timeout=120) as client:
            sid = client.create_session().id
            steps = json.dumps([{"many": events}, {"end": "completed"}])
            with client.turn(sid, "script:" + steps) as turn:
                for _ in turn:
                    pass
            ws_url = client.websocket_url(sid)
        for name, layer, loop in layers():
            if loop == "blocking":
                result = layer(ws_url, connects)
            elif loop == "trio":
                result = trio.run(layer, ws_url, connects)
            else:
                result = asyncio.run(layer(ws_url, connects))
            wall, cpu, count, rounds = result
            res.details[f"{name}, {loop}"] = {"replay_s": wall, "cpu_s": cpu, "rounds": rounds}
            res.add(f"{name}, {loop}: messages/s", round(count / wall), "msg/s")
            res.add("  client CPU a message", round(cpu / count * 1e6, 1), "us")
            res.add("  connect p50", round(statistics.median(rounds) * 1000, 2), "ms")
    return res
