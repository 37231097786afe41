"""The request floor: server CPU per request, bare stack against trioserve (issue 14).

Each server runs in its own subprocess on 127.0.0.1 and is driven by one blocking
keep-alive connection (``BlockingConn``), one request at a time.  The figure is the
server's CPU time (``utime + stime`` of its process, from ``/proc/PID/stat``) over N
requests, divided by N: unlike wall time it does not count the time the server waits
for a core, though on a busy machine it still moves by about 20 % between runs
(shared caches).  ``--floor-repeat R`` keeps each path's least figure of R runs;
``--callgrind DIR`` runs the servers under valgrind's callgrind and counts their
instructions per request (switched on only around the N requests), which does not
depend on the load at all.  Wall latencies are reported too, for scale only.

Servers and paths: the bare ``asgi`` and ``quart`` apps of ``bench/floor_servers.py``
(``GET /healthz``; quart also ``POST /echo``, the shape of a create), its bare
``turns`` app (``POST /v1/sessions`` and ``POST /v1/sessions/{id}/turns`` as the least
this stack does for them: an id; a spawn and the adapter's lines as SSE frames), and
``trioserve
run --in-memory`` with ``tinyadapter 1`` and its default warm pool: ``GET /healthz``,
``POST /v1/sessions``, ``POST /v1/sessions/{id}/turns`` (a whole SSE turn; the first
event's latency is taken when its frame has arrived) and ``GET
/v1/sessions/{id}/events`` (a replay of a finished turn's 3 events).

With ``--floor-profile DIR`` trioserve runs under a CPU-time ``cProfile`` (switched on
by SIGUSR1 and written by SIGUSR2 around each path's N requests; it makes the server
about ten times slower, more so code that makes many small calls) and each path's own
time per request is printed by package and by function.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pstats
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench import BenchError
from bench.adapter import BENCH, adapter_command, build_adapter
from bench.client import BlockingConn
from bench.procinfo import cpu_seconds
from bench.results import Result
from bench.scenarios import scenario
from bench.server import Context, Server

FLOOR_SERVERS = BENCH / "floor_servers.py"
PATHS = ("healthz", "create", "turns", "events")
STREAM_EVENTS = 20_000  # the stream path's turn: tinyadapter 20000, 3 turns after 1


@dataclass(frozen=True)
class Sizes:
    requests: int = 2000  # a path
    warmup: int = 100
    repeat: int = 1  # runs of each server; each path's least CPU is kept


def _options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("scenario floor")
    group.add_argument("--floor-requests", type=int, metavar="N", help="requests a path")
    group.add_argument("--floor-warmup", type=int, metavar="N", help="requests before those")
    group.add_argument(
        "--floor-repeat", type=int, metavar="R", help="run each server R times; keep the least CPU"
    )
    group.add_argument(
        "--floor-servers",
        default="asgi,quart,turns,trioserve",
        help="which servers (default: all)",
    )
    group.add_argument(
        "--floor-paths",
        default=",".join(PATHS),
        help="trioserve's paths to measure (turns need create; also: stream, per event)",
    )
    group.add_argument(
        "--floor-flags", default="", help="more flags for trioserve run (split on spaces)"
    )
    group.add_argument(
        "--floor-profile", type=Path, metavar="DIR", help="run trioserve under cProfile, into DIR"
    )
    group.add_argument(
        "--callgrind",
        type=Path,
        metavar="DIR",
        help="run the floor's servers under valgrind's callgrind: instructions per request",
    )


def measure(
    pid: int,
    n: int,
    warmup: int,
    step: Callable[[list[float] | None], object],
    first: bool = False,
    profile: Path | None = None,
    callgrind: Path | None = None,
) -> dict[str, Any]:
    """Run ``step`` ``warmup + n`` times; server CPU and wall time per step over the last n.
    With ``profile`` (the profiled server's directory), the n are profiled; with
    ``callgrind`` (the server runs under it), their instructions are counted."""
    for _ in range(warmup):
        step(None)
    if callgrind is not None:
        _callgrind_control("--zero", pid)
        _callgrind_control("--instr=on", pid)
    if profile is not None:
        done = len(list(profile.glob("*.prof")))
        os.kill(pid, signal.SIGUSR1)
        time.sleep(0.2)
    walls: list[float] = []
    firsts: list[float] = []
    cpu0 = cpu_seconds(pid)
    for _ in range(n):
        mark: list[float] = []
        t0 = time.perf_counter()
        step(mark if first else None)
        walls.append(time.perf_counter() - t0)
        if mark:
            firsts.append(mark[0] - t0)
    cpu = cpu_seconds(pid) - cpu0
    instructions = None
    if callgrind is not None:
        _callgrind_control("--instr=off", pid)
        before = set(callgrind.glob("cg.*"))
        _callgrind_control("--dump", pid)
        (dump,) = set(callgrind.glob("cg.*")) - before
        instructions = _callgrind_total(dump)
        dump.unlink()
    if profile is not None:
        os.kill(pid, signal.SIGUSR2)
        while not (profile / f"{done}.prof").exists():
            time.sleep(0.05)
    out = {
        "n": n,
        "server_cpu_us": round(cpu / n * 1e6, 1),
        "wall_p50_ms": round(statistics.median(walls) * 1000, 3),
    }
    if instructions is not None:
        out["server_instructions_k"] = round(instructions / n / 1000, 1)
    if firsts:
        out["first_event_p50_ms"] = round(statistics.median(firsts) * 1000, 3)
    return out


def _callgrind_control(what: str, pid: int) -> None:
    done = subprocess.run(["callgrind_control", what, str(pid)], capture_output=True, text=True)
    if done.returncode != 0 or "OK." not in done.stdout:
        raise BenchError(f"callgrind_control {what} {pid}: {done.stdout}{done.stderr}")


def _callgrind_total(dump: Path) -> int:
    """The instructions (``Ir``) of a callgrind dump: its ``totals:`` line."""
    for line in dump.read_text(errors="replace").splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise BenchError(f"no totals in {dump}")


def _least(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each path's run of least server CPU (the least disturbed by other processes),
    with every run's CPU figure in ``server_cpu_us_runs``."""
    out = {}
    for path in runs[0]:
        best = min((run[path] for run in runs), key=lambda fig: fig["server_cpu_us"])
        best = dict(best, server_cpu_us_runs=[run[path]["server_cpu_us"] for run in runs])
        out[path] = best
    return out


def _expect(status: int, body: bytes, want: int, what: str) -> bytes:
    if status != want:
        raise BenchError(f"{what}: HTTP {status}: {body[:200]!r}")
    return body


def _valgrind(callgrind: Path) -> list[str]:
    callgrind.mkdir(parents=True, exist_ok=True)
    return [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={callgrind}/cg.%p",
    ]


@contextlib.contextmanager
def bare_running(
    kind: str, args: tuple[str, ...] = (), callgrind: Path | None = None
) -> Iterator[tuple[str, int]]:
    """``floor_servers.py bare KIND ARGS`` serving: (its URL, its pid).  A failure inside
    the block is raised again with the server's stderr."""
    argv = [sys.executable, str(FLOOR_SERVERS), "bare", kind, *args]
    if callgrind is not None:
        argv = _valgrind(callgrind) + argv
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    tail: deque[bytes] = deque(maxlen=100)  # the server's last lines, for a failure
    # Read to the end, or a full pipe stops the server (valgrind and adapters write there).
    reader = threading.Thread(target=tail.extend, args=(proc.stderr,), daemon=True)
    try:
        for _ in range(100):  # valgrind's banner comes first
            line = proc.stderr.readline().decode()
            if " on http://" in line or not line:
                break
        reader.start()
        if " on http://" not in line:
            raise BenchError(f"{kind} did not start: {line!r}")
        yield line.split(" on ", 1)[1].split()[0], proc.pid
    except BenchError as exc:
        proc.terminate()
        reader.join(10)
        raise BenchError(f"{kind}: {exc}\n{b''.join(tail).decode()[-3000:]}") from None
    finally:
        proc.terminate()
        proc.wait(10 if callgrind is None else 120)  # valgrind writes its profile on exit


def bare(kind: str, n: int, warmup: int, callgrind: Path | None = None) -> dict[str, Any]:
    args: tuple[str, ...] = ()
    if kind == "turns":
        build_adapter()
        args = tuple(shlex.split(adapter_command("1")))
    with bare_running(kind, args, callgrind=callgrind) as (url, pid):
        client = BlockingConn(url)
        how = partial(measure, pid, n, warmup, callgrind=callgrind)
        out = {}
        if kind != "turns":
            out["GET /healthz"] = how(partial(_get, client, "/healthz"))
        if kind == "quart":
            out["POST /echo"] = how(
                lambda _: _expect(*client.request("POST", "/echo", b'{"a":1}'), 201, "echo"),
            )
        if kind == "turns":  # trioserve's two requests, as bare as this stack makes them
            out["POST /v1/sessions"] = how(
                lambda _: _expect(*client.request("POST", "/v1/sessions", b"{}"), 201, "create")
            )
            out["POST turns"] = how(partial(_bare_turn, client), first=True)
        client.close()
        return out


def _bare_turn(client: BlockingConn, first: list[float] | None) -> None:
    status, body = client.request("POST", "/v1/sessions/s_x/turns", b'{"input":"hi"}', first)
    _expect_turn(status, body)


def _expect_turn(status: int, body: bytes) -> None:
    """A whole turn of ``tinyadapter 1``: 200 and its 3 events."""
    _expect(status, body, 200, "turn")
    if body.count(b"\nevent: ") + body.startswith(b"event: ") != 3:
        raise BenchError(f"turn: not 3 events: {body[:300]!r}")


def _get(client: BlockingConn, path: str, _first: list[float] | None = None) -> None:
    _expect(*client.request("GET", path), 200, path)


def _trioserve(
    n: int,
    warmup: int,
    profile: Path | None,
    flags: list[str],
    callgrind: Path | None = None,
    paths: tuple[str, ...] = PATHS,
) -> dict[str, Any]:
    build_adapter()
    with tempfile.TemporaryDirectory(prefix="trioserve-floor-") as tmp:
        prefix = None
        if profile is not None:
            profile.mkdir(parents=True, exist_ok=True)
            for old in profile.glob("*.prof"):
                old.unlink()
            prefix = [sys.executable, str(FLOOR_SERVERS), "profiled", str(profile)]
        if callgrind is not None:
            prefix = [
                *_valgrind(callgrind),
                sys.executable,  # the venv's python, not a shim: valgrind follows no exec
                "-m",
                "trioserve",
            ]
        srv = Server(
            "floor",
            Path(tmp),
            adapter_command("1"),
            ["--in-memory", "--max-sessions", "0", *flags],
            prefix=prefix,
        )
        srv.start(timeout=60 if callgrind is None else 900)
        try:
            client = BlockingConn(srv.url)
            sids: list[str] = []

            def create(_: list[float] | None) -> None:
                body = _expect(*client.request("POST", "/v1/sessions", b"{}"), 201, "create")
                sids.append(json.loads(body)["id"])

            turn_sids: list[str] = []

            def turn(first: list[float] | None) -> None:
                sid = sids.pop()
                status, body = client.request(
                    "POST", f"/v1/sessions/{sid}/turns", b'{"input":"hi"}', first
                )
                _expect_turn(status, body)
                turn_sids.append(sid)

            def events(_: list[float] | None) -> None:
                sid = turn_sids[len(turn_sids) // 2]
                status, body = client.request("GET", f"/v1/sessions/{sid}/events")
                _expect(status, body, 200, "events")

            health = partial(_get, client, "/healthz")
            how = partial(measure, srv.pid, n, warmup, profile=profile, callgrind=callgrind)
            out = {}
            if "healthz" in paths:
                out["GET /healthz"] = how(health)
            if "create" in paths:
                out["POST /v1/sessions"] = how(create)
            if "turns" in paths:
                while len(sids) < warmup + n:  # a session a turn, made if create was not run
                    create(None)
                out["POST turns"] = how(turn, first=True)
            if "events" in paths:
                for _ in range(5 - len(turn_sids)):  # a few sessions with a turn to replay
                    create(None)
                    turn(None)
                out["GET events"] = how(events)
            client.close()
        finally:
            srv.stop()
        if "stream" in paths:
            out["stream, an event"] = _stream(Path(tmp), prefix, flags, callgrind)
        return out


def _stream(
    tmp: Path, prefix: list[str] | None, flags: list[str], callgrind: Path | None
) -> dict[str, Any]:
    """Server CPU and instructions an event of a ``STREAM_EVENTS``-event turn (its own
    server: ``tinyadapter 20000``), over 3 turns after 1 (not under ``--floor-profile``)."""
    srv = Server(
        "floor-stream",
        tmp,
        adapter_command(str(STREAM_EVENTS)),
        ["--in-memory", "--max-sessions", "0", *flags],
        prefix=prefix,
    )
    srv.start(timeout=60 if callgrind is None else 900)
    try:
        client = BlockingConn(srv.url)
        sids = [
            json.loads(_expect(*client.request("POST", "/v1/sessions", b"{}"), 201, "create"))["id"]
            for _ in range(4)
        ]

        def turn(_: list[float] | None) -> None:
            status, body = client.request("POST", f"/v1/sessions/{sids.pop()}/turns", b"{}")
            _expect(status, body, 200, "stream")
            if body.count(b"\nevent: ") + 1 != STREAM_EVENTS + 2:
                raise BenchError(f"stream: not {STREAM_EVENTS + 2} events")

        fig = measure(srv.pid, 3, 1, turn, callgrind=callgrind)
        client.close()
    finally:
        srv.stop()
    fig["server_cpu_us"] = round(fig["server_cpu_us"] / STREAM_EVENTS, 3)
    if "server_instructions_k" in fig:
        fig["server_instructions_k"] = round(fig["server_instructions_k"] / STREAM_EVENTS, 3)
    return fig


def _group(filename: str) -> str:
    if "/trioserve/" in filename:
        return "trioserve." + filename.split("/trioserve/", 1)[1].split("/", 1)[0].split(".")[0]
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if filename == "~":
        return "builtins (C)"
    return "stdlib." + Path(filename).stem


def summarize_profile(path: Path, requests: int, top: int = 30) -> str:
    """Own time (tottime) by package and the top functions, in µs per request."""
    stats = pstats.Stats(str(path))
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    by_group: dict[str, float] = defaultdict(float)
    rows = []
    for (filename, line, name), (_cc, nc, tt, ct, _callers) in raw.items():
        by_group[_group(filename)] += tt
        rows.append((tt, nc, ct, f"{_group(filename)}:{name}:{line}"))
    total = sum(by_group.values())
    lines = [f"own time by package, µs per request ({requests} requests, profiled):"]
    for group, tt in sorted(by_group.items(), key=lambda kv: -kv[1])[:20]:
        lines.append(f"  {tt / requests * 1e6:8.1f}  {100 * tt / total:5.1f} %  {group}")
    lines.append("top functions by own time (µs per request, calls per request):")
    for tt, nc, ct, label in sorted(rows, reverse=True)[:top]:
        lines.append(
            f"  {tt / requests * 1e6:8.1f} own {ct / requests * 1e6:8.1f} cum"
            f" {nc / requests:6.1f}x  {label}"
        )
    return "\n".join(lines)


# -- main --------------------------------------------------------------------------


@scenario("floor", "floor", full=Sizes(), quick=Sizes(requests=200, warmup=20), options=_options)
def floor(ctx: Context, p: Sizes) -> Result:
    """server CPU per request (/healthz, create, turn, events): bare ASGI, bare quart-trio,
    trioserve

    Each server in turn, ``repeat`` times: server CPU (or instructions) per request.
    """
    o = ctx.options
    n = o.floor_requests or p.requests
    warmup = o.floor_warmup if o.floor_warmup is not None else p.warmup
    servers = o.floor_servers.split(",")
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for _ in range(o.floor_repeat or p.repeat):  # the servers one after the other
        for kind in ("asgi", "quart", "turns"):
            if kind in servers:
                runs[kind].append(bare(kind, n, warmup, o.callgrind))
        if "trioserve" in servers:
            paths = tuple(o.floor_paths.split(","))
            flags = o.floor_flags.split()
            run = _trioserve(n, warmup, o.floor_profile, flags, o.callgrind, paths)
            runs["trioserve"].append(run)
    res = Result("floor", "the request floor: server CPU per request, bare stack vs trioserve")
    res.details = {
        "method": "server CPU (utime+stime, /proc/PID/stat) over N sequential requests",
        "requests": n,
        "warmup": warmup,
    }
    for kind, done in runs.items():
        res.details[kind] = figures = _least(done)
        for path, fig in figures.items():
            res.add(f"{kind} {path}: server CPU", fig["server_cpu_us"], "us")
            if "server_instructions_k" in fig:
                res.add("  instructions", fig["server_instructions_k"], "k")
            if "first_event_p50_ms" in fig:
                res.add("  first event p50", fig["first_event_p50_ms"], "ms")
            res.add("  wall p50", fig["wall_p50_ms"], "ms")
    if o.floor_profile is not None and "trioserve" in runs:
        for i, path in enumerate(res.details["trioserve"]):
            if path.startswith("stream"):  # not profiled
                continue
            report = summarize_profile(o.floor_profile / f"{i}.prof", n)
            ctx.profiler.reports[f"trioserve, {path} (cProfile)"] = report
    return res
