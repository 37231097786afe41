"""The store contract's queued turns (``stores.turn_queue``), run against every backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
import trio

from trioserve.errors import (
    LogConflict,
    SessionBusy,
    SessionNotFound,
    TenantTurnCapReached,
    TurnCapReached,
    TurnNotFound,
)
from trioserve.protocol import SessionStatus, TurnStatus
from trioserve.stores import LoggedEvent, Session, Store, TurnEnd, TurnRecord, open_store

T0 = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
QUEUED = TurnStatus.QUEUED
RUNNING = TurnStatus.RUNNING


@pytest.fixture
async def store(backend_url: str) -> AsyncIterator[Store]:
    opened = await open_store(backend_url)
    try:
        yield opened
    finally:
        await opened.close()


def session(sid: str = "s1", tenant: str | None = None) -> Session:
    return Session(
        id=sid,
        agent_name="agent",
        runtime_type="pi",
        status=SessionStatus.ACTIVE,
        created_at=T0,
        last_active_at=T0,
        tenant=tenant,
    )


def turn(tid: str, sid: str = "s1", second: int = 0, status: TurnStatus = QUEUED) -> TurnRecord:
    created = T0 + timedelta(seconds=second)
    return TurnRecord(tid, sid, f"input of {tid}", status, created)


def end(reason: str = "completed", status: TurnStatus = TurnStatus.COMPLETED) -> TurnEnd:
    return TurnEnd(status, reason, T0 + timedelta(minutes=1))


async def test_a_queued_turn_is_stored_listed_and_holds_no_flight(store: Store) -> None:
    await store.create(session())
    await store.create_turn(turn("run", status=RUNNING))
    for i, tid in enumerate(["q2", "q1"]):  # created in this order, but q1 is older
        await store.create_turn(turn(tid, second=2 - i))
    got = await store.get_turn("s1", "q1")
    assert got == turn("q1", second=1)
    assert got.status is QUEUED and not got.status.finished and got.ended_at is None
    assert [t.id for t in await store.list_turns("s1", status=QUEUED)] == ["q1", "q2"]
    assert [t.id for t in await store.queued_turns()] == ["q1", "q2"]
    assert [t.id for t in await store.running_turns()] == ["run"]
    with pytest.raises(LogConflict):  # not started: no events
        await store.append_events("s1", "q1", [], end=end())


async def test_begin_takes_the_oldest_when_nothing_runs(store: Store) -> None:
    await store.create(session())
    await store.create_turn(turn("run", status=RUNNING))
    await store.create_turn(turn("first", second=1))
    await store.create_turn(turn("second", second=2))
    with pytest.raises(SessionBusy):  # the session runs a turn
        await store.begin_turn("s1", "first")
    await store.append_events("s1", "run", [], end=end())
    with pytest.raises(SessionBusy):  # an older one waits
        await store.begin_turn("s1", "second")
    until = T0 + timedelta(hours=1)
    started = await store.begin_turn("s1", "first", owner="me", lease_expires_at=until)
    assert started is not None
    assert (started.status, started.owner, started.lease_expires_at) == (RUNNING, "me", until)
    assert started == await store.get_turn("s1", "first")
    assert await store.begin_turn("s1", "first") is None  # not queued any more
    assert [t.id for t in await store.queued_turns()] == ["second"]
    log = [LoggedEvent(1, "first", "message", b'{"seq":1}')]
    await store.append_events("s1", "first", log, started_at=T0, end=end())
    assert (await store.get_turn("s1", "first")).first_seq == 1


async def test_begin_keeps_the_caps(store: Store) -> None:
    for sid in ("a", "b", "c"):
        await store.create(session(sid, tenant="acme" if sid != "c" else None))
    await store.create_turn(turn("ra", "a", status=RUNNING))
    await store.create_turn(turn("qb", "b"))
    await store.create_turn(turn("qc", "c"))
    with pytest.raises(TenantTurnCapReached):
        await store.begin_turn("b", "qb", max_running_per_tenant=1)
    with pytest.raises(TurnCapReached):
        await store.begin_turn("c", "qc", max_running=1)
    assert [t.id for t in await store.queued_turns()] == ["qb", "qc"]
    assert await store.begin_turn("b", "qb", max_running=2, max_running_per_tenant=2)
    with pytest.raises(ValueError, match="max_running"):
        await store.begin_turn("c", "qc", max_running=0)


async def test_end_queued_ends_it_unstarted(store: Store) -> None:
    await store.create(session())
    await store.create_turn(turn("q"))
    cancelled = end("cancelled", TurnStatus.CANCELLED)
    assert await store.end_queued("s1", "q", cancelled)
    got = await store.get_turn("s1", "q")
    assert (got.status, got.reason, got.ended_at) == (
        TurnStatus.CANCELLED,
        "cancelled",
        T0 + timedelta(minutes=1),
    )
    assert got.first_seq is None and got.started_at is None
    assert not await store.end_queued("s1", "q", cancelled)  # once
    assert await store.begin_turn("s1", "q") is None
    assert await store.queued_turns() == []
    assert (await store.get("s1")).last_seq == 0
    with pytest.raises(ValueError, match="queued"):
        await store.end_queued("s1", "q", TurnEnd(QUEUED, "x", T0))


async def test_unknown_sessions_and_turns(store: Store) -> None:
    await store.create(session())
    await store.create_turn(turn("q"))
    with pytest.raises(TurnNotFound):
        await store.begin_turn("s1", "nope")
    with pytest.raises(TurnNotFound):
        await store.end_queued("s1", "nope", end())
    with pytest.raises(SessionNotFound):
        await store.begin_turn("nope", "q")
    await store.create(session("s2"))
    with pytest.raises(TurnNotFound):  # another session's turn
        await store.begin_turn("s2", "q")


async def test_racing_begins_start_exactly_one(store: Store) -> None:
    await store.create(session())
    await store.create_turn(turn("q"))
    outcomes: list[object] = []

    async def begin() -> None:
        try:
            outcomes.append(await store.begin_turn("s1", "q"))
        except SessionBusy as exc:
            outcomes.append(exc)

    async with trio.open_nursery() as nursery:
        for _ in range(8):
            nursery.start_soon(begin)
    started = [o for o in outcomes if isinstance(o, TurnRecord)]
    assert len(started) == 1 and len(outcomes) == 8
    assert [t.id for t in await store.running_turns()] == ["q"]


async def test_leases_of_queued_turns_are_renewed_and_claimed_once(store: Store) -> None:
    await store.create(session())
    soon, later = T0 + timedelta(seconds=10), T0 + timedelta(hours=1)
    for tid, second, owner in (("mine", 1, "a"), ("gone", 2, "dead"), ("free", 3, None)):
        record = turn(tid, second=second)
        if owner is not None:
            record = replace(record, owner=owner, lease_expires_at=soon)
        await store.create_turn(record)
    assert await store.renew_leases("a", later) == 1
    # At T0 + 1 min the dead owner's lease has passed; "a" renewed; "free" has none.
    now = T0 + timedelta(minutes=1)
    claims = await claim_at_once(store, now, later)
    assert sorted(claims) == ["free", "gone"], claims  # each claimed by one survivor only
    got = {t.id: t for t in await store.queued_turns()}
    assert (got["mine"].owner, got["mine"].lease_expires_at) == ("a", later)
    assert {got[t].owner for t in ("gone", "free")} <= {"s0", "s1", "s2"}
    assert await store.claim_queued("late", later, now=now) == []  # leases now run to later


async def claim_at_once(store: Store, now: datetime, until: datetime) -> list[str]:
    """Three survivors claim at once; the ids each got, all together."""
    got: list[str] = []

    async def claim(owner: str) -> None:
        got.extend(t.id for t in await store.claim_queued(owner, until, now=now))

    async with trio.open_nursery() as nursery:
        for i in range(3):
            nursery.start_soon(claim, f"s{i}")
    return got
