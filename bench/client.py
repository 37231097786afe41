"""The clients the scenarios drive a server with, and the checks of what comes back.

- ``RawConn``: one keep-alive HTTP/1.1 connection over trio sockets, for scenarios
  that need concurrency at the least client CPU (a 2-core machine shares its cores
  between the client and the server).
- ``BlockingConn``: the same over a blocking socket, one request at a time (floor).
- Both read responses with ``ResponseReader``, sans-IO: Content-Length and chunked
  bodies only, which is all trioserve sends.
- The ``httpx.Client`` helpers: a session, a streamed turn timed to its first and
  last event, the warm pool's state from ``/readyz``.
"""

from __future__ import annotations

import json
import socket
import time
from collections import Counter
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import trio

from bench import BenchError

JSON_HEADERS = {"Content-Type": "application/json"}

T = TypeVar("T")
#: A read in progress: it yields when it needs more bytes, and returns what it read.
Reading = Generator[None, None, T]
Head = tuple[int, dict[str, str]]


def request_bytes(method: str, path: str, host: str, body: bytes = b"") -> bytes:
    """A request's bytes; a body (or a POST) is sent as JSON with its length."""
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n"
    if body or method == "POST":
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


@dataclass
class ResponseReader:
    """HTTP/1.1 responses from the bytes ``feed`` gives it (sans-IO).

    Each reading method is a generator (``Reading``): it yields when the buffer holds
    too little, and the caller feeds more bytes and resumes it.  ``chunks`` is the
    chunked body read so far.
    """

    buf: bytearray = field(default_factory=bytearray)
    chunks: list[bytes] = field(default_factory=list)

    def feed(self, data: bytes) -> None:
        if not data:
            raise BenchError("server closed the connection")
        self.buf += data

    def head(self) -> Reading[Head]:
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            yield
        lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        del self.buf[: end + 4]
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        return status, headers

    def body(self, headers: dict[str, str]) -> Reading[bytes]:
        self.chunks = []
        if "content-length" in headers:
            size = int(headers["content-length"])
            while len(self.buf) < size:
                yield
            body = bytes(self.buf[:size])
            del self.buf[:size]
            return body
        if headers.get("transfer-encoding", "").lower() != "chunked":
            raise BenchError(f"unsupported response framing: {headers}")
        while True:
            while (eol := self.buf.find(b"\r\n")) < 0:
                yield
            size = int(bytes(self.buf[:eol]).split(b";")[0], 16)
            need = eol + 2 + size + 2
            while len(self.buf) < need:
                yield
            self.chunks.append(bytes(self.buf[eol + 2 : eol + 2 + size]))
            del self.buf[:need]
            if size == 0:
                return b"".join(self.chunks)

    def until(self, needle: bytes) -> Reading[bytes]:
        """Until ``needle`` has arrived: the raw bytes so far (framing included)."""
        while needle not in self.buf:
            yield
        return bytes(self.buf)


def resume(reading: Reading[T]) -> list[T]:
    """Run ``reading`` on what is buffered: ``[what it read]``, or ``[]`` if it needs more."""
    try:
        next(reading)
    except StopIteration as done:
        return [done.value]
    return []


class RawConn:
    """One keep-alive HTTP/1.1 connection over trio sockets."""

    def __init__(self, stream: trio.SocketStream, host: str) -> None:
        self._stream = stream
        self._host = host
        self._reader = ResponseReader()

    @classmethod
    async def open(cls, url: str) -> RawConn:
        parts = urlsplit(url)
        assert parts.hostname is not None and parts.port is not None
        stream = await trio.open_tcp_stream(parts.hostname, parts.port)
        return cls(stream, parts.netloc)

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def _read(self, reading: Reading[T]) -> T:
        while not (done := resume(reading)):
            self._reader.feed(await self._stream.receive_some(1 << 18))
        return done[0]

    async def send_request(self, method: str, path: str, body: bytes = b"") -> None:
        await self._stream.send_all(request_bytes(method, path, self._host, body))

    async def read_head(self) -> Head:
        return await self._read(self._reader.head())

    async def read_body(self, headers: dict[str, str]) -> bytes:
        return await self._read(self._reader.body(headers))

    async def read_until(self, needle: bytes) -> bytes:
        return await self._read(self._reader.until(needle))

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


class BlockingConn:
    """One keep-alive HTTP/1.1 connection over a blocking socket, one request at a time."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        assert parts.hostname is not None and parts.port is not None
        self._host = parts.netloc
        self._address = (parts.hostname, parts.port)
        self._sock = self._connect()
        self._reader = ResponseReader()

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self._address)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def close(self) -> None:
        self._sock.close()

    def _read(self, reading: Reading[T], first: list[float] | None = None) -> T:
        """Run ``reading``; ``first`` gets the time the body's first SSE frame (ending in a
        blank line) had been read, if it is given empty."""
        while not (done := resume(reading)):
            self._first_frame(first)
            self._reader.feed(self._sock.recv(65536))
        self._first_frame(first)
        return done[0]

    def _first_frame(self, first: list[float] | None) -> None:
        if first == [] and b"\n\n" in b"".join(self._reader.chunks):
            first.append(time.perf_counter())

    def request(
        self, method: str, path: str, body: bytes = b"", first: list[float] | None = None
    ) -> tuple[int, bytes]:
        """Send one request, read its whole response (see ``_read`` for ``first``)."""
        self._sock.sendall(request_bytes(method, path, self._host, body))
        status, headers = self._read(self._reader.head())
        body = self._read(self._reader.body(headers), first)
        if headers.get("connection", "").lower() == "close":
            # hypercorn closes a connection after keep_alive_max_requests (1,000)
            self._sock.close()
            self._sock, self._reader = self._connect(), ResponseReader()
        return status, body


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


def started_data(body: bytes) -> dict[str, Any]:
    """``data`` of the first frame (``session.started``; the slow adapter's pid, idleMs)."""
    head, sep, rest = body.partition(b"\ndata: ")
    if head != b"event: session.started" or not sep:
        raise BenchError(f"first frame is not session.started: {body[:200]!r}")
    data: dict[str, Any] = json.loads(rest.split(b"\n", 1)[0])["data"]
    return data


# -- over an httpx.Client ------------------------------------------------------


def create(client: httpx.Client) -> str:
    """A new session's id."""
    r = client.post("/v1/sessions", content=b"{}", headers=JSON_HEADERS)
    if r.status_code != 201:
        raise BenchError(f"create: HTTP {r.status_code} {r.text[:200]}")
    sid: str = r.json()["id"]
    return sid


@dataclass
class TurnTiming:
    """One streamed turn, timed from sending its request (seconds)."""

    first_event: float  # its first frame (session.started) has arrived whole
    ended: float  # its session.ended frame has arrived whole
    seconds: float  # the whole response has been read
    body: bytes


def stream_turn(client: httpx.Client, sid: str) -> TurnTiming:
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


def first_event_turn(client: httpx.Client, sid: str) -> dict[str, Any]:
    """One turn (``stream_turn``): seconds to its first event and to its end, its
    adapter's pid and idleMs."""
    timing = stream_turn(client, sid)
    started = started_data(timing.body)
    return {
        "first_event_s": round(timing.first_event, 4),
        "seconds": round(timing.seconds, 4),
        "pid": started.get("pid"),
        "adapter_idle_ms": started.get("idleMs"),
    }


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
