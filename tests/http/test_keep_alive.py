"""Idle connections: nothing lost at the keep-alive deadline, the longest idle evicted at the cap.

The keep-alive race is made deterministic by holding the server's read
loop (``HeldReads``): its first read takes only the first request, its
second waits, so the next request (sent with the first) lies unread in the
socket while the connection's idle deadline passes, or while the server
looks for a connection to evict.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import pytest
import trio

from tests.helpers import Raw, ServerFactory, parse_reply
from trioserve.http._connections import MAX_RECV, Connection
from trioserve.http._idle import Idle, KeepAlive

KEEP_ALIVE = 0.3
GUARD = 30.0  # seconds: a hang guard, never a measurement


class HeldReads:
    """The server's side of a connection: the first read takes exactly ``first`` bytes, the
    second waits for ``hold()`` before it reads (or, ``taken``, after: the bytes are out of
    the socket, not yet returned, as when the read loop waits to be scheduled)."""

    def __init__(
        self,
        receive: Callable[[int], Awaitable[bytes]],
        first: int,
        hold: Callable[[], Awaitable[object]],
        taken: bool = False,
    ) -> None:
        self._receive = receive
        self._first = first
        self._hold = hold
        self._taken = taken
        self.reads = 0

    async def receive_some(self, max_bytes: int = MAX_RECV) -> bytes:
        self.reads += 1
        if self.reads == 1:  # exactly the first request, however it arrives
            data = b""
            while len(data) < self._first:
                data += await self._receive(self._first - len(data))
            return data
        if self.reads == 2 and self._taken:
            data = await self._receive(max_bytes)
            with trio.CancelScope(shield=True):  # like a yield after a recv
                await self._hold()
            return data
        if self.reads == 2:
            await self._hold()
        return await self._receive(max_bytes)


def hold_reads(
    monkeypatch: pytest.MonkeyPatch,
    first: int,
    hold: Callable[[], Awaitable[object]],
    taken: bool = False,
) -> None:
    """Every connection the server accepts from now on reads as ``HeldReads``."""
    original = Connection.__init__

    def init(self: Connection, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        held = HeldReads(self._receive, first, hold, taken)
        self._receive = held.receive_some  # type: ignore[method-assign]

    monkeypatch.setattr(Connection, "__init__", init)


class Replies:
    """Responses to requests sent on ``raw`` by hand (not through ``raw.h11``)."""

    def __init__(self, raw: Raw) -> None:
        self.raw = raw
        self.buffer = b""

    async def next(self, count: int) -> list[int]:
        """The statuses of the next ``count`` responses (bodies with a Content-Length)."""
        statuses: list[int] = []
        with trio.fail_after(GUARD):
            while len(statuses) < count:
                if b"\r\n\r\n" in self.buffer:
                    reply = parse_reply(self.buffer)
                    if len(reply.body) == int(reply.headers["content-length"]):
                        statuses.append(reply.status)
                        self.buffer = reply.rest
                        continue
                chunk = await self.raw.stream.receive_some(65536)
                assert chunk, f"closed after {len(statuses)} response(s) of {count}"
                self.buffer += chunk
        return statuses


def get(url: str, path: str) -> bytes:
    """A ``GET`` request head, as ``Raw.head`` writes it."""
    return f"GET {path} HTTP/1.1\r\nHost: {url.removeprefix('http://')}\r\n\r\n".encode()


async def served(raw: Raw) -> bool:
    return (await raw.request("GET", "/healthz")).status == 200


@pytest.mark.parametrize("taken", [False, True], ids=["in-the-socket", "read-not-handled"])
async def test_a_request_waiting_as_the_keep_alive_runs_out_is_served(
    start_server: ServerFactory, monkeypatch: pytest.MonkeyPatch, taken: bool
) -> None:
    server = await start_server(keep_alive=KEEP_ALIVE)
    first, second = get(server.url, "/healthz"), get(server.url, "/readyz")
    hold_reads(monkeypatch, len(first), partial(trio.sleep, 3 * KEEP_ALIVE), taken)
    raw = await Raw.open(server.url)
    # The second waits, in the server's socket or taken from it by the read loop but not
    # handed to the protocol yet, while the idle deadline passes.
    await raw.send(first + second)
    assert await Replies(raw).next(2) == [200, 200]
    assert await raw.until_eof() == b""  # idle, nothing waiting: closed at the keep-alive


async def test_a_request_that_begins_as_the_timer_fires_is_served(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The connection's deadline passes and wakes the server's timers; before they run, a
    request begins (on a loaded server the protocol's step can come first). They must not
    ask the read loop to close the connection under that request, and they time the next
    idle period."""
    timers = KeepAlive(KEEP_ALIVE)
    sock, peer = trio.socket.socketpair()
    with sock, peer:
        idle = Idle(sock, timers)
        woken: list[bool] = []

        class RequestBegins(trio.abc.Instrument):
            def before_task_step(self, task: trio.lowlevel.Task) -> None:
                due = idle.due <= trio.current_time()
                if task.name.endswith("KeepAlive.run") and due and not woken:
                    woken.append(True)
                    idle.mark(False)  # the request's step came first

        async with trio.open_nursery() as nursery:
            nursery.start_soon(timers.run, trio.sleep_forever)
            trio.lowlevel.add_instrument(RequestBegins())
            await trio.sleep(10 * KEEP_ALIVE)
            assert woken, "the timers were woken by the deadline"
            assert not idle.closing and not idle.receiving.cancel_called, "not closed"
            idle.mark(True)  # the response is over
            await trio.sleep(KEEP_ALIVE / 2)
            assert not idle.closing, "a new period"
            await trio.sleep(KEEP_ALIVE)
            assert idle.closing and idle.receiving.cancel_called, "closed at its end"
            nursery.cancel_scope.cancel()


async def test_the_server_times_its_connections_in_one_task(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Many connections, no task of their own: each idle one is asked to close at its own
    deadline; one that serves a request is not, until it has been idle a whole period;
    one that closed is forgotten; a drain closes the idle ones at once."""
    timers = KeepAlive(KEEP_ALIVE)
    pairs = [trio.socket.socketpair() for _ in range(6)]
    try:
        idle = [Idle(sock, timers) for sock, _ in pairs[:3]]
        async with trio.open_nursery() as nursery:
            drain = trio.Event()
            nursery.start_soon(timers.run, drain.wait)
            await trio.sleep(KEEP_ALIVE / 3)
            later = Idle(pairs[3][0], timers)  # opened a third of a period later
            idle[1].mark(False)  # serving
            idle[2].release()  # closed
            await trio.sleep(KEEP_ALIVE * 0.8)
            assert [i.closing for i in [*idle, later]] == [True, False, False, False]
            await trio.sleep(KEEP_ALIVE / 3)
            assert later.closing and not idle[1].closing
            idle[1].mark(True)  # its response is over: a whole period from now
            await trio.sleep(KEEP_ALIVE * 0.9)
            assert not idle[1].closing
            await trio.sleep(KEEP_ALIVE * 0.2)
            assert idle[1].closing and not idle[2].closing, "the closed one is forgotten"
            fresh = [Idle(sock, timers) for sock, _ in pairs[4:]]
            fresh[1].mark(False)
            drain.set()
            await trio.sleep(KEEP_ALIVE / 10)
            assert [f.closing for f in fresh] == [True, False], "a drain closes the idle at once"
            fresh[1].mark(True)
            await trio.sleep(KEEP_ALIVE / 10)
            assert fresh[1].closing, "and each as its request ends"
            nursery.cancel_scope.cancel()
    finally:
        for sock, peer in pairs:
            sock.close()
            peer.close()


async def test_at_the_cap_the_connection_idle_longest_is_closed_for_a_new_one(
    start_server: ServerFactory,
) -> None:
    server = await start_server(max_connections=20, keep_alive=60)
    idle = [await Raw.open(server.url) for _ in range(20)]
    for raw in idle:  # one after the other: the first is idle longest
        assert await served(raw)
    newcomer = await Raw.open(server.url)
    assert await served(newcomer)
    assert await idle[0].until_eof() == b""
    for raw in idle[1:]:  # the others were not disturbed
        assert await served(raw)
    # The next one closes the connection idle longest now: the first newcomer.
    assert await served(await Raw.open(server.url))
    assert await newcomer.until_eof() == b""


async def test_a_connection_with_a_request_waiting_is_not_evicted(
    start_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = await start_server(max_connections=3, keep_alive=60)
    release = trio.Event()
    first, second = get(server.url, "/healthz"), get(server.url, "/readyz")
    hold_reads(monkeypatch, len(first), release.wait)
    waiting = await Raw.open(server.url)
    await waiting.send(first + second)  # the second waits unread in the server's socket
    replies = Replies(waiting)
    assert await replies.next(1) == [200]
    others = [await Raw.open(server.url) for _ in range(2)]
    for raw in others:
        assert await served(raw)
    assert await served(await Raw.open(server.url))
    assert await others[0].until_eof() == b""  # idle longest but one, with nothing waiting
    release.set()
    assert await replies.next(1) == [200]


async def test_at_the_cap_with_none_idle_a_new_connection_gets_503(
    start_server: ServerFactory,
) -> None:
    server = await start_server(max_connections=3, keep_alive=60)
    busy = [await Raw.open(server.url) for _ in range(3)]
    session = json.loads((await busy[0].request("POST", "/v1/sessions", b"{}")).body)["id"]
    follow = f"/v1/sessions/{session}/events?follow=true"
    for raw in busy:  # each holds a request in progress
        assert (await raw.open_stream("GET", follow)).status == 200
    assert (await (await Raw.open(server.url)).request("GET", "/healthz")).status == 503


async def test_an_address_at_its_own_cap_evicts_nothing(start_server: ServerFactory) -> None:
    server = await start_server(max_connections=3, max_connections_per_ip=2, keep_alive=60)
    mine = [await Raw.open(server.url, source="127.0.0.2") for _ in range(2)]
    other = await Raw.open(server.url, source="127.0.0.3")
    for raw in [*mine, other]:
        assert await served(raw)
    # Full, and this address has its two: refused, and nobody's connection is closed.
    refused = await Raw.open(server.url, source="127.0.0.2")
    assert (await refused.request("GET", "/healthz")).status == 503
    for raw in [*mine, other]:
        assert await served(raw)
    # Another address is served: the connection idle longest makes room.
    assert await served(await Raw.open(server.url, source="127.0.0.4"))
    assert await mine[0].until_eof() == b""
