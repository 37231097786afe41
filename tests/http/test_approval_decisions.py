"""Deciding an approval over REST as soon as its ``approval.requested`` is in the log.

A turn logs ``approval.requested`` and then parks (the store keeps the approval): a
client that answers the moment it reads the event is not told ``404``, its decision
waits for the park (``sessions._approvals.PARK_WAIT``), here or on another process.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio

from tests.helpers import APPROVAL_ADAPTER, ServerFactory
from trioserve.stores.approvals import ApprovalRecord

SAFETY = 60  # seconds: a hang guard, never a measurement


async def test_a_decision_sent_before_the_park_waits_for_it_and_the_turn_goes_on(
    start_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = await start_server(command=APPROVAL_ADAPTER, require_approval=("deploy",))
    store = server.manager.store
    park, get_approval = store.park_turn, store.get_approval
    parking, released = trio.Event(), trio.Event()
    lookups = 0

    async def held_park(
        session_id: str, turn_id: str, approval: ApprovalRecord, *hooks: Any
    ) -> Any:
        parking.set()
        await released.wait()
        return await park(session_id, turn_id, approval, *hooks)

    async def counted_get(session_id: str, approval_id: str) -> ApprovalRecord:
        nonlocal lookups
        lookups += 1
        return await get_approval(session_id, approval_id)

    monkeypatch.setattr(store, "park_turn", held_park)
    monkeypatch.setattr(store, "get_approval", counted_get)
    sid = (await server.client.post("/v1/sessions", json={})).json()["id"]
    started = await server.client.post(
        f"/v1/sessions/{sid}/turns", json={"input": "prod", "detach": True}
    )
    assert started.status_code == 202, started.text
    tid = started.json()["id"]
    with trio.fail_after(SAFETY):
        await parking.wait()  # the log holds approval.requested; the store no approval yet
    log = (await server.client.get(f"/v1/sessions/{sid}/events?format=json")).json()
    (asked,) = [e for e in log if e["type"] == "approval.requested"]
    approval_id = asked["data"]["approvalId"]
    decided: list[Any] = []

    async def decide() -> None:
        url = f"/v1/sessions/{sid}/approvals/{approval_id}"
        decided.append(await server.client.post(url, json={"decision": "approve"}))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(decide)
        with trio.fail_after(SAFETY):  # its first lookup missed, and it looks again
            while lookups < 2 and not decided:
                await trio.sleep(0.01)
        released.set()
    (answer,) = decided
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "approved"
    with trio.fail_after(SAFETY):
        while (record := (await server.client.get(f"/v1/sessions/{sid}/turns/{tid}")).json())[
            "status"
        ] in ("running", "waiting"):
            await trio.sleep(0.05)
    assert record["status"] == "completed"


async def test_an_unknown_approval_is_a_404_at_once(start_server: ServerFactory) -> None:
    """Only an id the log asks for is waited for."""
    server = await start_server(command=APPROVAL_ADAPTER, require_approval=("deploy",))
    sid = (await server.client.post("/v1/sessions", json={})).json()["id"]
    with trio.fail_after(5):  # far less than PARK_WAIT
        answer = await server.client.post(
            f"/v1/sessions/{sid}/approvals/ap_nope", json={"decision": "approve"}
        )
    assert answer.status_code == 404, answer.text


async def test_a_turn_parks_without_a_second_write_or_a_warning(
    start_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Its log is written once as it parks: no write of nothing refused by the store (the
    turn is waiting then), logged as if another process had closed the turn."""
    caplog.set_level(logging.INFO, logger="trioserve")
    server = await start_server(command=APPROVAL_ADAPTER, require_approval=("deploy",))
    sid = (await server.client.post("/v1/sessions", json={})).json()["id"]
    started = await server.client.post(
        f"/v1/sessions/{sid}/turns", json={"input": "prod", "detach": True}
    )
    tid = started.json()["id"]
    with trio.fail_after(SAFETY):
        while (await server.client.get(f"/v1/sessions/{sid}/turns/{tid}")).json()[
            "status"
        ] != "waiting":
            await trio.sleep(0.05)
        while not any("waits for approval" in r.getMessage() for r in caplog.records):
            await trio.sleep(0.02)
        while server.manager.turns_in_flight:
            await trio.sleep(0.02)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == []
