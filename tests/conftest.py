"""Shared fixtures: a real server on 127.0.0.1:0 driven over real sockets."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import h11
import httpx
import pytest
import trio

from trioserve.config import ServerConfig
from trioserve.http._auth import KeyRing
from trioserve.server import Running, Stop, serve
from trioserve.sessions._limits import Limits
from trioserve.spec._compiler import CompiledSpec

TESTS = Path(__file__).parent
FAKE_ADAPTER = [sys.executable, str(TESTS / "fakeadapter.py")]


#: The smallest valid ADL Agent document, for tests that change one field of it.
MINIMAL_AGENT: dict[str, Any] = {
    "apiVersion": "agent-controller.dev/v1alpha1",
    "kind": "Agent",
    "metadata": {"name": "t"},
    "spec": {
        "model": {"provider": "anthropic", "name": "claude-sonnet-4-20250514"},
        "task": "Go.",
        "tools": [],
        "runtime": {"type": "local"},
    },
}


def compiled_spec(task: str = "Say hello.", runtime: str = "exec") -> dict[str, Any]:
    """A CompiledSpec's wire form (as ``to_json_dict`` gives it), for a tiny test agent."""
    command = {"command": FAKE_ADAPTER} if runtime == "exec" else {}
    return {
        "v": 1,
        "metadata": {"name": "test-agent"},
        "model": {"provider": "anthropic", "name": "claude-sonnet-4-20250514"},
        "task": task,
        "tools": [],
        "extensions": [],
        "skills": [],
        "runtime": {"type": runtime, **command},
    }


def typed_spec(task: str = "Say hello.", runtime: str = "exec") -> CompiledSpec:
    """:func:`compiled_spec` as the typed CompiledSpec the server and manager take."""
    return CompiledSpec.from_json_dict(compiled_spec(task, runtime))


def script(*steps: dict[str, Any]) -> str:
    """A turn input that makes the fake adapter run ``steps``."""
    return "script:" + json.dumps(list(steps))


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def fake_adapters() -> set[int]:
    """The fake adapters this test process runs, alive (servers run in-process)."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read()
        except OSError:
            continue
        if int(ppid) == os.getpid() and state != "Z" and b"fakeadapter.py" in command:
            found.add(int(entry))
    return found


async def wait_gone(pid: int, within: float) -> None:
    """Wait until ``pid`` has exited and been reaped; fail after ``within`` seconds."""
    with trio.fail_after(within):
        while pid_alive(pid):
            await trio.sleep(0.01)


@dataclass
class Frame:
    event: str
    data: dict[str, Any]
    id: str | None = None

    @property
    def seq(self) -> int:
        assert self.id is not None, self
        return int(self.id)


def parse_sse(text: str) -> list[Frame]:
    frames = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if line.startswith(":"):
                continue
            name, _, value = line.partition(": ")
            fields[name] = value
        if "data" not in fields:
            continue  # a comment-only block (a heartbeat)
        frame = Frame(fields.get("event", "message"), json.loads(fields["data"]), fields.get("id"))
        frames.append(frame)
    return frames


@dataclass
class Server:
    """A running server and an HTTP client pointed at it."""

    url: str
    running: Running
    stop: Stop
    client: httpx.AsyncClient
    done: trio.Event = field(default_factory=trio.Event)

    @property
    def manager(self) -> Any:
        return self.running.manager

    async def create(self, body: Any = None) -> dict[str, Any]:
        resp = await self.client.post("/v1/sessions", json=body)
        assert resp.status_code == 201, resp.text
        return dict(resp.json())

    async def turn(self, session_id: str, text: str = "") -> list[Frame]:
        resp = await self.client.post(
            f"/v1/sessions/{session_id}/turns", json={"input": text}, timeout=120
        )
        assert resp.status_code == 200, resp.text
        assert resp.headers["content-type"] == "text/event-stream"
        return parse_sse(resp.text)


async def read_frames(resp: httpx.Response) -> AsyncIterator[Frame]:
    """The SSE frames of a streaming response as they arrive (comments skipped)."""
    buffer = ""
    async for chunk in resp.aiter_text():
        buffer += chunk
        *blocks, buffer = buffer.split("\n\n")
        for block in blocks:
            yield _frame_of(block)


def _frame_of(block: str) -> Frame:
    frames = parse_sse(block + "\n\n")
    return frames[0] if frames else Frame("comment", {})


ServerFactory = Callable[..., Coroutine[Any, Any, Server]]


@pytest.fixture
async def start_server(
    nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[ServerFactory]:
    """Start real servers; each is drained and stopped at the end of the test."""
    started: list[Server] = []
    monkeypatch.setenv("TRIOSERVE_ECHO_STATE_DIR", str(tmp_path / "echo-state"))

    async def start(
        *,
        spec: dict[str, Any] | None = None,
        command: list[str] | None = None,
        store: str = "memory",
        shutdown_grace: float = 5.0,
        heartbeat: float = 15.0,
        keep_alive: float = 5.0,
        write_timeout: float = 30.0,
        max_connections: int | None = None,
        keys: KeyRing | None = None,
        allowed_hosts: tuple[str, ...] = (),
        cors_origins: tuple[str, ...] = (),
        metrics_bind: tuple[str, int] | None = None,
        **limits: Any,
    ) -> Server:
        config = ServerConfig(
            port=0,
            store=store,
            shutdown_grace=shutdown_grace,
            heartbeat=heartbeat,
            keep_alive=keep_alive,
            write_timeout=write_timeout,
            max_connections=max_connections,
            limits=replace(Limits(adapter_stop_grace=2.0), **limits),
            keys=keys,
            allowed_hosts=allowed_hosts,
            cors_origins=cors_origins,
            metrics_bind=metrics_bind,
        )
        stop = Stop.new()
        done = trio.Event()

        async def run(task_status: trio.TaskStatus[Running]) -> None:
            try:
                await serve(
                    config,
                    CompiledSpec.from_json_dict(spec or compiled_spec()),
                    command or FAKE_ADAPTER,
                    stop=stop,
                    task_status=task_status,
                    announce=None,
                )
            finally:
                done.set()

        running: Running = await nursery.start(run)
        client = httpx.AsyncClient(base_url=running.url, timeout=30)
        server = Server(running.url, running, stop, client, done)
        started.append(server)
        return server

    yield start
    for server in started:
        await server.client.aclose()
        server.stop.drain.set()
        with trio.fail_after(30):
            await server.done.wait()


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]  # names lower-case; a repeated header's values joined by ", "
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def raw_request(
    url: str, method: str, target: str, headers: list[tuple[str, str]], body: bytes = b""
) -> RawResponse:
    """One HTTP/1.1 request written byte for byte (``headers`` exactly as given, Host
    included) on a fresh connection, and the response as it came.

    For what httpx would fix up or hide: a forged ``Host``, a WebSocket
    handshake refused before it is accepted.
    """
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    conn = h11.Connection(h11.CLIENT)
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream(parts.hostname, parts.port)
        async with stream:
            if body:
                headers = [*headers, ("Content-Length", str(len(body)))]
            data = conn.send(h11.Request(method=method, target=target, headers=headers))
            if body:
                data += conn.send(h11.Data(data=body))
            data += conn.send(h11.EndOfMessage())
            await stream.send_all(data)
            response: h11.Response | h11.InformationalResponse | None = None
            chunks = []
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await stream.receive_some(65536))
                elif isinstance(event, h11.Response | h11.InformationalResponse):
                    response = event
                elif isinstance(event, h11.Data):
                    chunks.append(bytes(event.data))
                elif event is h11.PAUSED or isinstance(
                    event, h11.EndOfMessage | h11.ConnectionClosed
                ):
                    break  # PAUSED: a 101, the connection now speaks another protocol
    assert response is not None
    found: dict[str, str] = {}
    for name, value in response.headers:
        key = name.decode().lower()
        found[key] = f"{found[key]}, {value.decode()}" if key in found else value.decode()
    return RawResponse(response.status_code, found, b"".join(chunks))
