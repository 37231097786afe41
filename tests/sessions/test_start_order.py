"""A turn's start, in order.  Its first seq comes from the session as it is once the
running turn is known: a turn that ends while a new one starts has written its whole log
by then (the new turn was numbered from a stale read, and the store refused its whole
log: an empty stream).  Its adapter is started before the start returns."""

from __future__ import annotations

import pytest
import trio

from tests.helpers.procs import fake_adapters
from tests.helpers.server import ServerFactory
from tests.helpers.specs import script
from trioserve.sessions._turns import Turn

SAFETY = 60  # seconds: a hang guard, never a measurement


async def test_a_turn_that_ends_as_the_next_one_starts_leaves_it_numbered_after_its_log(
    start_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = await start_server()
    manager = server.manager
    session_id = (await server.create())["id"]
    path = f"/v1/sessions/{session_id}/turns"
    resp = await server.client.post(path, json={"input": script({"hang": True}), "detach": True})
    assert resp.status_code == 202, resp.text
    with trio.fail_after(SAFETY):
        while manager.turns_in_flight != 1:
            await trio.sleep(0.02)
    store = manager.store
    read = store.get

    async def read_then_let_the_turn_end(wanted: str) -> object:
        """The session as it was, returned once the running turn has ended."""
        session = await read(wanted)
        if manager.turns_in_flight:
            await manager.cancel_turn(wanted)
            with trio.fail_after(SAFETY):
                while manager.turns_in_flight:
                    await trio.sleep(0.02)
        return session

    monkeypatch.setattr(store, "get", read_then_let_the_turn_end)
    second = await server.client.post(path, json={"input": "next"})
    monkeypatch.setattr(store, "get", read)
    # The turn that ran when the start looked is its answer: busy.  Never a turn numbered
    # from before the first one's end.
    assert second.status_code == 409, second.text
    third = await server.turn(session_id, "third")
    assert third[-1].event == "session.ended"
    log = (await server.client.get(f"/v1/sessions/{session_id}/events?format=json")).json()
    assert [e["seq"] for e in log] == list(range(1, len(log) + 1))
    turns = (await server.client.get(path)).json()
    assert [t["status"] for t in turns] == ["cancelled", "completed"]


async def test_a_turn_s_adapter_runs_before_its_start_returns(start_server: ServerFactory) -> None:
    # The adapter loads while the response's head goes out, not after: once start_turn
    # has returned (its request then answers), the process is there, with no await between.
    server = await start_server(processes=True)
    session_id = (await server.create())["id"]
    before = fake_adapters()
    turn = await server.manager.start_turn(session_id, script({"hang": True}))
    assert fake_adapters() - before, "no adapter process yet"
    assert isinstance(turn, Turn)
    await server.manager.cancel_turn(session_id)
