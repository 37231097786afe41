"""The client on every loop: each test runs under Trio, asyncio and as the blocking client.

The scenarios are written once (``tests.helpers.loops``) and run against
real servers on 127.0.0.1 hosted by a Trio run in a thread of their own
(``TrioHost``), shared by the module's tests.  The protocol's details
(every refusal, the SSE parser, reconnection policy) are tested once, on
Trio, in ``test_client.py``: the code under them is the same for every
loop (``trioserve.client.calls`` and friends).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import anyio
import pytest
import trio

from tests.helpers import script
from tests.helpers.loops import ASYNC_LOOPS, LOOPS, Loop, run_on
from tests.helpers.responder import Responder, answer
from tests.helpers.server import Server
from tests.helpers.threaded import TrioHost
from trioserve.client import (
    Client,
    Event,
    RateLimitedError,
    Retry,
    ServerError,
    SessionBusyError,
    SyncClient,
    Transport,
    TransportError,
    Turn,
)
from trioserve.client.http import POOL_EXPIRY
from trioserve.config import ServerConfig
from trioserve.protocol import IDEMPOTENCY_KEY_HEADER

TRANSPORTS: list[Transport] = ["sse", "websocket"]
HANG = script(
    {"event": "message", "data": {"role": "assistant", "text": "working"}}, {"hang": True}
)
TICKS = 200
TICKING = script({"tick": TICKS, "every": 0.002}, {"end": "completed"})


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrioHost]:
    with TrioHost(tmp_path_factory.mktemp("host")) as running:
        yield running


@pytest.fixture(scope="module")
def server(host: TrioHost) -> Server:
    """A server shared by the module's tests (each makes its own sessions)."""
    return host.server()


@pytest.fixture(scope="module")
def capped(host: TrioHost) -> Server:
    """A server that runs one turn at a time (``--max-concurrent-turns 1``)."""
    return host.server(max_concurrent_turns=1)


async def finished(client: Client, session_id: str, turn_id: str) -> Turn:
    """The turn's record once it is over."""
    while (record := await client.get_turn(session_id, turn_id)).running:
        await anyio.sleep(0.02)
    return record


def assert_contiguous(events: list[Event], first: int) -> None:
    assert [e.seq for e in events] == list(range(first, first + len(events)))


@pytest.mark.parametrize("loop", LOOPS)
def test_every_call(loop: Loop, server: Server) -> None:
    async def tour(client: Client) -> None:
        assert await client.health() and await client.ready()
        await client.create_session()
        session = await client.create_session({"unused": "x"})
        assert await client.get_session(session.id) == session
        assert session.id in {s.id for s in await client.list_sessions()}
        page = await client.sessions_page(limit=1)
        assert len(page.sessions) == 1 and page.next_page is not None
        assert session.id in [s.id async for s in client.iter_sessions(page_size=2)]
        turn_ids = []
        for transport in TRANSPORTS:
            async with client.turn(session.id, "hi", transport=transport) as events:
                got = [event async for event in events]
            assert [e.type for e in got] == ["session.started", "message", "session.ended"]
            assert got[1].data["text"] == "echo: hi" and events.finished
            turn_ids.append(events.turn_id)
        assert (events.status, events.reason) == ("completed", "completed")  # over WebSocket
        record = await client.detach(session.id, TICKING)
        with pytest.raises(SessionBusyError):
            await client.detach(session.id, "again")
        for transport in TRANSPORTS:
            async with client.events(session.id, turn=record.id, transport=transport) as log:
                got = [event async for event in log]
            assert_contiguous(got, 7)
            assert [e.data["i"] for e in got[1:-1]] == list(range(TICKS))
        done = await finished(client, session.id, record.id)
        assert (done.status, done.last_seq) == ("completed", got[-1].seq)
        assert [t.id for t in await client.list_turns(session.id)] == [*turn_ids, record.id]
        exported = await client.export(session.id, after=6)
        assert [e.json for e in exported] == [e.json for e in got]
        await client.detach(session.id, HANG)
        await client.cancel(session.id)
        hung = (await client.list_turns(session.id))[-1]
        assert (await finished(client, session.id, hung.id)).status == "cancelled"
        await client.end_session(session.id)
        assert (await client.get_session(session.id)).terminal
        assert client.websocket_url(session.id).startswith("ws://127.0.0.1:")

    run_on(loop, server.url, tour)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("loop", LOOPS)
def test_a_cut_stream_reopens_without_a_gap(
    loop: Loop, transport: Transport, server: Server, host: TrioHost
) -> None:
    """Over SSE a follow stream, over WebSocket a resume: cut mid-stream, re-opened after it."""
    proxy = host.proxy(int(server.url.rsplit(":", 1)[1]), cut_after=8_000)

    async def follow(client: Client) -> tuple[list[Event], int]:
        sid = (await client.create_session()).id
        await client.detach(sid, TICKING)
        got: list[Event] = []
        follow = transport == "sse"
        async with client.events(sid, follow=follow, transport=transport) as stream:
            async for event in stream:
                got.append(event)
                if event.is_end and follow:
                    await client.end_session(sid)  # the follow stream ends with the session
        return got, stream.reconnects

    got, reconnects = run_on(loop, proxy.url, follow)
    assert proxy.cuts == 1 and reconnects == 1
    assert_contiguous(got, 1)
    # The second connection resumed after the last seq delivered.
    resumed = [r.decode(errors="replace").lower() for r in proxy.requests if b"/events" in r]
    if transport == "sse":
        cursor = int(resumed[-1].split("last-event-id: ")[1].split("\r\n")[0])
        assert 1 < cursor < len(got) and f"after={cursor}" in resumed[-1]
    else:
        assert sum(b"upgrade: websocket" in r.lower() for r in proxy.requests) == 2
    assert [e.data["i"] for e in got[1:-1]] == list(range(TICKS))
    assert got[-1].end_reason == "completed"


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("loop", ASYNC_LOOPS)
def test_leaving_a_turn_by_cancellation_cancels_it(
    loop: Loop, transport: Transport, server: Server
) -> None:
    """The loop's own cancellation (a Trio cancel scope, asyncio's ``Task.cancel``)."""

    async def cancelled(client: Client) -> Turn:
        sid = (await client.create_session()).id
        seen = anyio.Event()

        async def read() -> None:
            async with client.turn(sid, HANG, transport=transport) as events:
                async for event in events:
                    if event.type == "message":
                        seen.set()
                        await anyio.sleep_forever()

        if loop == "trio":
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                await seen.wait()
                nursery.cancel_scope.cancel()
        else:
            task = asyncio.create_task(read())
            await seen.wait()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return await finished(client, sid, (await client.list_turns(sid))[-1].id)

    record = run_on(loop, server.url, cancelled)
    assert (record.status, record.reason) == ("cancelled", "client_disconnected")


@pytest.mark.parametrize("loop", LOOPS)
def test_rate_limited_with_retry_after(loop: Loop, capped: Server) -> None:
    async def limited(client: Client) -> None:
        busy, other = (await client.create_session()).id, (await client.create_session()).id
        await client.detach(busy, HANG)
        try:
            with pytest.raises(RateLimitedError) as refused:
                async with client.turn(other, "x"):
                    pytest.fail("entered")
            assert (refused.value.code, refused.value.reason) == (429, "turn_cap")
            assert refused.value.retry_after == 1
            with pytest.raises(RateLimitedError) as over_ws:
                async with client.turn(other, "x", transport="websocket"):
                    pytest.fail("entered")
            assert over_ws.value.retry_after is None  # WebSocket refusals have no header
        finally:
            await client.cancel(busy)
            await finished(client, busy, (await client.list_turns(busy))[-1].id)

    run_on(loop, capped.url, limited)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_lost_request_is_sent_again_with_its_key(loop: Loop, host: TrioHost) -> None:
    """Closed before an answer, then a proxy's 502: the same key each time, then the answer."""
    session = {
        "id": "s_1",
        "agentName": "a",
        "runtimeType": "exec",
        "status": "active",
        "createdAt": "2026-01-01T00:00:00Z",
        "lastActiveAt": "2026-01-01T00:00:00Z",
    }
    created = answer(201, json.dumps(session).encode())
    flaky = Responder(None, created, None, answer(502, b"<html>bad gateway</html>"), created)
    gone = Responder(None, None, None)
    host.start(flaky.start)
    host.start(gone.start)

    async def retried(client: Client) -> None:
        assert (await client.create_session()).id == "s_1"
        assert (await client.create_session()).id == "s_1"  # after a cut and a 502

    run_on(loop, flaky.url, retried, retry=Retry(attempts=2, backoff=0.01))
    keys = [flaky.headers(n)[IDEMPOTENCY_KEY_HEADER.lower()] for n in range(5)]
    assert keys[0] == keys[1] and keys[2] == keys[3] == keys[4] and keys[0] != keys[2]
    assert len(keys[0]) == 32

    async def gives_up(client: Client) -> None:
        with pytest.raises(TransportError, match="disconnected"):
            await client.get_session("s_1")

    run_on(loop, gone.url, gives_up, retry=Retry(backoff=0.01))
    assert len(gone.requests) == 3  # once, and twice again (the default)
    assert IDEMPOTENCY_KEY_HEADER.lower() not in gone.headers(0)  # a GET needs none

    never = Responder(answer(502, b"bad gateway"))
    host.start(never.start)

    async def no_retry(client: Client) -> None:
        with pytest.raises(ServerError):
            await client.create_session()

    run_on(loop, never.url, no_retry, retry=Retry(attempts=0))
    assert len(never.requests) == 1


def test_the_pool_lets_go_of_a_connection_before_the_server_does() -> None:
    assert ServerConfig().keep_alive > POOL_EXPIRY


def test_sync_client_from_four_threads_at_once(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    results: dict[int, list[str]] = {}
    errors: list[BaseException] = []
    # Who starts which thread: the server's Trio run starts (and lets go of)
    # its own worker threads at any time, so counting all of them is no test.
    started: list[tuple[threading.Thread, threading.Thread]] = []
    start = threading.Thread.start

    def recording_start(thread: threading.Thread) -> None:
        started.append((threading.current_thread(), thread))
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", recording_start)

    def chat(client: SyncClient, n: int) -> None:
        try:
            sid = client.create_session().id
            texts = []
            for i, transport in enumerate([*TRANSPORTS, "sse"]):
                with client.turn(sid, f"{n}.{i}", transport=transport) as events:
                    texts += [e.data["text"] for e in events if e.type == "message"]
            results[n] = texts
        except BaseException as exc:
            errors.append(exc)

    with SyncClient(server.url) as client:
        threads = [threading.Thread(target=chat, args=(client, n)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert errors == []
    assert results == {n: [f"echo: {n}.{i}" for i in range(3)] for n in range(4)}
    ours = {threading.current_thread(), *threads}
    assert [new for by, new in started if by in ours] == threads  # the client started none


def test_sync_client_beside_an_asyncio_loop_in_another_thread(server: Server) -> None:
    """A program's own loop keeps running, untouched, while the blocking client works."""
    loop = asyncio.new_event_loop()
    ticks = 0

    def tick() -> None:
        nonlocal ticks
        ticks += 1
        loop.call_later(0.001, tick)

    thread = threading.Thread(target=loop.run_forever)
    loop.call_soon(tick)
    thread.start()
    try:
        with SyncClient(server.url) as client:
            sid = client.create_session().id
            with client.turn(sid, "hi", transport="websocket") as events:
                assert [e.type for e in events][-1] == "session.ended"
            # And called from inside that running loop, as a Jupyter cell does.
            inside = asyncio.run_coroutine_threadsafe(_in_loop(client, sid), loop).result(30)
            assert inside == "echo: again"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
    assert ticks > 0


async def _in_loop(client: SyncClient, session_id: str) -> str:
    with client.turn(session_id, "again") as events:
        return str(next(e.data["text"] for e in events if e.type == "message"))


def test_client_needs_a_base_url(tmp_path: Path) -> None:
    for cls in (Client, SyncClient):
        with pytest.raises(ValueError, match="base URL"):
            cls("localhost:8080")


INTERRUPTED = """
import sys
from trioserve.client import SyncClient

url, session_id, transport, text = sys.argv[1:]
with SyncClient(url) as client:
    with client.turn(session_id, text, transport=transport, on_disconnect="continue") as events:
        for event in events:
            print(event.type, flush=True)
"""


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_ctrl_c_during_a_blocking_turn_cancels_it(transport: Transport, server: Server) -> None:
    """SIGINT to a script in a turn: the turn is cancelled on the server (even one that would
    continue without its client), then the script ends with KeyboardInterrupt."""
    with SyncClient(server.url) as client:
        sid = client.create_session().id
        proc = subprocess.Popen(
            [sys.executable, "-c", INTERRUPTED, server.url, sid, transport, HANG],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == "session.started\n"
            assert proc.stdout.readline() == "message\n"
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=30)
        finally:
            proc.kill()
        assert proc.returncode == -signal.SIGINT, stderr
        assert stderr.rstrip().endswith("KeyboardInterrupt"), stderr
        record = client.list_turns(sid)[-1]
        while record.running:
            time.sleep(0.02)
            record = client.get_turn(sid, record.id)
        assert (record.status, record.reason) == ("cancelled", "cancelled")


@pytest.mark.parametrize("loop", LOOPS)
def test_a_create_or_turn_sent_again_runs_once(loop: Loop, server: Server, host: TrioHost) -> None:
    """The server acted, its answer was lost on the way (a proxy drops it and closes): the
    client sends the request again with its key, and the server answers what it did."""
    port = int(server.url.rsplit(":", 1)[1])
    lost_create, lost_turn = host.proxy(port), host.proxy(port)
    lost_ws_turn = host.proxy(port, after_head=True)  # the 101 goes through, the first event not

    async def create(client: Client) -> str:
        return (await client.create_session()).id

    def turn(transport: Transport) -> Callable[[Client], Awaitable[list[str]]]:
        async def scenario(client: Client) -> list[str]:
            async with client.turn(sid, transport, transport=transport) as events:
                return [e.data["text"] async for e in events if e.type == "message"]

        return scenario

    with SyncClient(server.url) as direct:
        before = len(direct.list_sessions())
        sid = run_on(loop, lost_create.url, create)
        assert len(direct.list_sessions()) == before + 1
        assert run_on(loop, lost_turn.url, turn("sse")) == ["echo: sse"]
        assert run_on(loop, lost_ws_turn.url, turn("websocket")) == ["echo: websocket"]
        records = direct.list_turns(sid)
    assert lost_create.cuts == lost_turn.cuts == lost_ws_turn.cuts == 1
    assert [(r.input, r.status) for r in records] == [
        ("sse", "completed"),
        ("websocket", "completed"),
    ]
