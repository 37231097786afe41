"""The protocol faces (MCP, AG-UI, A2A), each imported on its first request.

The faces' SDKs (``mcp``, ``ag-ui-protocol``, ``a2a-sdk`` with protobuf)
build several hundred pydantic models and protobuf descriptors when they
are imported: about half of everything a ``trioserve run`` imports, and so
about half of the CPU a server spends before it serves.  A server whose
clients never speak those protocols should not pay it, and a test suite
that starts hundreds of servers pays it hundreds of times.

So the app routes each face's paths to a stand-in.  The first request to
any of them imports the face's module in a worker thread (the event loop
keeps serving meanwhile), lets the module's ``install`` register its routes
and serving hooks on a ``Recorder`` instead of the app, runs its
``before_serving`` hooks (the app already serves), and from then on every
request to those paths goes to the handler the module registered.  Requests
that arrive during the import wait for it; an import that fails is logged
and answered as the error it is (a 500 names nothing internal), and the
next request tries again.  The face's ``after_serving`` hooks run when the
app stops serving, if the face was ever loaded.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import trio
from quart import Response, request
from quart_trio import QuartTrio

from trioserve.http._streams import StreamSlots
from trioserve.sessions import SessionManager

log = logging.getLogger("trioserve.http")

Handler = Callable[..., Awaitable[Response]]
Hook = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class Needs:
    """What the faces' ``install`` functions are given besides the app."""

    manager: SessionManager
    streams: StreamSlots
    idle: float
    auth: bool


@dataclass(frozen=True)
class Face:
    """A face: its module, the routes it will register, and how to install it.

    ``routes``: each path with its methods, exactly as the module's
    ``install`` registers them (tests/http/test_lazy_faces.py checks that the
    two agree).  ``install``: calls the module's ``install`` with the app
    (a ``Recorder``) and what it needs.
    """

    name: str
    module: str
    routes: tuple[tuple[str, tuple[str, ...]], ...]
    install: Callable[[Any, ModuleType, Needs], object]


FACES: tuple[Face, ...] = (
    Face(
        "mcp",
        "trioserve.http._mcp",
        (("/mcp", ("GET", "POST", "DELETE")),),
        lambda app, face, needs: face.install(app, needs.manager, needs.streams),
    ),
    Face(
        "ag-ui",
        "trioserve.http._agui",
        (("/ag-ui", ("POST",)),),
        lambda app, face, needs: face.install(app, needs.manager, needs.streams, needs.idle),
    ),
    Face(
        "a2a",
        "trioserve.http._a2a",
        (("/.well-known/agent-card.json", ("GET",)), ("/a2a", ("POST",))),
        lambda app, face, needs: face.install(
            app, needs.manager, needs.streams, needs.idle, auth=needs.auth
        ),
    ),
)


class Recorder:
    """What a face's ``install`` sees as its app: it keeps the routes and the hooks.

    It offers the part of Quart's app API the faces use (``route``, ``get``,
    ``post``, ``before_serving``, ``after_serving``, ``nursery``).
    """

    def __init__(self, app: QuartTrio) -> None:
        self._app = app
        self.handlers: dict[tuple[str, str], Handler] = {}
        self.starts: list[Hook] = []
        self.stops: list[Hook] = []

    @property
    def nursery(self) -> trio.Nursery:
        return self._app.nursery

    def route(self, path: str, methods: Sequence[str] = ("GET",)) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            for method in methods:
                self.handlers[(path, method.upper())] = handler
            return handler

        return register

    def get(self, path: str) -> Callable[[Handler], Handler]:
        return self.route(path, ("GET",))

    def post(self, path: str) -> Callable[[Handler], Handler]:
        return self.route(path, ("POST",))

    def before_serving(self, hook: Hook) -> Hook:
        self.starts.append(hook)
        return hook

    def after_serving(self, hook: Hook) -> Hook:
        self.stops.append(hook)
        return hook


class LazyFace:
    """One face on ``app``: its stand-in routes now, its module on the first request."""

    def __init__(self, app: QuartTrio, face: Face, needs: Needs) -> None:
        self.face = face
        self._app = app
        self._needs = needs
        self._lock = trio.Lock()
        self._loaded: Recorder | None = None
        for path, methods in face.routes:
            app.add_url_rule(
                path,
                endpoint=f"{face.name}:{path}",
                view_func=self._stand_in(path),
                methods=list(methods),
            )
        app.after_serving(self._stop)

    async def handlers(self) -> dict[tuple[str, str], Handler]:
        """The face's own handlers, importing and installing it if this is the first call."""
        if self._loaded is None:
            async with self._lock:
                if self._loaded is None:
                    self._loaded = await self._load()
        return self._loaded.handlers

    async def _load(self) -> Recorder:
        began = time.perf_counter()
        module = await trio.to_thread.run_sync(importlib.import_module, self.face.module)
        recorder = Recorder(self._app)
        self.face.install(recorder, module, self._needs)
        for start in recorder.starts:
            await start()
        log.info(
            "%s face loaded in %.2f s (its first request)",
            self.face.name,
            time.perf_counter() - began,
        )
        return recorder

    def _stand_in(self, path: str) -> Handler:
        async def stand_in(**kwargs: Any) -> Response:
            method = "GET" if request.method == "HEAD" else request.method
            handler = (await self.handlers())[(path, method)]
            return await handler(**kwargs)

        return stand_in

    async def _stop(self) -> None:
        if self._loaded is not None:
            for stop in self._loaded.stops:
                await stop()


def install(app: QuartTrio, needs: Needs, names: Sequence[str]) -> None:
    """Route the paths of the faces ``names`` on ``app`` to their ``LazyFace``s."""
    for face in FACES:
        if face.name in names:
            LazyFace(app, face, needs)
