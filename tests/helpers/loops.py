"""One client test, three ways: ``Client`` under Trio, ``Client`` under asyncio, ``SyncClient``.

A test written once as ``async def scenario(client: Client) -> T`` runs with
``run_on(loop, url, scenario)``:

- ``"trio"``: ``trio.run``, a ``Client``;
- ``"asyncio"``: ``asyncio.run``, a ``Client``;
- ``"blocking"``: a ``SyncClient`` behind ``Client``'s interface
  (``Blocking``): each method is the ``SyncClient``'s, called as it is,
  blocking; turn and log blocks are its ``with`` blocks, their events its
  iterators.  The scenario's coroutine runs under ``asyncio.run``, so the
  blocking calls are made from inside a running event loop, as code in a
  Jupyter cell makes them.

The server runs elsewhere (``TrioHost``, or a subprocess): nothing of it
is in the loop under test.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Literal, TypeVar, cast

import trio

from trioserve.client import Client, SyncClient

T = TypeVar("T")
Loop = Literal["trio", "asyncio", "blocking"]
LOOPS: list[Loop] = ["trio", "asyncio", "blocking"]
#: The loops whose cancel scopes can interrupt a call (the blocking client has Ctrl-C).
ASYNC_LOOPS: list[Loop] = ["trio", "asyncio"]


def run_on(
    loop: Loop, url: str, scenario: Callable[[Client], Awaitable[T]], **client_args: Any
) -> T:
    """Run ``scenario`` with a client of ``url`` on ``loop``; its result."""

    async def main() -> T:
        if loop == "blocking":
            with SyncClient(url, **client_args) as sync:
                return await scenario(cast(Client, Blocking(sync)))
        async with Client(url, **client_args) as client:
            return await scenario(client)

    if loop == "trio":
        return trio.run(main)
    return asyncio.run(main())


class Blocking:
    """A ``SyncClient`` with ``Client``'s interface, for scenarios written once."""

    def __init__(self, sync: SyncClient) -> None:
        self._sync = sync

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._sync, name)
        if name in ("turn", "events"):
            return lambda *args, **kwargs: _AsyncBlock(method(*args, **kwargs))
        if name == "iter_sessions":
            return lambda *args, **kwargs: _aiter(method(*args, **kwargs))
        if not callable(method) or name == "websocket_url":
            return method

        async def call(*args: Any, **kwargs: Any) -> Any:
            return method(*args, **kwargs)

        return call


async def _aiter(items: Iterator[Any]) -> AsyncIterator[Any]:
    for item in items:
        yield item


class _AsyncBlock:
    def __init__(self, block: AbstractContextManager[Any]) -> None:
        self._block = block

    async def __aenter__(self) -> _AsyncStream:
        return _AsyncStream(self._block.__enter__())

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        return self._block.__exit__(*exc_info)


class _AsyncStream:
    """A sync stream read with ``async for``; its attributes are the stream's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def __aiter__(self) -> _AsyncStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return next(self._stream)
        except StopIteration:
            raise StopAsyncIteration from None
