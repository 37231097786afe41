"""Where a turn's first event spends its time, inside the server: a timeline of probes.

    python -m bench.turn_timeline [TURNS] [-- MORE RUN FLAGS]

Starts ``trioserve run --in-memory --warm-adapters 0`` with the bench's C adapter
(``tinyadapter 1``) in a child process whose functions on a turn's path are wrapped by
probes, drives TURNS create + turn pairs (default 300, the first 20 not counted) over
one keep-alive connection (scenario a's loop), then stops it: the child prints, for
each probe, the median time from the turn's ``SessionManager.start_turn`` to the first
time the probe fired.  The probes cost a few µs each; the figures are for where the
time goes, not for the total.
"""

from __future__ import annotations

import atexit
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from functools import wraps
from typing import Any

PROBES: dict[str, float] = {}  # the current turn's: probe -> perf_counter
TURNS: list[dict[str, float]] = []
WARMUP = 20


def _mark(name: str) -> None:
    PROBES.setdefault(name, time.perf_counter())


def _around(owner: Any, attr: str, before: str, after: str | None = None) -> None:
    """Wrap the coroutine function ``owner.attr``: ``before`` on entry, ``after`` on exit."""
    inner: Callable[..., Awaitable[Any]] = getattr(owner, attr)

    @wraps(inner)
    async def probed(*args: Any, **kwargs: Any) -> Any:
        _mark(before)
        try:
            return await inner(*args, **kwargs)
        finally:
            if after is not None:
                _mark(after)

    setattr(owner, attr, probed)


def _install() -> None:
    from trioserve.http import _connections, _sse
    from trioserve.runtime import _process
    from trioserve.sessions import _feed, _manager, _turns
    from trioserve.stores import memory

    start_turn = _manager.SessionManager.start_turn

    async def first_probe(self: Any, *args: Any, **kwargs: Any) -> Any:
        if PROBES:
            TURNS.append(dict(PROBES))
        PROBES.clear()
        _mark("start_turn")
        try:
            return await start_turn(self, *args, **kwargs)
        finally:
            _mark("start_turn returns")

    _manager.SessionManager.start_turn = first_probe  # type: ignore[method-assign]
    _around(_manager.SessionManager, "_launch", "turn stored: in", "turn stored: out")
    exec_process = _process.exec_process  # type: ignore[attr-defined]

    def spawned(*args: Any, **kwargs: Any) -> Any:
        _mark("spawn: in")
        try:
            return exec_process(*args, **kwargs)
        finally:
            _mark("spawn: out")

    _process.exec_process = spawned  # type: ignore[attr-defined]
    _around(_process._Child, "receive_stdout", "stdout read: in", "stdout read: out")
    _around(memory.MemoryStore, "append_events", "events stored: in", "events stored: out")

    add_many = _turns.TurnLog.add_many

    def numbered(self: Any, events: Any) -> None:
        if events:
            _mark("events numbered")
        add_many(self, events)

    _turns.TurnLog.add_many = numbered  # type: ignore[method-assign]
    publish = _feed.Feed.publish

    def published(self: Any, events: Any, size: int | None = None) -> None:
        if events:
            _mark("events published")
        publish(self, events, size)

    _feed.Feed.publish = published  # type: ignore[method-assign]
    framed = _sse.SSEBody.__anext__

    async def frame(self: Any) -> bytes:
        chunk = await framed(self)
        if b"session.started" in chunk:
            _mark("first frame made")
        if b"session.ended" in chunk:
            _mark("last frame made")
        return chunk

    _sse.SSEBody.__anext__ = frame  # type: ignore[method-assign]
    send_all = _connections.Connection._send_all

    async def sent(self: Any, data: bytes) -> None:
        if b"session.started" in data:
            _mark("first frame to the socket")
        await send_all(self, data)

    _connections.Connection._send_all = sent  # type: ignore[method-assign]


def _report() -> None:
    turns = [*TURNS, PROBES][WARMUP:]
    names = list(dict.fromkeys(name for turn in turns for name in turn))
    print(f"{len(turns)} turns; median ms from start_turn:")
    for name in names:
        offsets = [(t[name] - t["start_turn"]) * 1000 for t in turns if name in t]
        print(f"  {name:28} {statistics.median(offsets):7.3f}")


def serve(argv: list[str]) -> None:
    """``trioserve ARGV`` with the probes; the report on SIGINT's way out."""
    _install()
    atexit.register(_report)
    from trioserve.cli import main

    sys.argv = ["trioserve", *argv]
    main()


def measure(turns: int, flags: list[str]) -> None:
    import trio

    from bench.probed import run_probed
    from bench.scenarios.turn_latency import raw_create_turns

    def drive(url: str, _proc: object) -> None:
        trio.run(raw_create_turns, url, 0, turns)

    print(run_probed(__file__, [], flags, drive), end="")


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2:])
    else:
        from bench.probed import pairs_and_flags

        measure(*pairs_and_flags(sys.argv[1:], 300))
