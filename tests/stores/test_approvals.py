"""The store contract's approvals (``stores.approvals``), run against every backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
import trio

from trioserve.errors import (
    ApprovalDecided,
    ApprovalNotFound,
    LogConflict,
    SessionBusy,
    SessionNotFound,
)
from trioserve.protocol import SessionStatus, TurnStatus
from trioserve.stores import LoggedEvent, Session, Store, TurnEnd, TurnRecord, open_store
from trioserve.stores.approvals import ApprovalRecord, ApprovalStatus, Decision

T0 = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)


@pytest.fixture
async def store(backend_url: str) -> AsyncIterator[Store]:
    opened = await open_store(backend_url)
    try:
        yield opened
    finally:
        await opened.close()


def approval(aid: str = "ap1", tid: str = "t1") -> ApprovalRecord:
    request = {"callId": "c1", "tool": "shell", "arguments": {"cmd": "ls\x00"}, "state": {"n": 1}}
    return ApprovalRecord(aid, "s1", tid, request, T0, T0 + timedelta(hours=24))


async def running_turn(store: Store, tid: str = "t1") -> None:
    await store.create_turn(TurnRecord(tid, "s1", "hi", TurnStatus.RUNNING, T0, owner="p1"))
    raw = b'{"seq":1,"v":1,"type":"message"}'
    await store.append_events("s1", tid, [LoggedEvent(1, tid, "message", raw)], started_at=T0)


async def setup(store: Store) -> None:
    await store.create(
        Session("s1", "agent", "openai", SessionStatus.ACTIVE, T0, T0, tenant="acme")
    )
    await running_turn(store)


async def test_a_parked_turn_waits_with_no_owner_and_its_approval_is_pending(store: Store) -> None:
    await setup(store)
    await store.park_turn("s1", "t1", approval())
    turn = await store.get_turn("s1", "t1")
    assert (turn.status, turn.owner, turn.lease_expires_at, turn.ended_at) == (
        TurnStatus.WAITING,
        None,
        None,
        None,
    )
    assert await store.running_turns() == []  # a restart does not close it
    found = await store.get_approval("s1", "ap1")
    assert found.status is ApprovalStatus.PENDING
    assert found.request["arguments"] == {"cmd": "ls\x00"}
    assert found.expires_at == T0 + timedelta(hours=24)
    assert [a.id for a in await store.list_approvals("s1")] == ["ap1"]
    assert [a.id for a in await store.open_approvals()] == ["ap1"]
    with pytest.raises(LogConflict):  # not running any more
        await store.park_turn("s1", "t1", approval("ap2"))
    # a waiting turn is not the session's single flight in the store
    await store.create_turn(TurnRecord("t2", "s1", "x", TurnStatus.QUEUED, T0))


async def test_a_decision_is_taken_once_and_then_the_turn_resumes_once(store: Store) -> None:
    await setup(store)
    await store.park_turn("s1", "t1", approval())
    assert await store.resume_turn("s1", "t1", owner="p2") is None  # still pending
    decision = Decision(
        ApprovalStatus.DENIED, T0 + timedelta(minutes=1), None, "no\x00", {"a": 1}, "key1"
    )
    decided = await store.decide_approval("s1", "ap1", decision)
    assert decided.status is ApprovalStatus.DENIED
    assert decided.decision == decision
    with pytest.raises(ApprovalDecided):
        await store.decide_approval("s1", "ap1", decision)
    with pytest.raises(ApprovalNotFound):
        await store.decide_approval("s1", "nope", decision)
    with pytest.raises(ApprovalNotFound):
        await store.get_approval("other", "ap1")
    results = []

    async def resume() -> None:
        results.append(await store.resume_turn("s1", "t1", owner="p2"))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(resume)
    won = [r for r in results if r is not None]
    assert len(won) == 1
    assert (won[0].status, won[0].owner) == (TurnStatus.RUNNING, "p2")
    assert await store.open_approvals() == []
    assert (await store.get_approval("s1", "ap1")).resumed
    # the continuation logs on from the log's end and ends the turn as usual
    raw = b'{"seq":2,"v":1,"type":"session.ended"}'
    await store.append_events(
        "s1",
        "t1",
        [LoggedEvent(2, "t1", "session.ended", raw)],
        end=TurnEnd(TurnStatus.COMPLETED, "completed", T0 + timedelta(minutes=2)),
    )
    turn = await store.get_turn("s1", "t1")
    assert (turn.status, turn.first_seq, turn.last_seq) == (TurnStatus.COMPLETED, 1, 2)


async def test_approvals_of_an_unknown_session_and_a_deleted_one(store: Store) -> None:
    with pytest.raises(SessionNotFound):
        await store.list_approvals("nope")
    await setup(store)
    await store.park_turn("s1", "t1", approval())
    await store.delete("s1")
    with pytest.raises(ApprovalNotFound):
        await store.get_approval("s1", "ap1")


async def test_a_waiting_turn_keeps_its_session_busy_for_running_and_queued_turns(
    store: Store,
) -> None:
    """Across processes the store is the judge: while the session's turn waits for an
    approval, neither a new running turn nor a queued one starts (``SessionBusy``)."""
    await setup(store)
    later = T0 + timedelta(seconds=1)
    await store.create_turn(TurnRecord("t2", "s1", "next", TurnStatus.QUEUED, later))
    await store.park_turn("s1", "t1", approval())
    with pytest.raises(SessionBusy):
        await store.begin_turn("s1", "t2", owner="p2")
    with pytest.raises(SessionBusy):
        await store.create_turn(TurnRecord("t3", "s1", "x", TurnStatus.RUNNING, later))
    assert (await store.get_turn("s1", "t2")).status is TurnStatus.QUEUED
    decision = Decision(ApprovalStatus.APPROVED, later)
    await store.decide_approval("s1", "ap1", decision)
    assert (await store.resume_turn("s1", "t1", owner="p1")) is not None
    with pytest.raises(SessionBusy):  # running again: single flight as ever
        await store.begin_turn("s1", "t2", owner="p2")
    await store.append_events("s1", "t1", [], end=TurnEnd(TurnStatus.COMPLETED, "completed", later))
    started = await store.begin_turn("s1", "t2", owner="p2")
    assert started is not None and started.status is TurnStatus.RUNNING
