"""PostgreSQL round trips per turn (issue 23), counted from libpq's own protocol trace
of every pooled connection: the read of the session's waiting turn (a PostgreSQL store
is shared, so a turn start always asks: ``SessionManager.parked_turn``), the session
read, the turn's insert and one per event batch (the last one with the end), so 6 for a
turn of two batches and its end; and an append its checks refuse writes nothing and
raises what the checked path raises."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from typing import IO, Any

import pytest
from psycopg import pq

from trioserve.errors import (
    DuplicateTurn,
    LogConflict,
    SessionBusy,
    SessionNotFound,
    TenantTurnCapReached,
    TurnCapReached,
)
from trioserve.stores import (
    LoggedEvent,
    PostgresStore,
    Session,
    SessionStatus,
    TurnEnd,
    TurnRecord,
    TurnStatus,
)

pytestmark = pytest.mark.backends("postgres")

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def session(sid: str) -> Session:
    return Session(
        id=sid,
        agent_name="agent",
        runtime_type="pi",
        status=SessionStatus.ACTIVE,
        created_at=T0,
        last_active_at=T0,
    )


def turn(tid: str, sid: str) -> TurnRecord:
    return TurnRecord(id=tid, session_id=sid, input="go", status=TurnStatus.RUNNING, created_at=T0)


def events(first: int, last: int, tid: str) -> list[LoggedEvent]:
    return [
        LoggedEvent(seq, tid, "message", b'{"seq":%d,"type":"message"}' % seq)
        for seq in range(first, last + 1)
    ]


class Trace:
    """libpq's trace of the store's connections: the round trips, counted as the times
    the server answered after the client had sent (each wait for PostgreSQL)."""

    def __init__(self, file: IO[bytes]) -> None:
        self.file = file
        self._read = 0

    def trips(self) -> int:
        """Round trips since the last call."""
        self.file.seek(self._read)
        text = self.file.read().decode(errors="replace")
        self._read += len(text.encode())
        count, last = 0, ""
        for line in text.splitlines():
            side = line[:1]
            if side == "B" and last == "F":
                count += 1
            if side in ("F", "B"):
                last = side
        return count


class TracedPool:
    """The store's connection pool, each connection traced while a call holds it."""

    def __init__(self, pool: Any, trace: Trace) -> None:
        self._pool = pool
        self._trace = trace

    @contextmanager
    def connection(self) -> Iterator[Any]:
        with self._pool.connection() as conn:
            conn.pgconn.trace(self._trace.file.fileno())
            conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
            try:
                yield conn
            finally:
                conn.pgconn.untrace()

    def close(self, timeout: float) -> None:
        self._pool.close(timeout)


@pytest.fixture
async def traced(store_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    store = await PostgresStore.open(store_url)
    with tempfile.TemporaryFile() as file:
        trace = Trace(file)
        monkeypatch.setattr(store, "_pool", TracedPool(store._pool, trace))
        try:
            yield store, trace
        finally:
            await store.close()


async def test_a_turn_costs_the_session_read_the_insert_and_one_trip_per_batch(
    traced: tuple[PostgresStore, Trace],
) -> None:
    store, trace = traced
    await store.create(session("s1"))
    trace.trips()
    per_call = []
    assert await store.list_turns("s1", status=TurnStatus.WAITING, limit=1) == []
    per_call.append(trace.trips())
    got = await store.get("s1")
    per_call.append(trace.trips())
    await store.create_turn(turn("t1", "s1"))
    per_call.append(trace.trips())
    await store.append_events("s1", "t1", events(got.last_seq + 1, 40, "t1"), started_at=T0)
    per_call.append(trace.trips())
    await store.append_events("s1", "t1", events(41, 41, "t1"))
    per_call.append(trace.trips())
    end = TurnEnd(status=TurnStatus.COMPLETED, reason="completed", ended_at=T0)
    await store.append_events("s1", "t1", events(42, 43, "t1"), end=end)
    per_call.append(trace.trips())
    assert per_call == [1, 1, 1, 1, 1, 1]
    # Everything is there, in order, and the rows say so.
    stored = await store.read_events("s1", after=0)
    assert [e.seq for e in stored] == list(range(1, 44))
    assert stored == events(1, 43, "t1")
    record = await store.get_turn("s1", "t1")
    assert (record.first_seq, record.last_seq, record.status) == (1, 43, TurnStatus.COMPLETED)
    assert record.started_at == T0 and record.ended_at == T0
    assert (await store.get("s1")).last_seq == 43


async def test_a_refused_append_writes_nothing_and_says_why(
    traced: tuple[PostgresStore, Trace],
) -> None:
    store, _ = traced
    await store.create(session("s1"))
    await store.create_turn(turn("t1", "s1"))
    await store.append_events("s1", "t1", events(1, 3, "t1"))
    with pytest.raises(LogConflict, match="expected event seq 4, got 5"):
        await store.append_events("s1", "t1", events(5, 6, "t1"))  # a gap
    with pytest.raises(LogConflict, match="expected event seq 4, got 3"):
        await store.append_events("s1", "t1", events(3, 4, "t1"))  # a repeat
    gap = [*events(4, 4, "t1"), *events(6, 6, "t1")]
    with pytest.raises(LogConflict, match="expected event seq 5, got 6"):
        await store.append_events("s1", "t1", gap)  # not running on by one inside
    with pytest.raises(SessionNotFound):
        await store.append_events("nope", "t1", events(4, 4, "t1"))
    end = TurnEnd(status=TurnStatus.COMPLETED, reason="completed", ended_at=T0)
    await store.append_events("s1", "t1", [], end=end)
    with pytest.raises(LogConflict, match="has already ended"):
        await store.append_events("s1", "t1", events(4, 4, "t1"))
    assert [e.seq for e in await store.read_events("s1", after=0)] == [1, 2, 3]
    assert (await store.get("s1")).last_seq == 3
    assert (await store.get_turn("s1", "t1")).last_seq == 3


async def test_the_one_statement_turn_insert_keeps_single_flight_and_ids(
    traced: tuple[PostgresStore, Trace],
) -> None:
    store, _ = traced
    with pytest.raises(SessionNotFound):
        await store.create_turn(turn("t0", "nope"))
    await store.create(session("s1"))
    await store.create_turn(turn("t1", "s1"))
    with pytest.raises(SessionBusy):
        await store.create_turn(turn("t2", "s1"))
    await store.create(session("s2"))
    with pytest.raises(DuplicateTurn):
        await store.create_turn(turn("t1", "s2"))
    assert [t.id for t in await store.list_turns("s1")] == ["t1"]
    assert await store.list_turns("s2") == []


async def test_a_sessions_turns_are_one_round_trip_and_an_unknown_session_is_told(
    traced: tuple[PostgresStore, Trace],
) -> None:
    store, trace = traced
    await store.create(session("s1"))
    for n in (1, 2, 3):
        await store.create_turn(turn(f"t{n}", "s1"))
        end = TurnEnd(TurnStatus.COMPLETED if n != 2 else TurnStatus.FAILED, "x", T0)
        await store.append_events("s1", f"t{n}", [], end=end)
    trace.trips()
    assert [t.id for t in await store.list_turns("s1")] == ["t1", "t2", "t3"]
    assert trace.trips() == 1
    completed = await store.list_turns("s1", status=TurnStatus.COMPLETED, limit=1)
    assert [(t.id, t.status) for t in completed] == [("t1", TurnStatus.COMPLETED)]
    assert await store.list_turns("s1", status=TurnStatus.WAITING) == []
    with pytest.raises(SessionNotFound):
        await store.list_turns("nope")
    assert trace.trips() == 3


async def test_a_turn_under_the_shared_caps_is_one_round_trip_and_the_caps_hold(
    traced: tuple[PostgresStore, Trace],
) -> None:
    store, trace = traced
    for sid in ("s1", "s2", "s3"):
        await store.create(replace(session(sid), tenant="acme"))
    trace.trips()
    await store.create_turn(turn("t1", "s1"), max_running=2, max_running_per_tenant=2)
    assert trace.trips() == 1
    with pytest.raises(SessionBusy):
        await store.create_turn(turn("t2", "s1"), max_running=2)
    await store.create_turn(turn("t3", "s2"), max_running=3, max_running_per_tenant=5)
    with pytest.raises(TenantTurnCapReached):
        await store.create_turn(turn("t4", "s3"), max_running=5, max_running_per_tenant=2)
    with pytest.raises(TurnCapReached):
        await store.create_turn(turn("t5", "s3"), max_running=2)
    with pytest.raises(SessionNotFound):
        await store.create_turn(turn("t6", "nope"), max_running=5)
    assert [t.id for t in await store.running_turns()] == ["t1", "t3"]
    # Refusals wrote nothing: the session's next turn goes through once there is room.
    end = TurnEnd(status=TurnStatus.COMPLETED, reason="completed", ended_at=T0)
    await store.append_events("s1", "t1", [], end=end)
    await store.create_turn(turn("t7", "s3"), max_running=2, max_running_per_tenant=2)
    assert sorted(t.id for t in await store.running_turns()) == ["t3", "t7"]
