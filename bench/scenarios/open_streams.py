"""Scenario d: the server's RSS with 500 streams open (adapters that hang after
``session.started``), then half the clients leave and all do: every adapter reaped."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import trio

from bench import BenchError
from bench.adapter import adapter_command
from bench.client import RawConn
from bench.procinfo import children_of, fd_limit, open_fds, proc_status, rss_mib
from bench.results import Result
from bench.scenarios import scenario
from bench.server import Context, Server


@dataclass(frozen=True)
class Sizes:
    streams: int = 500
    hold: float = 15.0  # seconds half the streams stay open on an idle server
    fd_probe: bool = True  # the same again under a soft limit of 1024 descriptors


@dataclass
class _StreamState:
    total: int
    ready: int = 0
    failed: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    ready_in_group: Counter[int] = field(default_factory=Counter)
    done: trio.Event = field(default_factory=trio.Event)
    releases: tuple[trio.Event, trio.Event] = field(
        default_factory=lambda: (trio.Event(), trio.Event())
    )

    def settle(self) -> None:
        if self.ready + self.failed == self.total:
            self.done.set()


async def _hold_stream(url: str, sid: str, state: _StreamState, group: int) -> None:
    """Start a turn, wait for its first frame (must be session.started), hold it open
    until the release of its ``group`` (0 or 1)."""
    conn: RawConn | None = None
    try:
        conn = await RawConn.open(url)
        await conn.send_request("POST", f"/v1/sessions/{sid}/turns", b'{"input":"hang"}')
        status, headers = await conn.read_head()
        if status != 200:
            body = await conn.read_body(headers)
            raise BenchError(f"HTTP {status} {body[:120]!r}")
        first = await conn.read_until(b"\n\n")
        if b"event: session.started\n" not in first:
            raise BenchError(f"first event is not session.started: {_describe_frame(first)}")
        state.ready += 1
        state.ready_in_group[group] += 1
    except (OSError, BenchError, trio.BrokenResourceError) as exc:
        state.failed += 1
        state.errors[f"{type(exc).__name__}: {exc}"[:200]] += 1
    state.settle()
    try:
        await state.releases[group].wait()
    finally:
        if conn is not None:
            await conn.aclose()


def _describe_frame(raw: bytes) -> str:
    """``type: data.message`` of the first SSE frame in ``raw`` (chunk framing allowed)."""
    start = raw.find(b"event: ")
    data = raw.find(b"\ndata: ", start)
    end = raw.find(b"\n", data + 1)
    if start < 0 or data < 0 or end < 0:
        return repr(raw[:160])
    event_type = raw[start + 7 : data].decode(errors="replace")
    try:
        message = json.loads(raw[data + 7 : end])["data"].get("message", "")
    except (ValueError, KeyError, AttributeError):
        message = ""
    return f"{event_type}: {message}" if message else event_type


async def _healthy(url: str, within: float = 5.0) -> bool:
    with trio.move_on_after(within):
        conn = await RawConn.open(url)
        try:
            status, _, _ = await conn.request("GET", "/healthz")
        finally:
            await conn.aclose()
        return status == 200
    return False


async def _warm_ready(url: str) -> int:
    """How many warm adapters wait for a turn (``/readyz``'s Trioserve-Warm-Adapters)."""
    conn = await RawConn.open(url)
    try:
        status, headers, _ = await conn.request("GET", "/readyz")
    finally:
        await conn.aclose()
    if status != 200 or "trioserve-warm-adapters" not in headers:
        raise BenchError(f"GET /readyz: HTTP {status}, headers {headers}")
    return int(headers["trioserve-warm-adapters"].split("/")[0])


async def _turn_adapters(srv: Server) -> int:
    """The server's adapter processes that belong to turns: its children less the
    warm ones waiting in the pool (which the pool keeps started between turns)."""
    warm = await _warm_ready(srv.url)
    return len(children_of(srv.pid)) - warm


async def _wait_children(srv: Server, expected: int, within: float) -> int:
    """Poll until the server's turns have at most ``expected`` adapters; how many are
    left over (warm adapters waiting in the pool are not counted)."""
    left = await _turn_adapters(srv) - expected
    with trio.move_on_after(within):
        while left > 0:
            await trio.sleep(0.05)
            left = await _turn_adapters(srv) - expected
    return max(left, 0)


async def _d_main(srv: Server, n: int, open_timeout: float, hold: float) -> dict[str, Any]:
    out: dict[str, Any] = {"rss_idle_mib": rss_mib(srv.pid), "server_fd_limit": fd_limit(srv.pid)}
    conn = await RawConn.open(srv.url)
    try:
        sids = [await conn.create_session() for _ in range(n)]
    finally:
        await conn.aclose()
    await trio.sleep(0.2)
    out["rss_after_creating_sessions_mib"] = rss_mib(srv.pid)
    out["fds_before"] = open_fds(srv.pid)
    state = _StreamState(n)
    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i, sid in enumerate(sids):
            nursery.start_soon(_hold_stream, srv.url, sid, state, i % 2)
        with trio.move_on_after(open_timeout):
            await state.done.wait()
        out["open_seconds"] = round(time.perf_counter() - t0, 3)
        await trio.sleep(0.5)  # let the server settle (all adapters sleeping)
        status = proc_status(srv.pid)
        out["rss_open_mib"] = rss_mib(srv.pid)
        out["threads_open"] = int(status["Threads"])
        out["fds_open"] = open_fds(srv.pid)
        out["adapters_running"] = await _turn_adapters(srv)
        out["warm_adapters_waiting"] = await _warm_ready(srv.url)
        out["streams_ready"] = state.ready
        out["streams_failed"] = state.failed
        out["streams_pending"] = n - state.ready - state.failed
        out["stream_errors"] = dict(state.errors.most_common(5))
        # Disconnect half the clients: their turns must be cancelled, adapters reaped.
        kept = state.ready_in_group[1]
        t1 = time.perf_counter()
        state.releases[0].set()
        out["adapters_left_after_closing_half"] = await _wait_children(srv, kept, 30)
        out["reap_half_seconds"] = round(time.perf_counter() - t1, 3)
        out["streams_kept_open"] = kept
        if hold > 0:
            # Keep the other half open a while: a turn must survive an idle server
            # (trio's idle worker threads exit after 10 s).
            await trio.sleep(hold)
            out["hold_seconds"] = hold
            out["adapters_alive_after_hold"] = await _turn_adapters(srv)
            out["rss_after_hold_mib"] = rss_mib(srv.pid)
        state.releases[1].set()
    out["adapters_left_after_closing_all"] = await _wait_children(srv, 0, 30)
    await trio.sleep(0.5)
    out["rss_after_close_mib"] = rss_mib(srv.pid)
    out["rss_peak_mib"] = rss_mib(srv.pid, "VmHWM")
    out["fds_after_close"] = open_fds(srv.pid)
    out["healthy_after"] = await _healthy(srv.url)
    return out


@scenario("d", "open-streams", full=Sizes(), quick=Sizes(streams=100, hold=0.0, fd_probe=False))
def open_streams(ctx: Context, p: Sizes) -> Result:
    """server RSS with 500 streams open (adapters hang after started)  [<= 64 MiB]"""
    n = p.streams
    res = Result("d", f"server RSS with {n} streams open")
    flags = ["--in-memory", "--max-concurrent-turns", "0", "--max-sessions", "0"]
    with ctx.server("d", adapter_command("hang", "60"), flags) as srv:
        time.sleep(0.5)  # let the server finish starting before the idle RSS reading
        details = trio.run(_d_main, srv, n, 120.0, p.hold)
    details["server_log_errors"] = ctx.servers["d"]["log_errors"][:5]
    if p.fd_probe:
        # The same load under a common default soft limit of 1024 fds.
        with ctx.server("d_fd1024", adapter_command("hang", "60"), flags, nofile=1024) as srv:
            time.sleep(0.5)
            probe = trio.run(_d_main, srv, n, 20.0, 0.0)
        probe["server_log_errors"] = ctx.servers["d_fd1024"]["log_errors"][:5]
        details["fd_limit_1024_probe"] = probe
    res.details = details
    rss = details["rss_open_mib"]
    ok = details["streams_ready"] == n
    if n >= 500:
        res.add(f"RSS with {n} open", rss, "MiB", "<= 64 MiB", ok and rss <= 64)
    else:  # the target is for 500 streams
        res.add(f"RSS with {n} open", rss, "MiB", "(500 streams) <= 64 MiB")
    res.add("  RSS idle (baseline)", details["rss_idle_mib"], "MiB")
    res.add(f"  RSS after {n} creates", details["rss_after_creating_sessions_mib"], "MiB")
    res.add("  RSS after streams closed", details["rss_after_close_mib"], "MiB")
    res.add("  streams got session.started", details["streams_ready"], f"of {n}")
    res.add(f"  time to open {n} streams", details["open_seconds"], "s")
    res.add("  adapters running while open", details["adapters_running"], "procs")
    res.add("  warm adapters waiting (not counted)", details["warm_adapters_waiting"], "procs")
    left = details["adapters_left_after_closing_half"]
    res.add("  adapters left after half the clients left", left, "procs", "0", left == 0)
    if "adapters_alive_after_hold" in details:
        alive = details["adapters_alive_after_hold"]
        kept = details["streams_kept_open"]
        hold = details["hold_seconds"]
        res.add(f"  adapters alive after {hold:g} s more", alive, f"of {kept}", str(kept))
        res.metrics[-1].met = alive == kept
    left = details["adapters_left_after_closing_all"]
    res.add("  adapters left after all clients left", left, "procs", "0", left == 0)
    res.add("  server fds while open", details["fds_open"], "fds")
    res.add("  server threads while open", details["threads_open"], "threads")
    if "fd_limit_1024_probe" in details:
        probe = details["fd_limit_1024_probe"]
        res.add("  with 1024 fds: streams ok", probe["streams_ready"], f"of {n}")
        res.add("  with 1024 fds: adapters left", probe["adapters_left_after_closing_all"], "procs")
    return res
