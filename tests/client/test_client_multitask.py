"""The client's ``multitask``: a turn that waits its turn, one that interrupts, and a queued
turn cancelled by id; on Trio, asyncio and blocking, SSE and WebSocket."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest

from tests.helpers import script
from tests.helpers.loops import LOOPS, Loop, run_on
from tests.helpers.server import Server
from tests.helpers.threaded import TrioHost
from trioserve.client import Client, SessionBusyError, Transport, Turn

HANG = script({"event": "message", "data": {"text": "working"}}, {"hang": True})


def said(label: str) -> str:
    return script({"event": "message", "data": {"label": label}}, {"end": "completed"})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with TrioHost(tmp_path_factory.mktemp("host")) as host:
        yield host.server()


async def ended(client: Client, session_id: str, turn_id: str) -> Turn:
    while not (record := await client.get_turn(session_id, turn_id)).finished:
        await anyio.sleep(0.02)
    return record


@pytest.mark.parametrize("transport", ["sse", "websocket"])
@pytest.mark.parametrize("loop", LOOPS)
def test_enqueue_interrupt_and_cancel_by_id(
    loop: Loop, transport: Transport, server: Server
) -> None:
    async def scenario(client: Client) -> None:
        session = await client.create_session()
        sid = session.id
        hung = await client.detach(sid, HANG)
        with pytest.raises(SessionBusyError):
            async with client.turn(sid, "x", transport=transport, multitask="reject"):
                pass
        waiting = await client.detach(sid, said("w"), multitask="enqueue")
        assert (waiting.status, waiting.finished) == ("queued", False)
        await client.cancel(sid, waiting.id)  # out of the queue
        gone = await ended(client, sid, waiting.id)
        assert (gone.status, gone.reason, gone.first_seq) == ("cancelled", "cancelled", None)
        async with client.turn(sid, said("q"), transport=transport, multitask="enqueue") as events:
            first = await anext(aiter(events))
            assert first.type == "trioserve.queued" and first.seq is None
            assert first.data["position"] == 1
            await client.cancel(sid)  # the running turn: the queued one starts
            rest = [event async for event in events]
        assert [e.type for e in rest] == ["session.started", "message", "session.ended"]
        assert rest[1].data["label"] == "q" and rest[0].seq is not None
        assert (await ended(client, sid, hung.id)).status == "cancelled"
        await client.detach(sid, HANG)
        async with client.turn(
            sid, said("i"), transport=transport, multitask="interrupt"
        ) as events:
            got = [event async for event in events]
        assert [e.type for e in got] == ["session.started", "message", "session.ended"]
        interrupted = (await client.list_turns(sid))[-2]
        assert (interrupted.status, interrupted.reason) == ("cancelled", "interrupted")

    run_on(loop, server.url, scenario)
