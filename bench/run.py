"""trioserve benchmark suite: fourteen scenarios (a-n) against a real ``trioserve run``.

Every scenario starts its own server subprocess (``trioserve run SPEC --port 0``
with the scenario's flags), drives it over 127.0.0.1 only, and stops it with
SIGTERM.  Turns run ``bench/.build/tinyadapter``, a tiny C adapter compiled
here with gcc, so the figures measure the server rather than an adapter.

    python bench/run.py                  # full run, about 2.5 min on 2 cores
    python bench/run.py --quick          # reduced smoke run, about 40 s
    python bench/run.py --wait-quiet 180 # on a shared machine: wait for it to be idle
    python bench/run.py --only a,b --json out.json
    python bench/run.py --only a --profile pyspy   # py-spy samples of the server

Scenarios (targets in brackets; see docs/benchmarks.md):

a. create + one turn, end to end, sequential, sync httpx.Client    [p50 <= 2 ms]
b. events/s through one SSE stream (50,000 message events)         [>= 120,000 /s]
c. 64 sessions x 5 turns concurrently, --max-concurrent-turns 64   [<= 0.5 s]
d. server RSS with 500 streams open (adapters hang after started)  [<= 64 MiB]
e. session creates/s with the SQLite store, --max-sessions 1000    [>= 1,500 /s]
f. b with the event log in SQLite (every event stored before sent)  [>= 75% of core b]
g. resume: replay a 50,000-event log from SQLite, as SSE and JSON
h. slow-start adapter (1.5 s before it reads stdin), turns 2 s apart,
   --warm-adapters 1 vs 0                             [on p50 <= 60 ms; off >= 1.5 s]
i. a burst of 8 turns, --warm-adapters 2, same slow adapter: the rest
   start cold                                                      [0 errors]
j. one 8 MiB event (--max-event-bytes 16MiB), checked byte for byte  [intact]
k. GET /v1/sessions?limit=50 over 100,000 sessions in SQLite, the first
   page and deep pages (before=)                                [p50 < 5 ms]
l. an adapter burning 1 s of CPU before it reads stdin: 20 turns back to
   back (pool off, then --warm-adapters 1 and 2, --warm-adapters-max 4), 10 turns
   2 s apart (--warm-adapters 1), 3 bursts of 4 (pool off, then
   --warm-adapters 2 --warm-adapters-max 4); time to first event
                 [back to back p50 <= 0.5 x cold, max <= cold p50; spaced p50 <= 60 ms;
                  first burst p50 <= 0.6 x cold]
m. c (64 x 5) and creates/s without a cap on one server: --in-memory, the SQLite
   store, then PostgreSQL (a fresh schema) with --workers 1 and 2 (bench --workers);
   CPU summed over the supervisor and its workers, RSS per worker, PostgreSQL
   backends' CPU and round trips per create and per turn (ss -ti segments)
                            [workers 2: 64 x 5 <= 0.40 s, >= 5,000 creates/s]
n. two replicas (two ``trioserve run`` on one PostgreSQL schema): 64 x 5 with
   every session's turns on one replica, then alternating between the two;
   turns/s of each, and the CPU per turn

Targets of a and b are issue 5's (issue 2's were 3 ms and 60,000 /s); c, d
and e keep issue 2's, f issue 4's.

Only the standard library, httpx and trio are used, and psycopg (the
``postgres`` extra) for m and n, whose PostgreSQL is ``$TRIOSERVE_BENCH_PG_URL``
(default ``postgresql://postgres@127.0.0.1:5432/test``).  Scenario a (and b) use a
sync ``httpx.Client``: for one request at a time it has less overhead than
``httpx.AsyncClient`` under trio (which goes through anyio).  Scenarios c, d
and e need concurrency and use ``RawConn``, a minimal keep-alive HTTP/1.1
client over trio sockets, so the client costs as little CPU as possible on a
2-core machine where client and server share the cores.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import trio

BENCH = Path(__file__).resolve().parent
BUILD = BENCH / ".build"
ADAPTER_SRC = BENCH / "tinyadapter.c"
ADAPTER = BUILD / "tinyadapter"
_URL = re.compile(r" on (http://\S+) ")
JSON_HEADERS = {"Content-Type": "application/json"}
SPEC_YAML = """\
apiVersion: agent-controller.dev/v1alpha1
kind: Agent
metadata: {name: bench}
spec:
  model: {provider: anthropic, name: bench-model}
  task: bench
  tools: []
  runtime: {type: echo}
"""


class BenchError(RuntimeError):
    """A scenario could not run or its results failed verification."""


# -- parameters ----------------------------------------------------------------


@dataclass(frozen=True)
class Params:
    """Sizes of every scenario; ``quick`` shrinks them for a smoke run."""

    a_warmup: int = 20
    a_iters: int = 300
    a_spawn_iters: int = 100
    b_events: int = 50_000
    b_runs: int = 3
    c_sessions: int = 64
    c_turns: int = 5
    c_rounds: int = 3
    d_streams: int = 500
    d_hold: float = 15.0
    d_fd_probe: bool = True
    e_sessions: int = 1000
    e_clients: int = 8
    h_sleep_ms: int = 1500  # the slow adapter's start-up (h and i)
    h_spacing: float = 2.0
    h_turns: int = 10  # per mode (pool on, pool off)
    i_turns: int = 8
    i_pool: int = 2
    i_max_turns: int = 16
    j_bytes: int = 8 << 20
    j_max_event_bytes: str = "16MiB"
    j_runs: int = 3
    m_creates: int = 3000  # scenario m: creates without a cap, per configuration
    m_clients: int = 16  # enough connections for SO_REUSEPORT to spread over the workers
    m_trips: int = 50  # sequential creates, then turns, whose PostgreSQL round trips are counted
    m_workers: tuple[int, ...] = (1, 2)  # --workers values on PostgreSQL (bench --workers)
    k_sessions: int = 100_000
    k_requests: int = 500  # per kind of page
    l_burn_ms: int = 1000  # the CPU-burning slow start (scenario l)
    l_turns: int = 20  # back to back, per mode
    l_pools: tuple[tuple[str, ...], ...] = (  # back to back with the pool on, each
        ("--warm-adapters", "1", "--warm-adapters-max", "4"),
        ("--warm-adapters", "2", "--warm-adapters-max", "4"),
    )
    l_spaced_turns: int = 10
    l_spacing: float = 2.0
    l_burst: int = 4
    l_bursts: int = 3
    l_burst_gap: float = 4.0
    l_burst_pool: tuple[str, ...] = ("--warm-adapters", "2", "--warm-adapters-max", "4")

    @classmethod
    def quick(cls) -> Params:
        return cls(
            a_warmup=5,
            a_iters=50,
            a_spawn_iters=20,
            b_events=10_000,
            b_runs=1,
            c_rounds=1,
            d_streams=100,
            d_hold=0.0,
            d_fd_probe=False,
            e_sessions=200,
            h_turns=3,
            j_runs=1,
            m_creates=600,
            m_trips=20,
            k_sessions=20_000,
            k_requests=100,
            l_turns=6,
            l_spaced_turns=3,
            l_bursts=1,
        )


@dataclass
class Metric:
    """One reported figure, with its target if it has one."""

    name: str
    value: float
    unit: str
    target: str = ""
    met: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "target": self.target or None,
            "met": self.met,
        }


@dataclass
class Result:
    scenario: str
    title: str
    metrics: list[Metric] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def add(
        self,
        name: str,
        value: float,
        unit: str,
        target: str = "",
        met: bool | None = None,
    ) -> None:
        self.metrics.append(Metric(name, value, unit, target, met))

    def as_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "metrics": [m.as_dict() for m in self.metrics],
            "details": self.details,
        }


# -- statistics ----------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile (0..100) with linear interpolation."""
    if not values:
        raise ValueError("no samples")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def latency_summary(samples: list[float]) -> dict[str, float]:
    return {
        "n": len(samples),
        "p50_ms": ms(percentile(samples, 50)),
        "p90_ms": ms(percentile(samples, 90)),
        "p99_ms": ms(percentile(samples, 99)),
        "min_ms": ms(min(samples)),
        "max_ms": ms(max(samples)),
        "mean_ms": ms(statistics.fmean(samples)),
    }


# -- building the adapter ------------------------------------------------------


def build_adapter() -> Path:
    """Compile ``tinyadapter.c`` into ``bench/.build`` unless the binary is fresh."""
    BUILD.mkdir(exist_ok=True)
    if ADAPTER.exists() and ADAPTER.stat().st_mtime >= ADAPTER_SRC.stat().st_mtime:
        return ADAPTER
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise BenchError("gcc not found: it is needed to build bench/.build/tinyadapter")
    cmd = [gcc, "-O2", "-Wall", "-Wextra", "-o", str(ADAPTER), str(ADAPTER_SRC)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise BenchError(f"building the adapter failed: {done.stderr.strip()}")
    return ADAPTER


def adapter_command(*args: str) -> str:
    return shlex.join([str(ADAPTER), *args])


# -- the server subprocess -----------------------------------------------------


def trioserve_argv() -> list[str]:
    script = Path(sys.executable).with_name("trioserve")
    return [str(script)] if script.exists() else [sys.executable, "-m", "trioserve"]


@dataclass
class Server:
    """One ``trioserve run`` subprocess; its stderr is collected by a thread."""

    name: str
    workdir: Path
    runtime_command: str
    flags: list[str]
    prefix: list[str] | None = None  # e.g. ``python -m cProfile -o X -m trioserve``
    nofile: int | None = None  # RLIMIT_NOFILE soft limit for the server, if set
    proc: subprocess.Popen[bytes] | None = None
    url: str = ""
    log: list[str] = field(default_factory=list)
    exit_code: int | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def port(self) -> int:
        port = urlsplit(self.url).port
        assert port is not None
        return port

    def start(self, timeout: float = 60.0) -> None:
        spec = self.workdir / "spec.yaml"
        spec.write_text(SPEC_YAML)
        argv = [*(self.prefix or trioserve_argv()), "run", str(spec), "--port", "0"]
        argv += ["--runtime-command", self.runtime_command, *self.flags]
        env = dict(os.environ)
        env.pop("TRIOSERVE_RUNTIME_COMMAND", None)
        env["XDG_DATA_HOME"] = str(self.workdir / "xdg")
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=self.workdir,
            env=env,
            preexec_fn=self._limit_fds if self.nofile else None,
        )
        ready = threading.Event()
        threading.Thread(target=self._pump, args=(ready,), daemon=True).start()
        if not ready.wait(timeout) or not self.url:
            self.proc.kill()
            self.proc.wait(10)
            tail = "".join(self.log[-20:]).strip()
            raise BenchError(f"server {self.name!r} did not start:\n{tail}")

    def _limit_fds(self) -> None:
        assert self.nofile is not None
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, hard))

    def _pump(self, ready: threading.Event) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace")
            self.log.append(line)
            if not self.url and (match := _URL.search(line)):
                self.url = match.group(1)
                ready.set()
        ready.set()

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (drain), then wait; SIGKILL if it does not exit in ``timeout``."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.exit_code = self.proc.returncode
        return self.exit_code

    def log_mentions(self, *needles: str) -> list[str]:
        return [line.strip() for line in self.log if any(n in line for n in needles)]


# -- /proc helpers -------------------------------------------------------------


def proc_status(pid: int) -> dict[str, str]:
    out = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def rss_mib(pid: int, key: str = "VmRSS") -> float:
    kib = int(proc_status(pid)[key].split()[0])
    return round(kib / 1024, 1)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` (all its threads, not its children)."""
    with open(f"/proc/{pid}/stat") as fh:
        stat = fh.read()
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def fd_limit(pid: int) -> str:
    with open(f"/proc/{pid}/limits") as fh:
        for line in fh:
            if line.startswith("Max open files"):
                return " ".join(line.split()[3:5])
    return "?"


def _is_reaper(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"trioserve.runtime.reaper" in fh.read()
    except OSError:
        return False


def children_of(pid: int) -> list[int]:
    """Adapter pids whose parent is ``pid`` (zombies included).

    The server's one reaper process (``trioserve.runtime.reaper``) is not an adapter
    and is left out.
    """
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == pid and not _is_reaper(entry):
            kids.append(int(entry))
    return kids


def cpu_busy(interval: float = 1.0) -> float:
    """Fraction of all CPUs busy (anyone's work) over ``interval`` seconds."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields), idle

    total0, idle0 = sample()
    time.sleep(interval)
    total1, idle1 = sample()
    spent = total1 - total0
    return round(1 - (idle1 - idle0) / spent, 3) if spent else 0.0


def wait_for_quiet(limit: float, budget: float) -> float:
    """Wait up to ``budget`` s for other load to drop below ``limit``; the last reading."""
    deadline = time.monotonic() + budget
    busy = cpu_busy()
    while busy > limit and time.monotonic() < deadline:
        busy = cpu_busy()
    return busy


def raise_fd_limit(wanted: int = 65536) -> tuple[int, int]:
    """Raise RLIMIT_NOFILE's soft limit (servers started later inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


# -- a minimal HTTP/1.1 client over trio sockets -------------------------------


class RawConn:
    """One keep-alive HTTP/1.1 connection: Content-Length and chunked bodies only."""

    def __init__(self, stream: trio.SocketStream, host: str) -> None:
        self._stream = stream
        self._host = host
        self._buf = bytearray()

    @classmethod
    async def open(cls, url: str) -> RawConn:
        parts = urlsplit(url)
        assert parts.hostname is not None and parts.port is not None
        stream = await trio.open_tcp_stream(parts.hostname, parts.port)
        return cls(stream, parts.netloc)

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def send_request(self, method: str, path: str, body: bytes = b"") -> None:
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self._host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        await self._stream.send_all(head.encode() + body)

    async def _fill(self) -> None:
        data = await self._stream.receive_some(1 << 18)
        if not data:
            raise BenchError("server closed the connection")
        self._buf += data

    async def read_head(self) -> tuple[int, dict[str, str]]:
        while (end := self._buf.find(b"\r\n\r\n")) < 0:
            await self._fill()
        lines = bytes(self._buf[:end]).decode("latin-1").split("\r\n")
        del self._buf[: end + 4]
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        return status, headers

    async def read_body(self, headers: dict[str, str]) -> bytes:
        if "content-length" in headers:
            size = int(headers["content-length"])
            while len(self._buf) < size:
                await self._fill()
            body = bytes(self._buf[:size])
            del self._buf[:size]
            return body
        if headers.get("transfer-encoding", "").lower() != "chunked":
            raise BenchError(f"unsupported response framing: {headers}")
        parts: list[bytes] = []
        while True:
            while (eol := self._buf.find(b"\r\n")) < 0:
                await self._fill()
            size = int(bytes(self._buf[:eol]).split(b";")[0], 16)
            need = eol + 2 + size + 2
            while len(self._buf) < need:
                await self._fill()
            parts.append(bytes(self._buf[eol + 2 : eol + 2 + size]))
            del self._buf[:need]
            if size == 0:
                return b"".join(parts)

    async def read_until(self, needle: bytes) -> bytes:
        """Read until ``needle`` has arrived; the raw bytes so far (framing included)."""
        while needle not in self._buf:
            await self._fill()
        return bytes(self._buf)

    async def request(
        self, method: str, path: str, body: bytes = b""
    ) -> tuple[int, dict[str, str], bytes]:
        await self.send_request(method, path, body)
        status, headers = await self.read_head()
        return status, headers, await self.read_body(headers)

    async def create_session(self) -> str:
        status, _, body = await self.request("POST", "/v1/sessions", b"{}")
        if status != 201:
            raise BenchError(f"POST /v1/sessions: {status} {body[:200]!r}")
        session_id: str = json.loads(body)["id"]
        return session_id


# -- SSE verification ----------------------------------------------------------


def check_sse(body: bytes, expected: int | None = None) -> Counter[str]:
    """Split an SSE body into frames; the last must be session.ended (completed)."""
    frames = body.split(b"\n\n")
    if frames[-1] != b"":
        raise BenchError(f"SSE body does not end with a blank line: {body[-200:]!r}")
    frames.pop()
    if not frames:
        raise BenchError("empty SSE body")
    last = frames[-1]
    if not last.startswith(b"event: session.ended\ndata: "):
        raise BenchError(f"last frame is not session.ended: {last[:300]!r}")
    reason = json.loads(last.split(b"\ndata: ", 1)[1].split(b"\n", 1)[0])["data"].get("reason")
    if reason != "completed":
        raise BenchError(f"session.ended with reason {reason!r}")
    if expected is not None and len(frames) != expected:
        raise BenchError(f"expected {expected} frames, got {len(frames)}")
    types: Counter[str] = Counter()
    for frame in frames:
        if not frame.startswith(b"event: "):
            raise BenchError(f"malformed frame: {frame[:200]!r}")
        types[frame[7 : frame.index(b"\n")].decode()] += 1
    return types


# -- profiling -----------------------------------------------------------------


@dataclass
class Profiler:
    """Optional profiling of each server: py-spy (attached) or cProfile (wrapping)."""

    mode: str  # "none" | "pyspy" | "cprofile"
    directory: Path
    _spy: subprocess.Popen[bytes] | None = None
    reports: dict[str, str] = field(default_factory=dict)

    def prefix(self, name: str) -> list[str] | None:
        if self.mode != "cprofile":
            return None
        out = self.directory / f"{name}.prof"
        return [sys.executable, "-m", "cProfile", "-o", str(out), "-m", "trioserve"]

    def attach(self, name: str, server: Server) -> None:
        if self.mode != "pyspy":
            return
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        out = self.directory / f"{name}.txt"
        argv = [spy, "record", "--pid", str(server.pid), "--rate", "1000"]
        argv += ["--format", "raw", "--nolineno", "--output", str(out), "--nonblocking"]
        self._spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)  # let py-spy attach before the traffic starts
        if self._spy.poll() is not None:
            err = self._spy.stderr.read().decode() if self._spy.stderr else ""
            raise BenchError(f"py-spy failed: {err.strip()}")

    def detach(self, name: str) -> None:
        if self._spy is None:
            return
        self._spy.send_signal(signal.SIGINT)
        try:
            self._spy.wait(30)
        except subprocess.TimeoutExpired:
            self._spy.kill()
            self._spy.wait(10)
        self._spy = None
        self.reports[name] = summarize_collapsed(self.directory / f"{name}.txt")

    def after_exit(self, name: str) -> None:
        if self.mode != "cprofile":
            return
        import io
        import pstats

        out = io.StringIO()
        stats = pstats.Stats(str(self.directory / f"{name}.prof"), stream=out)
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(25)
        self.reports[name] = out.getvalue()


#: Leaf frames that mean "waiting", not working: the event loop's epoll wait and
#: trio's idle worker threads.
IDLE_LEAVES = ("EpollIOManager.get_events", "WorkerThread._work")


def summarize_collapsed(path: Path, top: int = 25) -> str:
    """Top functions of a py-spy ``raw`` file, as shares of the non-idle samples."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = idle = 0
    if not path.exists():
        return f"(no samples: {path} missing)"
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        if frames[-1].startswith(IDLE_LEAVES):
            idle += count
            continue
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    busy = total - idle
    if busy <= 0:
        return "(no busy samples)"
    lines = [f"{total} samples, {idle} idle; shares of the {busy} busy samples", "-- self --"]
    lines += [f"{100 * n / busy:5.1f}%  {f}" for f, n in own.most_common(top)]
    lines.append("-- inclusive --")
    lines += [f"{100 * n / busy:5.1f}%  {f}" for f, n in inclusive.most_common(top)]
    return "\n".join(lines)


# -- the run context -----------------------------------------------------------


@dataclass
class Context:
    params: Params
    profiler: Profiler
    tmp: Path
    servers: dict[str, dict[str, Any]] = field(default_factory=dict)

    @contextlib.contextmanager
    def server(
        self, name: str, runtime_command: str, flags: list[str], nofile: int | None = None
    ) -> Iterator[Server]:
        workdir = self.tmp / name
        workdir.mkdir(parents=True, exist_ok=True)
        prefix = self.profiler.prefix(name)
        srv = Server(name, workdir, runtime_command, flags, prefix=prefix, nofile=nofile)
        srv.start()
        try:
            self.profiler.attach(name, srv)
            yield srv
        finally:
            self.profiler.detach(name)
            code = srv.stop()
            self.profiler.after_exit(name)
            errors = srv.log_mentions("ERROR", "Traceback", "Too many open files", "EMFILE")
            self.servers[name] = {
                "flags": flags,
                "nofile": nofile,
                "runtime_command": runtime_command,
                "exit_code": code,
                "log_errors": errors[:20],
            }


# -- scenario a: create + one turn end to end ----------------------------------


def _pdeathsig_hook() -> Callable[[], None]:
    """The same preexec hook as the server's (PR_SET_PDEATHSIG=SIGKILL via libc)."""
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

    def hook() -> None:
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)

    return hook


async def _trio_spawn_samples(iters: int, spec: bytes, **kwargs: Any) -> list[float]:
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        proc = await trio.lowlevel.open_process(
            [str(ADAPTER), "1"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            **kwargs,
        )
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        await proc.stdin.send_all(spec)
        await proc.stdin.aclose()
        while await proc.stdout.receive_some(65536):
            pass
        await proc.wait()
        samples.append(time.perf_counter() - t0)
        await proc.stdout.aclose()
        await proc.stderr.aclose()
    return samples


def spawn_floor(iters: int) -> dict[str, float]:
    """p50 of running the adapter from the bench process itself (no server, no HTTP).

    ``preexec_fn`` (the server sets one for PR_SET_PDEATHSIG) makes CPython use
    fork() instead of vfork(), which costs more the bigger the parent is.
    """
    spec = b'{"sessionId":"s_x","task":"bench"}'
    hook = _pdeathsig_hook()

    def run(**kwargs: Any) -> float:
        samples = []
        for _ in range(iters):
            t0 = time.perf_counter()
            subprocess.run(
                [str(ADAPTER), "1"], input=spec, capture_output=True, check=True, **kwargs
            )
            samples.append(time.perf_counter() - t0)
        return ms(percentile(samples, 50))

    like_server = {"start_new_session": True, "preexec_fn": hook}
    return {
        "subprocess_plain_p50_ms": run(),
        "subprocess_new_session_p50_ms": run(start_new_session=True),
        "subprocess_new_session_preexec_p50_ms": run(**like_server),
        "trio_open_process_new_session_p50_ms": ms(
            percentile(
                trio.run(partial(_trio_spawn_samples, iters, spec, start_new_session=True)), 50
            )
        ),
        "trio_open_process_like_server_p50_ms": ms(
            percentile(trio.run(partial(_trio_spawn_samples, iters, spec, **like_server)), 50)
        ),
        "bench_process_rss_mib": rss_mib(os.getpid()),
    }


async def _a_raw(url: str, warmup: int, iters: int) -> list[float]:
    conn = await RawConn.open(url)
    samples = []
    try:
        for i in range(warmup + iters):
            t0 = time.perf_counter()
            sid = await conn.create_session()
            status, _, body = await conn.request(
                "POST", f"/v1/sessions/{sid}/turns", b'{"input":"hi"}'
            )
            elapsed = time.perf_counter() - t0
            if status != 200:
                raise BenchError(f"turn: HTTP {status}")
            check_sse(body, 3)
            if i >= warmup:
                samples.append(elapsed)
    finally:
        await conn.aclose()
    return samples


def scenario_a(ctx: Context) -> Result:
    p = ctx.params
    res = Result("a", "create + one turn end to end (sequential, sync httpx.Client)")
    total: list[float] = []
    create: list[float] = []
    turn: list[float] = []
    health: list[float] = []
    cpu0 = 0.0
    with (
        ctx.server("a", adapter_command("1"), ["--in-memory", "--max-sessions", "0"]) as srv,
        httpx.Client(base_url=srv.url, timeout=30) as client,
    ):
        for i in range(p.a_warmup + p.a_iters):
            if i == p.a_warmup:
                cpu0 = cpu_seconds(srv.pid)
            t0 = time.perf_counter()
            r = client.post("/v1/sessions", content=b"{}", headers=JSON_HEADERS)
            t1 = time.perf_counter()
            if r.status_code != 201:
                raise BenchError(f"create: HTTP {r.status_code} {r.text[:200]}")
            sid = r.json()["id"]
            t2 = time.perf_counter()
            r = client.post(
                f"/v1/sessions/{sid}/turns", content=b'{"input":"hi"}', headers=JSON_HEADERS
            )
            body = r.content
            t3 = time.perf_counter()
            if r.status_code != 200:
                raise BenchError(f"turn: HTTP {r.status_code} {r.text[:200]}")
            check_sse(body, 3)
            if i >= p.a_warmup:
                total.append(t3 - t0)
                create.append(t1 - t0)
                turn.append(t3 - t2)
        cpu_per_iter = (cpu_seconds(srv.pid) - cpu0) / p.a_iters
        cpu0 = cpu_seconds(srv.pid)
        for _ in range(p.a_iters):
            t0 = time.perf_counter()
            client.get("/healthz").raise_for_status()
            health.append(time.perf_counter() - t0)
        cpu_per_health = (cpu_seconds(srv.pid) - cpu0) / p.a_iters
        raw = trio.run(_a_raw, srv.url, p.a_warmup, p.a_iters)
    summary = latency_summary(total)
    res.details = {
        "client": "httpx.Client (sync, one keep-alive connection)",
        "warmup": p.a_warmup,
        "create_plus_turn": summary,
        "create_only": latency_summary(create),
        "turn_only": latency_summary(turn),
        "server_cpu_ms_per_iteration": ms(cpu_per_iter),
        "server_cpu_ms_per_healthz": ms(cpu_per_health),
        "healthz_round_trip": latency_summary(health),
        "raw_client_create_plus_turn": latency_summary(raw),
        "adapter_spawn_floor_no_server": spawn_floor(p.a_spawn_iters),
    }
    p50 = summary["p50_ms"]
    res.add("create+turn p50", p50, "ms", "<= 2 ms", p50 <= 2.0)
    res.add("create+turn p90", summary["p90_ms"], "ms")
    res.add("create+turn p99", summary["p99_ms"], "ms")
    res.add("  server CPU per create+turn", ms(cpu_per_iter), "ms")
    res.add("  create only p50", res.details["create_only"]["p50_ms"], "ms")
    res.add("  turn only p50", res.details["turn_only"]["p50_ms"], "ms")
    res.add("  GET /healthz p50", res.details["healthz_round_trip"]["p50_ms"], "ms")
    res.add("  server CPU per GET /healthz", ms(cpu_per_health), "ms")
    res.add("  raw-socket client p50", res.details["raw_client_create_plus_turn"]["p50_ms"], "ms")
    floor = res.details["adapter_spawn_floor_no_server"]
    res.add("  spawn floor, vfork (no server)", floor["trio_open_process_new_session_p50_ms"], "ms")
    res.add("  spawn floor, fork+preexec", floor["trio_open_process_like_server_p50_ms"], "ms")
    return res


# -- scenario b: events/s through one stream -----------------------------------


def _stream_once(client: httpx.Client, n: int) -> tuple[str, bytes, float, float | None]:
    """One turn of ``n`` message events; returns (session, SSE body, seconds, first byte at)."""
    r = client.post("/v1/sessions", content=b"{}", headers=JSON_HEADERS)
    sid = r.json()["id"]
    chunks: list[bytes] = []
    t0 = time.perf_counter()
    first: float | None = None
    with client.stream(
        "POST", f"/v1/sessions/{sid}/turns", content=b"{}", headers=JSON_HEADERS
    ) as resp:
        if resp.status_code != 200:
            raise BenchError(f"turn: HTTP {resp.status_code}")
        for chunk in resp.iter_raw():
            if first is None:
                first = time.perf_counter()
            chunks.append(chunk)
    body = b"".join(chunks)
    types = check_sse(body, n + 2)
    if types["message"] != n or types["session.started"] != 1:
        raise BenchError(f"unexpected event mix: {dict(types)}")
    return sid, body, time.perf_counter() - t0, None if first is None else first - t0


def _stream_rate(ctx: Context, name: str, flags: list[str], target: int) -> Result:
    p = ctx.params
    n = p.b_events
    store = "SQLite" if "sqlite" in flags else "memory"
    res = Result(name, f"events/s through one SSE stream ({n:,} message events, {store} log)")
    runs: list[dict[str, float]] = []
    with (
        ctx.server(name, adapter_command(str(n)), flags) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as client,
    ):
        for i in range(1 + p.b_runs):  # the first run warms up
            cpu0, client0 = cpu_seconds(srv.pid), time.process_time()
            _, body, elapsed, first = _stream_once(client, n)
            cpu = cpu_seconds(srv.pid) - cpu0
            client_cpu = time.process_time() - client0
            if i == 0:
                continue
            runs.append(
                {
                    "seconds": round(elapsed, 4),
                    "events_per_s": round((n + 2) / elapsed),
                    "mib_per_s": round(len(body) / elapsed / 2**20, 1),
                    "first_byte_ms": ms(first or 0.0),
                    "bytes": len(body),
                    "server_cpu_s": round(cpu, 3),
                    "server_cpu_us_per_event": round(cpu / (n + 2) * 1e6, 2),
                    "client_cpu_s": round(client_cpu, 3),
                }
            )
    rates = [r["events_per_s"] for r in runs]
    best, median = max(rates), statistics.median(rates)
    res.details = {"events": n + 2, "client": "httpx.Client.stream iter_raw", "runs": runs}
    res.add("events/s (median)", round(median), "ev/s", f">= {target:,}", median >= target)
    res.add("events/s (best)", best, "ev/s")
    res.add("  MiB/s (median)", statistics.median(r["mib_per_s"] for r in runs), "MiB/s")
    cpu_per_event = statistics.median(r["server_cpu_us_per_event"] for r in runs)
    res.add("  server CPU per event", cpu_per_event, "us")
    res.add(
        "  client CPU / wall",
        round(sum(r["client_cpu_s"] for r in runs) / sum(r["seconds"] for r in runs), 2),
        "",
    )
    return res


#: Scenario b's figure when the core server was measured (docs/benchmarks.md).
CORE_STREAM_RATE = 104_988


def scenario_b(ctx: Context) -> Result:
    return _stream_rate(ctx, "b", ["--in-memory"], 120_000)


def scenario_f(ctx: Context) -> Result:
    """The durable log: the same stream with every event written to SQLite first."""
    return _stream_rate(ctx, "f", ["--store", "sqlite"], round(CORE_STREAM_RATE * 0.75))


def scenario_g(ctx: Context) -> Result:
    """The cost of resume: replay a 50,000-event log from seq 0 (SSE and JSON export)."""
    n = ctx.params.b_events
    res = Result("g", f"resume: replay {n + 2:,} logged events from SQLite")
    sse: list[float] = []
    export: list[float] = []
    with (
        ctx.server("g", adapter_command(str(n)), ["--store", "sqlite"]) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as client,
    ):
        sid, turn_body, _, _ = _stream_once(client, n)
        for _ in range(1 + ctx.params.b_runs):
            t0 = time.perf_counter()
            with client.stream("GET", f"/v1/sessions/{sid}/events") as resp:
                body = b"".join(resp.iter_raw())
            sse.append(time.perf_counter() - t0)
            if body != turn_body:
                raise BenchError("the replay differs from the turn's own stream")
            t0 = time.perf_counter()
            resp = client.get(f"/v1/sessions/{sid}/events", params={"format": "json"})
            export.append(time.perf_counter() - t0)
            if len(resp.json()) != n + 2:
                raise BenchError(f"export: {len(resp.json())} events, expected {n + 2}")
    sse, export = sse[1:], export[1:]  # the first run warms up
    res.details = {"events": n + 2, "sse_seconds": sse, "json_seconds": export}
    res.add("replay as SSE (median)", ms(statistics.median(sse)), "ms")
    res.add("  events/s", round((n + 2) / statistics.median(sse)), "ev/s")
    res.add("export as JSON (median)", ms(statistics.median(export)), "ms")
    return res


# -- scenario c: 64 sessions x 5 turns concurrently ----------------------------


async def _c_round(
    conns: list[list[RawConn]], sids: list[str], turns: int
) -> tuple[float, list[float], int]:
    """Each session's turns in turn; turn ``i`` of session ``s`` on ``conns[s][i % k]``."""
    latencies: list[float] = []
    ended = 0

    async def worker(mine: list[RawConn], sid: str) -> None:
        nonlocal ended
        for i in range(turns):
            conn = mine[i % len(mine)]
            t0 = time.perf_counter()
            status, _, body = await conn.request(
                "POST", f"/v1/sessions/{sid}/turns", b'{"input":"hi"}'
            )
            latencies.append(time.perf_counter() - t0)
            if status != 200:
                raise BenchError(f"turn: HTTP {status} {body[:200]!r}")
            check_sse(body, 3)
            ended += 1

    t0 = time.perf_counter()
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            for conn, sid in zip(conns, sids, strict=True):
                nursery.start_soon(worker, conn, sid)
    return time.perf_counter() - t0, latencies, ended


async def _c_main(
    urls: list[str],
    sessions: int,
    turns: int,
    rounds: int,
    cpu_of: Callable[[], float],
    db_cpu_of: Callable[[], float] | None = None,
) -> list[dict[str, Any]]:
    """``rounds`` of ``sessions`` x ``turns``; with several ``urls`` (replicas) session ``s``
    starts on ``urls[s % k]`` and each next turn goes to the next replica.  ``cpu_of``: the
    server's CPU seconds so far; ``db_cpu_of``: the database's (PostgreSQL backends)."""
    k = len(urls)
    conns = [[await RawConn.open(urls[(s + j) % k]) for j in range(k)] for s in range(sessions)]
    try:
        sids = [await conns[0][0].create_session() for _ in range(sessions)]
        await _c_round(conns, sids, 1)  # warm-up: one turn per session
        out = []
        for _ in range(rounds):
            load = os.getloadavg()[0]
            cpu0, db0 = cpu_of(), db_cpu_of() if db_cpu_of else 0.0
            wall, latencies, ended = await _c_round(conns, sids, turns)
            cpu = cpu_of() - cpu0
            if ended != sessions * turns:
                raise BenchError(f"only {ended} of {sessions * turns} turns ended")
            row: dict[str, Any] = {}
            if db_cpu_of:
                row["db_cpu_ms_per_turn"] = round((db_cpu_of() - db0) / ended * 1000, 2)
            out.append(
                row
                | {
                    "wall_s": round(wall, 4),
                    "turns_ended": ended,
                    "turns_per_s": round(ended / wall),
                    "server_cpu_s": round(cpu, 3),
                    "server_cpu_ms_per_turn": round(cpu / ended * 1000, 2),
                    "turn_latency": latency_summary(latencies),
                    "loadavg_1min_before": load,
                }
            )
        return out
    finally:
        for conn in (c for mine in conns for c in mine):
            await conn.aclose()


def scenario_c(ctx: Context) -> Result:
    p = ctx.params
    s, t = p.c_sessions, p.c_turns
    res = Result("c", f"{s} sessions x {t} turns concurrently (--max-concurrent-turns {s})")
    flags = ["--in-memory", "--max-concurrent-turns", str(s), "--max-sessions", "0"]
    with ctx.server("c", adapter_command("1"), flags) as srv:
        rounds = trio.run(_c_main, [srv.url], s, t, p.c_rounds, partial(cpu_seconds, srv.pid))
    walls = [r["wall_s"] for r in rounds]
    median = statistics.median(walls)
    res.details = {"client": "RawConn (trio), one connection per session", "rounds": rounds}
    res.add(f"{s}x{t} wall (median)", median, "s", "<= 0.5 s", median <= 0.5)
    res.add(f"{s}x{t} wall (best)", min(walls), "s")
    res.add("  turns/s (median)", statistics.median(r["turns_per_s"] for r in rounds), "turns/s")
    cpu_per_turn = statistics.median(r["server_cpu_ms_per_turn"] for r in rounds)
    res.add("  server CPU per turn", cpu_per_turn, "ms")
    res.add(
        "  turn latency p50 under load",
        statistics.median(r["turn_latency"]["p50_ms"] for r in rounds),
        "ms",
    )
    return res


# -- scenario d: RSS with 500 open streams -------------------------------------


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


def scenario_d(ctx: Context) -> Result:
    n = ctx.params.d_streams
    res = Result("d", f"server RSS with {n} streams open")
    flags = ["--in-memory", "--max-concurrent-turns", "0", "--max-sessions", "0"]
    with ctx.server("d", adapter_command("hang", "60"), flags) as srv:
        time.sleep(0.5)  # let the server finish starting before the idle RSS reading
        details = trio.run(_d_main, srv, n, 120.0, ctx.params.d_hold)
    details["server_log_errors"] = ctx.servers["d"]["log_errors"][:5]
    if ctx.params.d_fd_probe:
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


# -- scenario e: session creates/s with SQLite ---------------------------------


async def _e_main(
    srv: Server,
    n: int,
    clients: int,
    cpu_of: Callable[[], float] | None = None,
    db_cpu_of: Callable[[], float] | None = None,
) -> dict[str, Any]:
    cpu_of = cpu_of or partial(cpu_seconds, srv.pid)
    url = srv.url
    conns = [await RawConn.open(url) for _ in range(clients)]
    statuses: Counter[int] = Counter()
    latencies: list[float] = []
    issued = 0

    async def worker(conn: RawConn) -> None:
        nonlocal issued
        while issued < n:
            issued += 1
            t0 = time.perf_counter()
            status, _, _ = await conn.request("POST", "/v1/sessions", b"{}")
            latencies.append(time.perf_counter() - t0)
            statuses[status] += 1

    try:
        for conn in conns:  # warm-up: create and end one session per client
            sid = await conn.create_session()
            status, _, _ = await conn.request("DELETE", f"/v1/sessions/{sid}")
            if status != 204:
                raise BenchError(f"DELETE: HTTP {status}")
        load = os.getloadavg()[0]
        cpu0, db0 = cpu_of(), db_cpu_of() if db_cpu_of else 0.0
        t0 = time.perf_counter()
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for conn in conns:
                    nursery.start_soon(worker, conn)
        wall = time.perf_counter() - t0
        cpu = cpu_of() - cpu0
        db = db_cpu_of() - db0 if db_cpu_of else None
        over_status, _, over_body = await conns[0].request("POST", "/v1/sessions", b"{}")
        list_status, _, listing = await conns[0].request("GET", "/v1/sessions?status=active")
    finally:
        for conn in conns:
            await conn.aclose()
    active = len(json.loads(listing)) if list_status == 200 else -1
    out: dict[str, Any] = {} if db is None else {"db_cpu_ms_per_create": round(db / n * 1000, 3)}
    return out | {
        "clients": clients,
        "wall_s": round(wall, 4),
        "creates_per_s": round(n / wall),
        "server_cpu_s": round(cpu, 3),
        "server_cpu_ms_per_create": round(cpu / n * 1000, 3),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "create_latency": latency_summary(latencies),
        "loadavg_1min_before": load,
        "over_cap_status": over_status,
        "over_cap_body": json.loads(over_body) if over_body.strip() else None,
        "active_listed": active,
    }


def scenario_e(ctx: Context) -> Result:
    n = ctx.params.e_sessions
    res = Result("e", f"session creates/s, SQLite store, --max-sessions {n}")
    db = ctx.tmp / "e" / "sessions.db"
    flags = ["--store", f"sqlite:{db}", "--max-sessions", str(n)]
    with ctx.server("e", adapter_command("1"), flags) as srv:
        details = trio.run(_e_main, srv, n, ctx.params.e_clients)
    details["client"] = f"RawConn (trio), {ctx.params.e_clients} concurrent connections"
    res.details = details
    rate = details["creates_per_s"]
    created = details["statuses"].get("201", 0)
    res.add("creates/s", rate, "/s", ">= 1,500", rate >= 1500 and created == n)
    res.add("  created (201)", created, f"of {n}")
    res.add(f"  create #{n + 1} status", details["over_cap_status"], "", "429")
    res.metrics[-1].met = details["over_cap_status"] == 429
    listed = details["active_listed"]
    res.add("  active sessions listed", listed, "", str(n), listed == n)
    res.add("  create latency p50", details["create_latency"]["p50_ms"], "ms")
    res.add("  server CPU per create", details["server_cpu_ms_per_create"], "ms")
    return res


# -- scenarios m and n: --workers and replicas on PostgreSQL -------------------

PG_URL = os.environ.get("TRIOSERVE_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
_SEGS = re.compile(r"\bdata_segs_(out|in):(\d+)")


@contextlib.contextmanager
def pg_store(name: str) -> Iterator[tuple[str, str]]:
    """A store URL on a fresh schema, and the schema's name; the schema is dropped afterwards.

    The name (``$TRIOSERVE_BENCH_PG_PREFIX``, default ``bench``, then ``_NAME_HEX``) is
    also the connections' ``application_name``: ``pg_backends`` finds them by it.
    """
    import psycopg  # the 'postgres' extra: only scenarios m and n need it

    prefix = os.environ.get("TRIOSERVE_BENCH_PG_PREFIX", "bench")
    schema = f"{prefix}_{name}_{os.urandom(4).hex()}"
    try:
        yield f"{PG_URL}?schema={schema}&application_name={schema}", schema
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def pg_backends(app: str) -> dict[int, int]:
    """The PostgreSQL backends of connections named ``app``: pid -> the client's port."""
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid, client_port FROM pg_stat_activity WHERE application_name = %s", (app,)
        ).fetchall()
    return {int(pid): int(port) for pid, port in rows}


def pg_segments(app: str) -> dict[str, int]:
    """TCP data segments the backends of ``app`` sent (``out``) and received (``in``), per ss -ti.

    On loopback a backend's response to one statement (or BEGIN, COMMIT) is one segment:
    ``out`` counts round trips (and NOTIFYs to a listener); a request may take two.
    """
    ports = set(pg_backends(app).values())
    cmd = ["ss", "-tinH", "state", "established", "( sport = :5432 )"]
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    total = {"out": 0, "in": 0}
    peer = 0
    for line in text.splitlines():
        if not line[:1].isspace():  # a socket's line; its details follow, indented
            peer = int(line.split()[-1].rpartition(":")[2])
        elif peer in ports:
            for kind, n in _SEGS.findall(line):
                total[kind] += int(n)
    return total


def _parents() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
                kids.setdefault(ppid, []).append(int(entry))
    return kids


def _cmdline(pid: int) -> bytes:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as fh:
        return fh.read()
    return b""


def server_tree(pid: int) -> list[int]:
    """``pid`` and its descendants that are trioserve processes: a supervisor's workers,
    reapers; not adapters (scenario c does not count those either)."""
    kids, out, todo = _parents(), [pid], [pid]
    while todo:
        for kid in kids.get(todo.pop(), []):
            if b"trioserve" in _cmdline(kid):
                out.append(kid)
                todo.append(kid)
    return out


def server_workers(pid: int) -> list[int]:
    """The processes that serve: ``pid`` itself, or a supervisor's ``trioserve run`` children."""
    kids = [p for p in server_tree(pid)[1:] if b"trioserve\x00run\x00" in _cmdline(p)]
    return kids or [pid]


@dataclass
class Meter:
    """User + system CPU seconds of a changing set of processes (each one's last reading)."""

    pids: Callable[[], list[int]]
    seen: dict[int, float] = field(default_factory=dict)

    def __call__(self) -> float:
        for pid in self.pids():
            with contextlib.suppress(OSError):
                self.seen[pid] = cpu_seconds(pid)
        return sum(self.seen.values())


def _servers_meter(*servers: Server) -> Meter:
    return Meter(lambda: [p for srv in servers for p in server_tree(srv.pid)])


def _pg_meter(app: str) -> Meter:
    return Meter(lambda: list(pg_backends(app)))


def _pg_round_trips(url: str, app: str, n: int) -> dict[str, float]:
    """Sequential creates, then sequential turns: the backends' segments per create and per turn."""
    with httpx.Client(base_url=url, timeout=30) as client:
        sid = _create(client)  # warm-up: the connection pool has a connection
        before = pg_segments(app)
        for _ in range(n):
            _create(client)
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


def _m_config(ctx: Context, name: str, store: list[str], app: str | None) -> dict[str, Any]:
    """Scenario c's rounds, then creates without a cap, on one server (and its workers)."""
    p = ctx.params
    flags = [*store, "--max-concurrent-turns", str(p.c_sessions), "--max-sessions", "0"]
    with ctx.server(name, adapter_command("1"), flags) as srv:
        cpu = _servers_meter(srv)
        db = _pg_meter(app) if app else None
        rounds = trio.run(_c_main, [srv.url], p.c_sessions, p.c_turns, p.c_rounds, cpu, db)
        rss = [rss_mib(pid) for pid in server_workers(srv.pid)]
        creates = trio.run(_e_main, srv, p.m_creates, p.m_clients, cpu, db)
        trips = _pg_round_trips(srv.url, app, p.m_trips) if app else {}
    return {"flags": flags, "rounds": rounds, "worker_rss_mib": rss, "creates": creates, **trips}


def _m_metrics(res: Result, label: str, out: dict[str, Any], targets: bool) -> None:
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


def scenario_m(ctx: Context) -> Result:
    p = ctx.params
    res = Result(
        "m", f"{p.c_sessions}x{p.c_turns} and creates/s: one process vs --workers N on PostgreSQL"
    )
    configs = {"memory": ["--in-memory"], "sqlite": ["--store", f"sqlite:{ctx.tmp / 'm.db'}"]}
    for label, store in configs.items():
        res.details[label] = out = _m_config(ctx, f"m-{label}", store, None)
        _m_metrics(res, label, out, targets=False)
    for n in p.m_workers:
        with pg_store(f"m{n}") as (url, app):
            store = ["--store", url, "--workers", str(n)]
            res.details[f"pg-w{n}"] = out = _m_config(ctx, f"m-pg-w{n}", store, app)
        _m_metrics(res, f"postgresql --workers {n}", out, targets=n == 2)
    return res


def scenario_n(ctx: Context) -> Result:
    p = ctx.params
    s, t = p.c_sessions, p.c_turns
    res = Result("n", f"two replicas on one PostgreSQL schema: {s}x{t} turns, one vs both")
    with pg_store("n") as (url, app):
        flags = ["--store", url, "--max-concurrent-turns", str(s), "--max-sessions", "0"]
        with (
            ctx.server("n-a", adapter_command("1"), flags) as a,
            ctx.server("n-b", adapter_command("1"), flags) as b,
        ):
            db = _pg_meter(app)
            one = trio.run(_c_main, [a.url], s, t, p.c_rounds, _servers_meter(a), db)
            two = trio.run(_c_main, [a.url, b.url], s, t, p.c_rounds, _servers_meter(a, b), db)
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


# -- scenarios h and i: the warm adapter pool with a slow-starting adapter -----


def warm_state(client: httpx.Client) -> tuple[int, int]:
    """``ready, target`` from ``GET /readyz``'s ``Trioserve-Warm-Adapters`` header."""
    r = client.get("/readyz")
    if r.status_code != 200:
        raise BenchError(f"GET /readyz: HTTP {r.status_code} {r.text[:200]}")
    header = r.headers.get("Trioserve-Warm-Adapters")
    if header is None:
        raise BenchError("GET /readyz has no Trioserve-Warm-Adapters header")
    ready, _, target = header.partition("/")
    return int(ready), int(target)


def wait_pool_full(client: httpx.Client, timeout: float = 30.0) -> float:
    """Poll ``/readyz`` until every warm adapter is started; the seconds it took."""
    t0 = time.perf_counter()
    while True:
        ready, target = warm_state(client)
        if ready >= target:
            return time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout:
            raise BenchError(f"the warm pool did not fill in {timeout:g} s ({ready}/{target})")
        time.sleep(0.02)


def _started_data(body: bytes) -> dict[str, Any]:
    """``data`` of the first frame (``session.started``; the slow adapter's pid, idleMs)."""
    head, sep, rest = body.partition(b"\ndata: ")
    if head != b"event: session.started" or not sep:
        raise BenchError(f"first frame is not session.started: {body[:200]!r}")
    data: dict[str, Any] = json.loads(rest.split(b"\n", 1)[0])["data"]
    return data


@dataclass
class TurnTiming:
    """One streamed turn, timed from sending its request (seconds)."""

    first_event: float  # its first frame (session.started) has arrived whole
    ended: float  # its session.ended frame has arrived whole
    seconds: float  # the whole response has been read
    body: bytes


def _turn(client: httpx.Client, sid: str) -> TurnTiming:
    """One turn over ``client``, its SSE body checked (3 events); see ``TurnTiming``."""
    chunks: list[bytes] = []
    seen = b""
    first: float | None = None
    ended: float | None = None
    t0 = time.perf_counter()
    with client.stream(
        "POST", f"/v1/sessions/{sid}/turns", content=b'{"input":"hi"}', headers=JSON_HEADERS
    ) as resp:
        if resp.status_code != 200:
            resp.read()
            raise BenchError(f"turn: HTTP {resp.status_code} {resp.text[:200]}")
        for chunk in resp.iter_raw():
            chunks.append(chunk)
            if first is None and b"\n\n" in b"".join(chunks):
                first = time.perf_counter()
            if ended is None:
                seen = seen[-64:] + chunk
                at = seen.find(b"event: session.ended\n")
                if at >= 0 and seen.find(b"\n\n", at) >= 0:
                    ended = time.perf_counter()
    end = time.perf_counter()
    body = b"".join(chunks)
    check_sse(body, 3)
    # ``ended`` is None if the frame straddled chunks in a way the window missed.
    return TurnTiming((first or end) - t0, (ended or end) - t0, end - t0, body)


def _slow_turns(
    ctx: Context, name: str, warm: int, turns: int, spacing: float, sleep_ms: int
) -> dict[str, Any]:
    """``turns`` sequential turns ``spacing`` s apart (start to start), alternately on a
    new session and on the previous turn's session."""
    flags = ["--in-memory", "--warm-adapters", str(warm)]
    samples: list[dict[str, Any]] = []
    with (
        ctx.server(name, adapter_command("slow", str(sleep_ms), "1"), flags) as srv,
        httpx.Client(base_url=srv.url, timeout=30) as client,
    ):
        fill = wait_pool_full(client) if warm else 0.0
        pool_state = warm_state(client)
        time.sleep(spacing)  # the pool's first adapter has finished loading by now
        sid = ""
        start = time.perf_counter()
        for i in range(turns):
            new = i % 2 == 0
            if new:
                r = client.post("/v1/sessions", content=b"{}", headers=JSON_HEADERS)
                if r.status_code != 201:
                    raise BenchError(f"create: HTTP {r.status_code} {r.text[:200]}")
                sid = r.json()["id"]
            time.sleep(max(0.0, start + i * spacing - time.perf_counter()))
            timing = _turn(client, sid)
            elapsed, started = timing.ended, _started_data(timing.body)
            samples.append(
                {
                    "seconds": round(elapsed, 4),
                    "session": "new" if new else "same",
                    "adapter_idle_ms": started.get("idleMs"),
                }
            )
    latencies = [s["seconds"] for s in samples]
    return {
        "flags": flags,
        "pool_fill_seconds": round(fill, 3),
        "pool_at_start": f"{pool_state[0]}/{pool_state[1]}",
        "turn_latency": latency_summary(latencies),
        "new_session_p50_ms": ms(
            percentile([s["seconds"] for s in samples if s["session"] == "new"], 50)
        ),
        "same_session_p50_ms": ms(
            percentile([s["seconds"] for s in samples if s["session"] == "same"] or [0.0], 50)
        ),
        "turns": samples,
    }


def scenario_h(ctx: Context) -> Result:
    """A slow-starting adapter (1.5 s before it reads its spec), turns 2 s apart."""
    p = ctx.params
    sleep_ms, n = p.h_sleep_ms, p.h_turns
    res = Result("h", f"slow-start adapter ({sleep_ms} ms), {n} turns {p.h_spacing:g} s apart")
    on = _slow_turns(ctx, "h_pool_on", 1, n, p.h_spacing, sleep_ms)
    off = _slow_turns(ctx, "h_pool_off", 0, n, p.h_spacing, sleep_ms)
    res.details = {"adapter_sleep_ms": sleep_ms, "spacing_s": p.h_spacing, "on": on, "off": off}
    on_p50, off_p50 = on["turn_latency"]["p50_ms"], off["turn_latency"]["p50_ms"]
    res.add("pool on (--warm-adapters 1) turn p50", on_p50, "ms", "<= 60 ms", on_p50 <= 60)
    res.add("  pool on: turn p90", on["turn_latency"]["p90_ms"], "ms")
    res.add("  pool on: max", on["turn_latency"]["max_ms"], "ms")
    res.add("  pool on: new session p50", on["new_session_p50_ms"], "ms")
    res.add("  pool on: same session p50", on["same_session_p50_ms"], "ms")
    target = f">= {sleep_ms:,} ms (baseline)"
    res.add("pool off (--warm-adapters 0) turn p50", off_p50, "ms", target, off_p50 >= sleep_ms)
    res.add("  pool off: turn p90", off["turn_latency"]["p90_ms"], "ms")
    res.add("  pool off: max", off["turn_latency"]["max_ms"], "ms")
    res.add("  off p50 / on p50", round(off_p50 / on_p50, 1), "x")
    return res


async def _i_burst(url: str, n: int, within: float, server_pid: int) -> dict[str, Any]:
    conns = [await RawConn.open(url) for _ in range(n)]
    outcomes: list[dict[str, Any]] = []
    peak = 0
    try:
        sids = [await conns[0].create_session() for _ in range(n)]
        done = trio.Event()

        async def watch() -> None:  # the server's adapter processes, warm ones included
            nonlocal peak
            while not done.is_set():
                peak = max(peak, len(children_of(server_pid)))
                await trio.sleep(0.02)

        async def turn(conn: RawConn, sid: str) -> None:
            t0 = time.perf_counter()
            status, _, body = await conn.request(
                "POST", f"/v1/sessions/{sid}/turns", b'{"input":"hi"}'
            )
            out: dict[str, Any] = {"seconds": round(time.perf_counter() - t0, 4)}
            out["status"] = status
            try:
                if status != 200:
                    raise BenchError(f"HTTP {status} {body[:200]!r}")
                check_sse(body, 3)
                out["adapter_idle_ms"] = _started_data(body).get("idleMs")
            except (BenchError, ValueError, KeyError) as exc:
                out["error"] = str(exc)[:300]
            outcomes.append(out)

        with trio.fail_after(within):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                async with trio.open_nursery() as burst:
                    for conn, sid in zip(conns, sids, strict=True):
                        burst.start_soon(turn, conn, sid)
                done.set()
    finally:
        for conn in conns:
            await conn.aclose()
    return {"turns": outcomes, "adapters_peak": peak}


def scenario_i(ctx: Context) -> Result:
    """A burst of more turns than warm adapters: the rest start cold, without errors."""
    p = ctx.params
    n, pool, cap, sleep_ms = p.i_turns, p.i_pool, p.i_max_turns, p.h_sleep_ms
    res = Result("i", f"a burst of {n} turns, {pool} warm adapters, slow start ({sleep_ms} ms)")
    flags = ["--in-memory", "--warm-adapters", str(pool), "--max-concurrent-turns", str(cap)]
    flags += ["--max-sessions", "0"]
    with (
        ctx.server("i", adapter_command("slow", str(sleep_ms), "1"), flags) as srv,
        httpx.Client(base_url=srv.url, timeout=30) as client,
    ):
        fill = wait_pool_full(client)
        time.sleep(sleep_ms / 1000 + 0.5)  # every warm adapter has finished loading
        details = trio.run(_i_burst, srv.url, n, 60.0, srv.pid)
        ready_after, _ = warm_state(client)  # the replacements started during the burst
        time.sleep(0.5)
        details["adapters_after"] = len(children_of(srv.pid))
    details.update(flags=flags, pool_fill_seconds=round(fill, 3), warm_ready_after=ready_after)
    res.details = details
    turns = details["turns"]
    errors = [t for t in turns if "error" in t]
    # A turn that got a process which had finished loading is fast; the others
    # waited for a start-up (all of it, or the rest of a replacement's).
    fast = [t["seconds"] for t in turns if "error" not in t and t["seconds"] < sleep_ms / 2000]
    slow = [t["seconds"] for t in turns if "error" not in t and t["seconds"] >= sleep_ms / 2000]
    res.add("errors", len(errors), f"of {n}", "0", not errors and len(turns) == n)
    res.add("  finished fast (a loaded warm adapter)", len(fast), f"of {n}")
    if fast:
        res.add("  fast turns: p50", ms(statistics.median(fast)), "ms")
    res.add("  finished slow (waited for a start-up)", len(slow), f"of {n}")
    if slow:
        res.add("  slow turns: p50", ms(statistics.median(slow)), "ms")
        res.add("  slow turns: max", ms(max(slow)), "ms")
    limit = cap + pool
    peak = details["adapters_peak"]
    res.add("  adapter processes at peak", peak, "procs", f"<= {limit}", peak <= limit)
    res.add("  warm adapters ready after the burst", ready_after, f"of {pool}", str(pool))
    res.metrics[-1].met = ready_after == pool
    if errors:
        raise BenchError(f"{len(errors)} of {n} turns failed: {errors[:3]}")
    return res


# -- scenario j: one 8 MiB event -----------------------------------------------


def big_text(size: int) -> str:
    """The text ``tinyadapter big SIZE`` prints: ``00000000,00000001,...`` cut to SIZE."""
    return "".join([f"{k:08d}," for k in range(size // 9 + 1)])[:size]


#: What ``tinyadapter big`` prints around the text, on the event's one line.
BIG_LINE_HEAD = b'{"v":1,"type":"message","sessionId":"s_bench","data":{"role":"assistant","text":"'
BIG_LINE_TAIL = b'"}}'


def scenario_j(ctx: Context) -> Result:
    """One event of 8 MiB of text, streamed and compared byte for byte."""
    p = ctx.params
    size = p.j_bytes
    line = len(BIG_LINE_HEAD) + size + len(BIG_LINE_TAIL)
    res = Result("j", f"one {size / 2**20:g} MiB event through the stream")
    expected = big_text(size)
    expected_bytes = expected.encode()
    flags = ["--in-memory", "--max-event-bytes", p.j_max_event_bytes]
    runs: list[dict[str, Any]] = []
    with (
        ctx.server("j", adapter_command("big", str(size)), flags) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as client,
    ):
        wait_pool_full(client)
        rss_idle = rss_mib(srv.pid)
        for i in range(1 + p.j_runs):  # the first run warms up
            r = client.post("/v1/sessions", content=b"{}", headers=JSON_HEADERS)
            if r.status_code != 201:
                raise BenchError(f"create: HTTP {r.status_code} {r.text[:200]}")
            cpu0 = cpu_seconds(srv.pid)
            timing = _turn(client, r.json()["id"])
            elapsed, body = timing.ended, timing.body
            cpu = cpu_seconds(srv.pid) - cpu0
            frame = body.split(b"\n\n")[1]
            head, _, rest = frame.partition(b"\ndata: ")
            data_line, _, id_line = rest.partition(b"\n")
            if head != b"event: message" or not id_line.startswith(b"id: "):
                raise BenchError(f"second frame is not a message: {frame[:200]!r}")
            event = json.loads(data_line)
            text = event["data"]["text"]
            if text != expected or text.encode() != expected_bytes:
                at = next(
                    (k for k, (a, b) in enumerate(zip(text, expected, strict=False)) if a != b),
                    min(len(text), size),
                )
                raise BenchError(f"the text differs ({len(text)} chars, first difference at {at})")
            if expected_bytes not in data_line:
                raise BenchError("the text is not in the SSE data line verbatim")
            if i == 0:
                continue
            runs.append(
                {
                    "seconds": round(elapsed, 4),
                    "mib_per_s": round(len(body) / elapsed / 2**20, 1),
                    "sse_bytes": len(body),
                    "data_line_bytes": len(data_line),
                    "server_cpu_s": round(cpu, 3),
                    "rss_after_mib": rss_mib(srv.pid),
                }
            )
        rss_after = rss_mib(srv.pid)
        rss_peak = rss_mib(srv.pid, "VmHWM")
    res.details = {
        "text_bytes": size,
        "adapter_line_bytes": line,
        "max_event_bytes": p.j_max_event_bytes,
        "runs": runs,
        "rss_idle_mib": rss_idle,
        "rss_after_mib": rss_after,
        "rss_peak_mib": rss_peak,
    }
    seconds = statistics.median(r["seconds"] for r in runs)
    res.add("intact (parsed, text byte for byte)", len(runs), f"of {len(runs)}", "all", True)
    res.add("  time, request to session.ended (median)", ms(seconds), "ms")
    res.add(
        "  server CPU per turn (median)", statistics.median(r["server_cpu_s"] for r in runs), "s"
    )
    res.add("  the event's line from the adapter", line, "bytes")
    res.add("  server RSS idle", rss_idle, "MiB")
    res.add("  server RSS peak (VmHWM)", rss_peak, "MiB")
    return res


# -- scenario k: paging GET /v1/sessions over 100,000 stored sessions -----------

#: A CompiledSpec as the bench agent's sessions store it (each row keeps one).
K_SPEC = json.dumps(
    {
        "v": 1,
        "metadata": {"name": "bench"},
        "model": {"provider": "anthropic", "name": "bench-model"},
        "task": "bench",
        "tools": [],
        "extensions": [],
        "skills": [],
        "runtime": {"type": "echo", "command": ["bench/.build/tinyadapter", "1"]},
    },
    separators=(",", ":"),
)


def _k_fill(db: Path, n: int) -> dict[str, Any]:
    """Insert ``n`` sessions straight into the (migrated) file, in one transaction.

    Every 100th is active, every 10th expired, the rest ended; two sessions
    share each activity time (ties are broken by id), ten seconds apart, all
    within the last 6 days, so neither the TTL nor the retention touches them.
    """
    now = int(time.time() * 1_000_000)
    rows = []
    for i in range(n):
        last = now - ((n - i) // 2) * 10_000_000
        status = "active" if i % 100 == 0 else "expired" if i % 10 == 1 else "ended"
        ended = None if status == "active" else last + 1_000_000
        sid = f"s_bench{i:07d}{(i * 2654435761) % 2**32:08x}"
        rows.append((sid, "bench", "echo", status, last - 60_000_000, last, K_SPEC, "{}", ended))
    t0 = time.perf_counter()
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO sessions (id, agent_name, runtime_type, status, created_at, "
            "last_active_at, spec, inputs, ended_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return {"fill_seconds": round(time.perf_counter() - t0, 2), "db_mib": file_mib(db)}


def file_mib(path: Path) -> float:
    return round(path.stat().st_size / 2**20, 1)


def _k_ids(db: Path, where: str = "") -> list[str]:
    """Every session id in the list's order (what the pages must add up to)."""
    conn = sqlite3.connect(db)
    try:
        sql = f"SELECT id FROM sessions {where} ORDER BY last_active_at DESC, id DESC"
        return [sid for (sid,) in conn.execute(sql)]
    finally:
        conn.close()


def _k_get(client: httpx.Client, target: str) -> tuple[float, list[str], str | None]:
    t0 = time.perf_counter()
    r = client.get(target)
    elapsed = time.perf_counter() - t0
    if r.status_code != 200:
        raise BenchError(f"GET {target}: HTTP {r.status_code} {r.text[:200]}")
    return elapsed, [s["id"] for s in r.json()], r.headers.get("Trioserve-Next-Page")


def _k_measure(
    client: httpx.Client, target: str, expected: list[str], iters: int, warmup: int = 20
) -> dict[str, Any]:
    """``iters`` timed GETs of ``target`` (after ``warmup``), each checked against ``expected``."""
    samples = []
    for i in range(warmup + iters):
        elapsed, got, _ = _k_get(client, target)
        if got != expected:
            raise BenchError(f"GET {target}: {got[:3]}... is not {expected[:3]}...")
        if i >= warmup:
            samples.append(elapsed)
    return {"target": target, **latency_summary(samples)}


def scenario_k(ctx: Context) -> Result:
    """``GET /v1/sessions?limit=50``: first and deep pages over 100,000 SQLite sessions."""
    p = ctx.params
    n, iters = p.k_sessions, p.k_requests
    res = Result("k", f"GET /v1/sessions?limit=50 over {n:,} sessions in SQLite")
    db = ctx.tmp / "k" / "sessions.db"
    flags = ["--store", f"sqlite:{db}", "--max-sessions", "0"]
    with ctx.server("k_migrate", adapter_command("1"), flags):
        pass  # the server makes the file and its schema
    fill = _k_fill(db, n)
    order = _k_ids(db)
    ended = _k_ids(db, "WHERE status = 'ended'")
    if len(order) != n:
        raise BenchError(f"the store holds {len(order)} sessions, not {n}")
    mid, deep = n // 2, n - 100
    pages: dict[str, dict[str, Any]] = {}
    with (
        ctx.server("k", adapter_command("1"), flags) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as client,
    ):
        health = []  # the HTTP floor at the same time, for comparison
        cpu0 = cpu_seconds(srv.pid)
        for _ in range(iters):
            t0 = time.perf_counter()
            client.get("/healthz").raise_for_status()
            health.append(time.perf_counter() - t0)
        cpu_health = (cpu_seconds(srv.pid) - cpu0) / iters
        cpu0 = cpu_seconds(srv.pid)
        pages["first"] = _k_measure(client, "/v1/sessions?limit=50", order[:50], iters)
        cpu_first = (cpu_seconds(srv.pid) - cpu0) / (iters + 20)
        for name, depth in (("middle", mid), ("deepest", deep)):
            # a token from the API: the next page after the page ending at depth - 1
            _, _, token = _k_get(client, f"/v1/sessions?limit=1&before={order[depth - 2]}")
            expected = order[depth : depth + 50]
            target = f"/v1/sessions?limit=50&before={token}"
            pages[f"{name} (token)"] = _k_measure(client, target, expected, iters)
            target = f"/v1/sessions?limit=50&before={order[depth - 1]}"
            pages[f"{name} (session id)"] = _k_measure(client, target, expected, iters)
        active = [sid for sid in order if int(sid[7:14]) % 100 == 0]
        target = "/v1/sessions?status=active&limit=50"
        pages["first, status=active"] = _k_measure(client, target, active[:50], iters)
        _, _, token = _k_get(
            client, f"/v1/sessions?status=ended&limit=1&before={ended[len(ended) // 2 - 2]}"
        )
        target = f"/v1/sessions?status=ended&limit=50&before={token}"
        expected = ended[len(ended) // 2 : len(ended) // 2 + 50]
        pages["middle, status=ended (token)"] = _k_measure(client, target, expected, iters)
        # every session, following the pages of 1,000: each once, in order
        t0 = time.perf_counter()
        walked: list[str] = []
        token = None
        while True:
            target = "/v1/sessions?limit=1000" + (f"&before={token}" if token else "")
            _, got, token = _k_get(client, target)
            walked += got
            if token is None:
                break
        walk = time.perf_counter() - t0
        if walked != order:
            raise BenchError(f"the pages hold {len(walked)} sessions, not the {n} in order")
        # the v0.8 behaviour: no limit, every session in one response
        t0 = time.perf_counter()
        r = client.get("/v1/sessions")
        unpaged = time.perf_counter() - t0
        if r.status_code != 200 or len(r.json()) != n:
            raise BenchError(f"GET /v1/sessions: HTTP {r.status_code}, not {n} sessions")
        unpaged_mib = round(len(r.content) / 2**20, 1)
        rss = rss_mib(srv.pid, "VmHWM")
    res.details = {
        "sessions": n,
        **fill,
        "requests_per_page_kind": iters,
        "client": "httpx.Client (sync, one keep-alive connection)",
        "pages": pages,
        "server_cpu_ms_per_first_page": ms(cpu_first),
        "healthz": latency_summary(health),
        "server_cpu_ms_per_healthz": ms(cpu_health),
        "walk_pages_of_1000_s": round(walk, 3),
        "unpaged_s": round(unpaged, 3),
        "unpaged_mib": unpaged_mib,
        "server_rss_peak_mib": rss,
    }
    for name, page in pages.items():
        p50 = page["p50_ms"]
        target = "< 5 ms" if name in ("first", "deepest (token)") else ""
        res.add(f"{name}: p50", p50, "ms", target, p50 < 5 if target else None)
        res.add(f"  {name}: p99", page["p99_ms"], "ms")
    res.add("  server CPU per first page", ms(cpu_first), "ms")
    res.add("  GET /healthz p50 (the HTTP floor, same server)", ms(percentile(health, 50)), "ms")
    res.add("  server CPU per GET /healthz", ms(cpu_health), "ms")
    res.add(f"every session, {-(-n // 1000)} pages of 1,000", round(walk, 3), "s")
    res.add(f"  no limit (v0.8): all {n:,} at once", round(unpaged, 3), "s")
    res.add("  no limit: response size", unpaged_mib, "MiB")
    res.add("  server RSS peak (VmHWM)", rss, "MiB")
    res.add(f"  filling the store ({n:,} rows, one transaction)", fill["fill_seconds"], "s")
    return res


# -- scenario l: a CPU-burning slow start: back to back, spaced, bursts ---------


def pool_json(client: httpx.Client) -> dict[str, Any]:
    """``warmAdapters`` of ``GET /readyz`` as JSON (ready, loading, target, loadMs, ...)."""
    r = client.get("/readyz", headers={"Accept": "application/json"})
    if r.status_code != 200:
        raise BenchError(f"GET /readyz: HTTP {r.status_code} {r.text[:200]}")
    warm: dict[str, Any] = r.json()["warmAdapters"]
    return warm


def wait_pool_ready(client: httpx.Client, timeout: float = 60.0) -> dict[str, Any]:
    """Poll ``/readyz`` until as many warm adapters are ready (loaded) as the pool wants."""
    t0 = time.perf_counter()
    while True:
        warm = pool_json(client)
        if warm["ready"] >= warm["target"]:
            return warm
        if time.perf_counter() - t0 > timeout:
            raise BenchError(f"the warm pool did not load in {timeout:g} s: {warm}")
        time.sleep(0.02)


def _first_event_turn(client: httpx.Client, sid: str) -> dict[str, Any]:
    """One turn (``_turn``): seconds to its first event and to its end, its adapter's
    pid and idleMs."""
    timing = _turn(client, sid)
    started = _started_data(timing.body)
    return {
        "first_event_s": round(timing.first_event, 4),
        "seconds": round(timing.seconds, 4),
        "pid": started.get("pid"),
        "adapter_idle_ms": started.get("idleMs"),
    }


def _l_series(
    ctx: Context, name: str, flags: list[str], turns: int, spacing: float
) -> dict[str, Any]:
    """``turns`` sequential turns, each on a new session, ``spacing`` s apart start to
    start (0: back to back, each sent as soon as the previous one has ended)."""
    p = ctx.params
    samples: list[dict[str, Any]] = []
    pool = flags[-1] != "0"
    with (
        ctx.server(name, adapter_command("burn", str(p.l_burn_ms), "1"), flags) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as client,
    ):
        sids = [_create(client) for _ in range(turns)]
        before = wait_pool_ready(client) if pool else pool_json(client)
        time.sleep(0.5)
        start = time.perf_counter()
        for i, sid in enumerate(sids):
            if spacing:
                time.sleep(max(0.0, start + i * spacing - time.perf_counter()))
            samples.append(_first_event_turn(client, sid))
        after = pool_json(client)
    first = [s["first_event_s"] for s in samples]
    return {
        "flags": flags,
        "pool_before": before,
        "pool_after": after,
        "first_event": latency_summary(first),
        "turns": samples,
    }


def _create(client: httpx.Client) -> str:
    r = client.post("/v1/sessions", content=b"{}", headers=JSON_HEADERS)
    if r.status_code != 201:
        raise BenchError(f"create: HTTP {r.status_code} {r.text[:200]}")
    sid: str = r.json()["id"]
    return sid


def _burst(clients: list[httpx.Client], sids: list[str]) -> list[dict[str, Any]]:
    """One turn per client, all released at once (a thread each); their results."""
    gate = threading.Barrier(len(sids))
    out: list[dict[str, Any]] = [{} for _ in sids]

    def one(i: int, sid: str) -> None:
        gate.wait()
        try:
            out[i] = _first_event_turn(clients[i], sid)
        except (BenchError, httpx.HTTPError) as exc:
            out[i] = {"error": str(exc)[:300]}

    threads = [threading.Thread(target=one, args=(i, sid)) for i, sid in enumerate(sids)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def _l_bursts(ctx: Context, name: str, flags: list[str]) -> dict[str, Any]:
    """``l_bursts`` bursts of ``l_burst`` concurrent turns, ``l_burst_gap`` s apart."""
    p = ctx.params
    n = p.l_burst
    bursts: list[dict[str, Any]] = []
    pool = flags[-1] != "0"
    extra = ["--max-concurrent-turns", str(4 * n), "--max-sessions", "0"]
    with (
        ctx.server(name, adapter_command("burn", str(p.l_burn_ms), "1"), flags + extra) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as client,
    ):
        clients = [httpx.Client(base_url=srv.url, timeout=60) for _ in range(n)]
        try:
            if pool:
                wait_pool_ready(client)
            time.sleep(0.5)
            for b in range(p.l_bursts):
                if b:
                    time.sleep(p.l_burst_gap)
                sids = [_create(client) for _ in range(n)]
                state = pool_json(client)
                out = _burst(clients, sids)
                errors = [o for o in out if "error" in o or not o]
                if errors:
                    raise BenchError(f"burst {b + 1}: {len(errors)} of {n} turns failed: {errors}")
                first = [o["first_event_s"] for o in out]
                bursts.append(
                    {"pool_before": state, "first_event": latency_summary(first), "turns": out}
                )
            after = pool_json(client)
        finally:
            for c in clients:
                c.close()
    return {"flags": flags + extra, "bursts": bursts, "pool_after": after}


def scenario_l(ctx: Context) -> Result:
    """A start-up that burns CPU (as Node's does): is warm really ready, and does it keep up?"""
    p = ctx.params
    burn = p.l_burn_ms
    res = Result("l", f"CPU-burning slow start ({burn} ms of CPU before stdin)")
    off = ["--in-memory", "--warm-adapters", "0"]
    cold = _l_series(ctx, "l_b2b_off", off, p.l_turns, 0.0)
    warm = [
        _l_series(ctx, f"l_b2b_on{i}", ["--in-memory", *flags], p.l_turns, 0.0)
        for i, flags in enumerate(p.l_pools, start=1)
    ]
    spaced_flags = ["--in-memory", "--warm-adapters", "1"]
    spaced = _l_series(ctx, "l_spaced", spaced_flags, p.l_spaced_turns, p.l_spacing)
    burst_off = _l_bursts(ctx, "l_burst_off", off)
    burst_on = _l_bursts(ctx, "l_burst_on", ["--in-memory", *p.l_burst_pool])
    res.details = {
        "burn_ms": burn,
        "back_to_back_off": cold,
        "back_to_back_on": warm,
        "spaced_on": spaced,
        "burst_off": burst_off,
        "burst_on": burst_on,
    }
    cold_p50 = cold["first_event"]["p50_ms"]
    res.add(f"{p.l_turns} back to back, pool off: first event p50", cold_p50, "ms", "(cold)")
    res.add("  pool off: max", cold["first_event"]["max_ms"], "ms")
    half = round(cold_p50 / 2, 1)
    for series in warm:
        on = series["first_event"]
        flags = " ".join(series["flags"][1:])
        res.add(
            f"{p.l_turns} back to back, {flags}: p50",
            on["p50_ms"],
            "ms",
            f"<= {half:,} (0.5 x cold)",
            on["p50_ms"] <= half,
        )
        res.add("  max", on["max_ms"], "ms", f"<= {cold_p50:,} (cold p50)")
        res.metrics[-1].met = on["max_ms"] <= cold_p50
        fast = sum(1 for t in series["turns"] if t["first_event_s"] < burn / 2000)
        res.add("  turns faster than half the burn", fast, f"of {p.l_turns}")
        load = series["pool_after"]
        res.add("  load time / its CPU (/readyz loadMs, loadCpuMs)", load.get("loadMs") or 0, "ms")
        res.metrics[-1].unit = f"ms / {load.get('loadCpuMs') or 0:,} ms"
        res.add("  pool target after", load["target"], "procs")
    sp = spaced["first_event"]
    res.add(
        f"{p.l_spaced_turns} turns {p.l_spacing:g} s apart, --warm-adapters 1: p50",
        sp["p50_ms"],
        "ms",
        "<= 60",
        sp["p50_ms"] <= 60,
    )
    res.add("  spaced: max", sp["max_ms"], "ms")
    b_off = burst_off["bursts"][0]["first_event"]["p50_ms"]
    b_on = burst_on["bursts"][0]["first_event"]
    limit = round(0.6 * b_off, 1)
    res.add(f"burst of {p.l_burst}, pool off: p50", b_off, "ms", "(cold)")
    res.add(
        f"burst of {p.l_burst}, {' '.join(p.l_burst_pool)}: p50",
        b_on["p50_ms"],
        "ms",
        f"<= {limit:,} (0.6 x cold)",
        b_on["p50_ms"] <= limit,
    )
    res.add("  first burst: max", b_on["max_ms"], "ms")
    for i, burst in enumerate(burst_on["bursts"][1:], start=2):
        res.add(
            f"  burst {i} ({burst['pool_before']['ready']} ready): p50",
            burst["first_event"]["p50_ms"],
            "ms",
        )
    return res


# -- machine, output, main -----------------------------------------------------


def machine_info() -> dict[str, Any]:
    cpu = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions: dict[str, str | None] = {}
    packages = ("trioserve", "trio", "hypercorn", "quart", "quart-trio", "httpx", "h11", "pydantic")
    for pkg in packages:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    git = ["git", "-C", str(BENCH.parent)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "src"], capture_output=True)
    gcc = shutil.which("gcc") or shutil.which("cc")
    cc = subprocess.run([gcc, "--version"], capture_output=True, text=True) if gcc else None
    return {
        "trioserve_commit": head.stdout.strip() + (" (src modified)" if dirty.stdout else ""),
        "gcc": cc.stdout.splitlines()[0] if cc and cc.stdout else None,
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": cpu,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "packages": versions,
    }


def fmt(value: float) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"


def print_table(results: list[Result]) -> None:
    rows = [("scenario", "metric", "value", "unit", "target", "met")]
    for res in results:
        for m in res.metrics:
            met = "" if m.met is None else ("met" if m.met else "NOT MET")
            rows.append((res.scenario, m.name, fmt(m.value), m.unit, m.target, met))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for i, row in enumerate(rows):
        cells = [
            c.rjust(w) if j == 2 else c.ljust(w)
            for j, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        print("  ".join(cells).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))


SCENARIOS: dict[str, Callable[[Context], Result]] = {
    "a": scenario_a,
    "b": scenario_b,
    "c": scenario_c,
    "d": scenario_d,
    "e": scenario_e,
    "f": scenario_f,
    "g": scenario_g,
    "h": scenario_h,
    "i": scenario_i,
    "j": scenario_j,
    "k": scenario_k,
    "l": scenario_l,
    "m": scenario_m,
    "n": scenario_n,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="reduced sizes for a smoke run")
    parser.add_argument("--only", default="", help="comma-separated scenarios (default: all)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write results")
    parser.add_argument(
        "--profile",
        choices=["none", "pyspy", "cprofile"],
        default="none",
        help="profile each server (py-spy attached, or run under cProfile)",
    )
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each scenario, wait up to SECONDS for the machine to be < 25%% busy",
    )
    parser.add_argument(
        "--workers",
        default="1,2",
        metavar="N[,N...]",
        help="scenario m: the --workers values run on PostgreSQL (default: 1,2)",
    )
    parser.add_argument(
        "--profile-dir", type=Path, default=BUILD / "profiles", help="where profiles go"
    )
    args = parser.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()] or list(SCENARIOS)
    unknown = [s for s in only if s not in SCENARIOS]
    if unknown:
        parser.error(
            f"unknown scenario(s): {', '.join(unknown)} (choose from {','.join(SCENARIOS)})"
        )
    args.scenarios = only
    try:
        args.workers = tuple(int(n) for n in args.workers.split(",") if n.strip())
    except ValueError:
        parser.error(f"--workers: a comma-separated list of numbers, not {args.workers!r}")
    if not args.workers or min(args.workers) < 1:
        parser.error("--workers: at least one number, each >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    params = Params.quick() if args.quick else Params()
    params = dataclasses.replace(params, m_workers=args.workers)
    soft, hard = raise_fd_limit()
    build_adapter()
    if args.profile != "none":
        args.profile_dir.mkdir(parents=True, exist_ok=True)
    info = machine_info()
    info["loadavg_at_start"] = os.getloadavg()
    print(
        f"trioserve bench: {info['nproc']} cpu(s), {info['cpu_model']}, "
        f"python {info['python']}, {'quick' if args.quick else 'full'} run, "
        f"RLIMIT_NOFILE {soft}/{hard}, load average {info['loadavg_at_start'][0]:.2f}",
        flush=True,
    )
    results: list[Result] = []
    failures: dict[str, str] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="trioserve-bench-") as tmp:
        ctx = Context(params, Profiler(args.profile, args.profile_dir), Path(tmp))
        for name in args.scenarios:
            busy = wait_for_quiet(0.25, args.wait_quiet) if args.wait_quiet else cpu_busy()
            print(f"[{name}] running (machine {100 * busy:.0f}% busy before) ...", flush=True)
            load_before = os.getloadavg()[0]
            t0 = time.perf_counter()
            try:
                res = SCENARIOS[name](ctx)
            except Exception as exc:  # report it, go on with the other scenarios
                failures[name] = f"{type(exc).__name__}: {exc}"
                print(f"[{name}] FAILED: {failures[name]}", flush=True)
                continue
            res.details["scenario_seconds"] = round(time.perf_counter() - t0, 2)
            res.details["loadavg_1min_before_after"] = [load_before, os.getloadavg()[0]]
            res.details["cpu_busy_before"] = busy
            results.append(res)
            print(f"[{name}] done in {res.details['scenario_seconds']} s", flush=True)
    print()
    print_table(results)
    for name, server in ctx.servers.items():
        if server["exit_code"] != 0 or server["log_errors"]:
            print(f"\nserver {name}: exit {server['exit_code']}; log: {server['log_errors'][:3]}")
    for name, report in ctx.profiler.reports.items():
        print(f"\n== profile of server {name} ({args.profile}) ==\n{report}")
    doc = {
        "machine": info,
        "quick": args.quick,
        "params": params.__dict__,
        "total_seconds": round(time.perf_counter() - started, 1),
        "scenarios": {r.scenario: r.as_dict() for r in results},
        "servers": ctx.servers,
        "failures": failures,
    }
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"\nresults written to {args.json}")
    bad_exits = [n for n, srv in ctx.servers.items() if srv["exit_code"] != 0]
    # Missed targets are results, not errors: only a failed check or server fails the run.
    return 1 if failures or bad_exits else 0


if __name__ == "__main__":
    sys.exit(main())
