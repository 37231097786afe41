"""The request floor: server CPU per request, bare stack against trioserve (issue 14).

Each server runs in its own subprocess on 127.0.0.1 and is driven by one
blocking keep-alive socket client in this process, one request at a time.
The figure is the server's CPU time (``utime + stime`` of its process, from
``/proc/PID/stat``) over N requests, divided by N: unlike wall time it does
not count the time the server waits for a core, though on a busy machine it
still moves by about 20 % between runs (shared caches).  ``--repeat R``
keeps each path's least figure of R runs; ``--callgrind DIR`` runs the
servers under valgrind's callgrind and counts their instructions per
request (switched on only around the N requests), which does not depend on
the load at all.  Wall latencies are reported too, for scale only.

    python bench/floor.py                      # every server, 2,000 requests a path
    python bench/floor.py --repeat 3 --json out.json
    python bench/floor.py -n 200 --warmup 20 --callgrind /tmp/cg   # instructions
    python bench/floor.py --only trioserve --paths healthz,create --flags "--warm-adapters 0"
    python bench/floor.py --only trioserve --profile /tmp/prof   # cProfile of trioserve

Servers and paths:

- ``asgi``: a bare ASGI callable under ``hypercorn.trio.serve`` (hypercorn's
  defaults, no access log): ``GET /healthz``.
- ``quart``: a bare ``QuartTrio`` app: ``GET /healthz``, and ``POST /echo``
  (reads a JSON body, answers ``201`` with JSON), the shape of a create.
- ``trioserve``: ``trioserve run --in-memory`` with the tiny C adapter of
  ``bench/run.py`` (``tinyadapter 1``: session.started, one message,
  session.ended) and its default warm pool: ``GET /healthz``,
  ``POST /v1/sessions``, ``POST /v1/sessions/{id}/turns`` (a whole SSE turn;
  the first event's latency is taken when its frame has arrived) and
  ``GET /v1/sessions/{id}/events`` (a replay of a finished turn's 3 events).

With ``--profile DIR`` trioserve runs under a CPU-time ``cProfile``
(switched on by SIGUSR1 and written by SIGUSR2 around each path's N
requests; it makes the server about ten times slower, more so code that
makes many small calls) and each path's own time per request is printed by
package and by function.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import (
    BenchError,
    Server,
    adapter_command,
    build_adapter,
    cpu_seconds,
    machine_info,
)


def profiled_server(out: Path, argv: list[str]) -> None:
    """Run ``trioserve ARGV`` with a CPU-time cProfile switched by signals: SIGUSR1
    starts a profile, SIGUSR2 writes it to ``out/N.prof`` (N counts from 0)."""
    import runpy
    import signal

    state: dict[str, Any] = {"n": 0, "prof": None}

    def start(*_: Any) -> None:
        state["prof"] = cProfile.Profile(time.process_time)
        state["prof"].enable()

    def stop(*_: Any) -> None:
        prof, state["prof"] = state["prof"], None
        if prof is not None:
            prof.disable()
            tmp = out / f"{state['n']}.tmp"
            prof.dump_stats(str(tmp))
            tmp.rename(out / f"{state['n']}.prof")
            state["n"] += 1

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    sys.argv = ["trioserve", *argv]
    runpy.run_module("trioserve", run_name="__main__", alter_sys=True)


# -- the bare servers (run as ``python bench/floor.py --serve KIND``) --------------


async def _bare_asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b"ok\n"
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", b"3"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _bare_quart() -> Any:
    from quart import Response, request
    from quart_trio import QuartTrio

    app = QuartTrio("floor")

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response("ok\n", content_type="text/plain; charset=utf-8")

    @app.post("/echo")
    async def echo() -> Response:
        body = json.loads(await request.get_data())
        text = json.dumps({"id": "s_x", "inputs": body}, separators=(",", ":")) + "\n"
        return Response(text, status=201, content_type="application/json")

    return app


def serve(kind: str) -> None:
    """Serve the bare ``kind`` app on an ephemeral port until SIGTERM."""
    import logging
    import signal

    import trio
    from hypercorn.config import Config
    from hypercorn.trio import serve as hypercorn_serve

    app = _bare_asgi if kind == "asgi" else _bare_quart()
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = 1.0

    async def main() -> None:
        stop = trio.Event()
        async with trio.open_nursery() as nursery:

            async def signals() -> None:
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as got:
                    async for _ in got:
                        stop.set()
                        return

            nursery.start_soon(signals)
            binds = await nursery.start(
                lambda task_status: hypercorn_serve(
                    app,  # type: ignore[arg-type]
                    config,
                    shutdown_trigger=stop.wait,
                    task_status=task_status,
                )
            )
            print(f"floor: serving {kind} on {binds[0]} ", file=sys.stderr, flush=True)
            await stop.wait()
            nursery.cancel_scope.cancel()

    trio.run(main)


# -- a minimal blocking client ---------------------------------------------------


class Client:
    """One keep-alive HTTP/1.1 connection; reads Content-Length and chunked bodies."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
        self.host = f"{host}:{port}"
        self.address = (host, int(port))
        self.sock = self._connect()
        self.buf = b""

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self.address)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def close(self) -> None:
        self.sock.close()

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise BenchError("the server closed the connection")
        self.buf += data

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def request(
        self, method: str, path: str, body: bytes = b"", first: list[float] | None = None
    ) -> tuple[int, bytes]:
        """Send one request, read its whole response; ``first`` gets the time the
        body's first SSE frame (ending in a blank line) had arrived."""
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n"
        if body or method == "POST":
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.sock.sendall(head.encode() + b"\r\n" + body)
        status = int(self._line().split(b" ", 2)[1])
        headers: dict[bytes, bytes] = {}
        while line := self._line():
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        if b"content-length" in headers:
            body = self._take(int(headers[b"content-length"]))
        elif headers.get(b"transfer-encoding") == b"chunked":
            chunks = []
            while size := int(self._line().split(b";")[0], 16):
                chunks.append(self._take(size))
                self._take(2)
                if first is not None and not first and b"\n\n" in b"".join(chunks):
                    first.append(time.perf_counter())
            self._take(2)
            body = b"".join(chunks)
        else:
            raise BenchError(f"{method} {path}: no length, not chunked")
        if headers.get(b"connection", b"").lower() == b"close":
            # hypercorn closes a connection after keep_alive_max_requests (1,000)
            self.sock.close()
            self.sock, self.buf = self._connect(), b""
        return status, body


# -- measuring -------------------------------------------------------------------


def _server_cpu(pid: int) -> float:
    return cpu_seconds(pid)


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
    cpu0 = _server_cpu(pid)
    for _ in range(n):
        mark: list[float] = []
        t0 = time.perf_counter()
        step(mark if first else None)
        walls.append(time.perf_counter() - t0)
        if mark:
            firsts.append(mark[0] - t0)
    cpu = _server_cpu(pid) - cpu0
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


def bare(kind: str, n: int, warmup: int, callgrind: Path | None = None) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--serve", kind]
    if callgrind is not None:
        argv = _valgrind(callgrind) + argv
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert proc.stderr is not None
        for _ in range(100):  # valgrind's banner comes first
            line = proc.stderr.readline().decode()
            if " on http://" in line or not line:
                break
        if " on http://" not in line:
            raise BenchError(f"{kind} did not start: {line!r}")
        url = line.split(" on ", 1)[1].split()[0]
        client = Client(url)
        how = partial(measure, proc.pid, n, warmup, callgrind=callgrind)
        out = {"GET /healthz": how(partial(_get, client, "/healthz"))}
        if kind == "quart":
            out["POST /echo"] = how(
                lambda _: _expect(*client.request("POST", "/echo", b'{"a":1}'), 201, "echo"),
            )
        client.close()
        return out
    except BenchError as exc:
        proc.terminate()
        assert proc.stderr is not None
        raise BenchError(f"{kind}: {exc}\n{proc.stderr.read().decode()[-3000:]}") from None
    finally:
        proc.terminate()
        proc.wait(10 if callgrind is None else 120)  # valgrind writes its profile on exit


def _get(client: Client, path: str, _first: list[float] | None = None) -> None:
    _expect(*client.request("GET", path), 200, path)


def trioserve(
    n: int,
    warmup: int,
    profile: Path | None,
    flags: list[str],
    callgrind: Path | None = None,
    paths: tuple[str, ...] = ("healthz", "create", "turns", "events"),
) -> dict[str, Any]:
    build_adapter()
    with tempfile.TemporaryDirectory(prefix="trioserve-floor-") as tmp:
        prefix = None
        if profile is not None:
            profile.mkdir(parents=True, exist_ok=True)
            for old in profile.glob("*.prof"):
                old.unlink()
            prefix = [sys.executable, __file__, "--profiled-server", str(profile)]
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
            client = Client(srv.url)
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
                _expect(status, body, 200, "turn")
                if body.count(b"\nevent: ") + body.startswith(b"event: ") != 3:
                    raise BenchError(f"turn: not 3 events: {body[:300]!r}")
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
                out["POST turns"] = how(turn, first=True)
            if "events" in paths:
                for _ in range(5 - len(turn_sids)):  # a few sessions with a turn to replay
                    create(None)
                    turn(None)
                out["GET events"] = how(events)
            client.close()
        finally:
            srv.stop()
        return out


# -- the profile, per request ----------------------------------------------------


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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--profiled-server"]:
        profiled_server(Path(argv[1]), argv[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--serve", choices=["asgi", "quart"], help=argparse.SUPPRESS)
    parser.add_argument("-n", "--requests", type=int, default=2000, help="requests a path")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument(
        "--repeat", type=int, default=1, help="run each server R times; keep each path's least CPU"
    )
    parser.add_argument("--only", default="asgi,quart,trioserve")
    parser.add_argument(
        "--paths",
        default="healthz,create,turns,events",
        help="trioserve's paths to measure (turns need create)",
    )
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--profile", type=Path, help="run trioserve under cProfile, into DIR")
    parser.add_argument(
        "--callgrind",
        type=Path,
        help="run trioserve under valgrind's callgrind, into DIR: instructions per request",
    )
    parser.add_argument(
        "--flags", default="", help="more flags for trioserve run (one string, split on spaces)"
    )
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve)
        return 0
    results: dict[str, Any] = {
        "method": "server CPU (utime+stime, /proc/PID/stat) over N sequential requests",
        "machine": machine_info(),
        "loadavg_before": os.getloadavg(),
    }
    only = args.only.split(",")
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for _ in range(args.repeat):  # the servers one after the other, repeat times
        for kind in ("asgi", "quart"):
            if kind in only:
                runs[kind].append(bare(kind, args.requests, args.warmup, args.callgrind))
        if "trioserve" in only:
            flags = args.flags.split()
            runs["trioserve"].append(
                trioserve(
                    args.requests,
                    args.warmup,
                    args.profile,
                    flags,
                    args.callgrind,
                    tuple(args.paths.split(",")),
                )
            )
    for kind, done in runs.items():
        results[kind] = _least(done)
    results["loadavg_after"] = os.getloadavg()
    for kind in ("asgi", "quart", "trioserve"):
        for path, fig in results.get(kind, {}).items():
            if isinstance(fig, dict):
                extra = ""
                if "server_instructions_k" in fig:
                    extra += f"  {fig['server_instructions_k']:,} k instructions"
                if "first_event_p50_ms" in fig:
                    extra = f"  first event p50 {fig['first_event_p50_ms']} ms"
                print(
                    f"{kind:9} {path:20} {fig['server_cpu_us']:8.1f} µs CPU"
                    f"  wall p50 {fig['wall_p50_ms']} ms{extra}"
                )
    print(f"load average before/after: {results['loadavg_before']} / {results['loadavg_after']}")
    if args.profile is not None and "trioserve" in results:
        for i, path in enumerate(results["trioserve"]):
            print(f"\n== {path} ==")
            print(summarize_profile(args.profile / f"{i}.prof", args.requests))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
