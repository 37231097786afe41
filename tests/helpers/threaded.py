"""Real servers on a Trio run of their own, in a thread, for clients on any other loop.

``TrioHost`` starts a thread running ``trio.run``; servers (``ServerFactory``,
the same as the in-loop ``start_server`` fixture: real sockets on
127.0.0.1, scripted adapters) and proxies start there.  A test then drives
them from the main thread with ``trio.run``, ``asyncio.run`` or plain
blocking code.  Closing the host drains and stops every server, then ends
the thread.

``run`` is a blocking call into the host's loop: call it from outside any
Trio run (setup, checks), or from a loop through a worker thread
(``anyio.to_thread.run_sync``).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Self, TypeVar

import trio

from tests.helpers.proxy import CuttingProxy
from tests.helpers.server import Server, ServerFactory

T = TypeVar("T")


class TrioHost:
    """A Trio run in a thread hosting servers (see the module doc)."""

    def __init__(self, tmp_path: Path) -> None:
        self._tmp_path = tmp_path
        self._ready: queue.Queue[trio.lowlevel.TrioToken | BaseException] = queue.Queue()
        self._thread = threading.Thread(target=self._main, name="trio-host", daemon=True)
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._nursery: trio.Nursery | None = None
        self._factory: ServerFactory | None = None

    def __enter__(self) -> Self:
        self._thread.start()
        started = self._ready.get(timeout=30)
        if isinstance(started, BaseException):
            raise started
        self._token = started
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._stop is not None
        self.run_sync(self._stop.set)
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "the host's servers did not stop"

    def _main(self) -> None:
        async def main() -> None:
            self._stop = trio.Event()
            try:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    self._factory = ServerFactory(nursery, self._tmp_path)
                    self._ready.put(trio.lowlevel.current_trio_token())
                    await self._stop.wait()
                    await self._factory.aclose()
                    nursery.cancel_scope.cancel()
            except BaseException as exc:
                self._ready.put(exc)
                raise

        trio.run(main)

    def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await fn(*args)`` in the host's loop; its result (blocking)."""
        return trio.from_thread.run(fn, *args, trio_token=self._token)

    def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def server(self, **config: Any) -> Server:
        """A new server (``ServerFactory``'s keywords), running until the host closes."""
        assert self._factory is not None
        factory = self._factory

        async def start() -> Server:
            return await factory(**config)

        return self.run(start)

    def start(self, fn: Callable[[trio.Nursery], Awaitable[T]]) -> T:
        """``await fn(nursery)`` in the host's loop: something that runs until the host closes."""
        assert self._nursery is not None
        return self.run(fn, self._nursery)

    def proxy(self, port: int, cut_after: int = 0, *, after_head: bool = False) -> CuttingProxy:
        """A ``CuttingProxy`` to ``port`` on 127.0.0.1, running until the host closes."""
        proxy = CuttingProxy(port, cut_after, after_head=after_head)
        self.start(proxy.run)
        return proxy
