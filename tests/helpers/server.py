"""A real server started in the test's Trio run, on 127.0.0.1:0, driven over real sockets."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.helpers.scripted import ScriptedLauncher
from tests.helpers.specs import FAKE_ADAPTER, compiled_spec
from tests.helpers.sse import Frame, parse_sse
from trioserve.config import ServerConfig
from trioserve.http._auth import KeyRing
from trioserve.runtime._pool import WarmPool
from trioserve.server import Running, Stop, serve
from trioserve.sessions._limits import Limits
from trioserve.sessions._manager import SessionManager
from trioserve.spec._compiler import CompiledSpec


@dataclass
class Server:
    """A running server and an HTTP client pointed at it."""

    url: str
    running: Running
    stop: Stop
    client: httpx.AsyncClient
    done: trio.Event = field(default_factory=trio.Event)

    @property
    def manager(self) -> SessionManager:
        return self.running.manager

    @property
    def pool(self) -> WarmPool:
        """The warm pool (a test of it starts the server with ``warm_adapters=N``)."""
        pool = self.manager.pool
        assert pool is not None, "the server runs without a warm pool"
        return pool

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


class ServerFactory:
    """Starts servers (``await start_server(...)``) in ``nursery``; ``aclose`` drains
    and stops them all.

    Keywords set the ``ServerConfig``; the rest (``**limits``) replace fields of
    ``Limits``.  The defaults differ from ``trioserve run``'s where tests want
    them to: a 2 s adapter stop grace and no warm pool (``warm_adapters=0``; a
    test of the pool asks for one).

    Adapters: with ``processes=False`` (the default) the server's turns are
    played in-process by a ``ScriptedLauncher`` (``helpers.scripted``): real
    sockets, real server, only the adapter process replaced.  A test of
    processes (pids, signals, the pool, the reaper, stderr of a real program)
    passes ``processes=True``; a warm pool or a command other than the fake
    adapter's implies it.
    """

    def __init__(self, nursery: trio.Nursery, tmp_path: Path) -> None:
        self._nursery = nursery
        self._tmp_path = tmp_path
        self._started: list[Server] = []

    async def __call__(
        self,
        *,
        spec: dict[str, Any] | None = None,
        command: list[str] | None = None,
        store: str = "memory",
        shutdown_grace: float = 5.0,
        heartbeat: float = 15.0,
        keep_alive: float = 5.0,
        write_timeout: float = 30.0,
        max_connections: int | None = None,
        max_connections_per_ip: int = 64,
        max_streams_per_tenant: int | None = None,
        keys: KeyRing | None = None,
        allowed_hosts: tuple[str, ...] = (),
        cors_origins: tuple[str, ...] = (),
        metrics_bind: tuple[str, int] | None = None,
        console: bool = True,
        mcp: bool = True,
        ag_ui: bool = True,
        a2a: bool = True,
        processes: bool = False,
        **limits: Any,
    ) -> Server:
        command = command or FAKE_ADAPTER
        if limits.get("warm_adapters", 0) > 0 or command[: len(FAKE_ADAPTER)] != FAKE_ADAPTER:
            processes = True
        launcher = None if processes else ScriptedLauncher()
        config = ServerConfig(
            port=0,
            store=store,
            shutdown_grace=shutdown_grace,
            heartbeat=heartbeat,
            keep_alive=keep_alive,
            write_timeout=write_timeout,
            max_connections=max_connections,
            max_connections_per_ip=max_connections_per_ip,
            max_streams_per_tenant=max_streams_per_tenant,
            limits=replace(Limits(adapter_stop_grace=2.0, warm_adapters=0), **limits),
            keys=keys,
            allowed_hosts=allowed_hosts,
            cors_origins=cors_origins,
            metrics_bind=metrics_bind,
            console=console,
            mcp=mcp,
            ag_ui=ag_ui,
            a2a=a2a,
        )
        stop = Stop.new()
        done = trio.Event()

        async def run(task_status: trio.TaskStatus[Running]) -> None:
            try:
                await serve(
                    config,
                    CompiledSpec.from_json_dict(spec or compiled_spec()),
                    command,
                    stop=stop,
                    task_status=task_status,
                    announce=None,
                    launcher=launcher,
                )
            finally:
                done.set()

        running: Running = await self._nursery.start(run)
        client = httpx.AsyncClient(base_url=running.url, timeout=30)
        server = Server(running.url, running, stop, client, done)
        self._started.append(server)
        return server

    async def aclose(self) -> None:
        """Drain and stop every server started, each within 30 s."""
        for server in self._started:
            await server.client.aclose()
            server.stop.drain.set()
            with trio.fail_after(30):
                await server.done.wait()
