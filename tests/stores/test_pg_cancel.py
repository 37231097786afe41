"""Cancel requests across processes in a PostgreSQL store (``stores.pg_cancel``).

Two stores on one schema stand for two server processes.  Skipped without a
reachable PostgreSQL (failed under ``CI=true``).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from tests.helpers.pg import fresh_schema
from trioserve.errors import StoreError
from trioserve.stores import (
    LoggedEvent,
    MemoryStore,
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
    return Session(sid, "agent", "exec", SessionStatus.ACTIVE, T0, T0)


def turn(tid: str, sid: str, owner: str) -> TurnRecord:
    record = TurnRecord(
        id=tid, session_id=sid, input="go", status=TurnStatus.RUNNING, created_at=T0
    )
    return replace(record, owner=owner, lease_expires_at=T0)


async def test_a_cancel_request_reaches_the_owner_of_the_turn_only() -> None:
    async with fresh_schema() as url:
        mine, theirs = await PostgresStore.open(url), await PostgresStore.open(url)
        try:
            for sid in ("s1", "s2"):
                await mine.create(session(sid))
            await mine.create_turn(turn("t1", "s1", "a"))
            await mine.create_turn(turn("t2", "s2", "b"))
            assert await mine.cancel_requests("a") == []
            assert await theirs.request_cancel("s1", "t1")
            assert not await theirs.request_cancel("s2", "t1")  # another session's turn
            assert await mine.cancel_requests("a") == [("s1", "t1")]
            assert await mine.cancel_requests("b") == []
            end = TurnEnd(TurnStatus.CANCELLED, "cancelled", T0)
            raw = b'{"type":"session.ended"}'
            await mine.append_events(
                "s1", "t1", [LoggedEvent(1, "t1", "session.ended", raw)], end=end
            )
            assert await mine.cancel_requests("a") == []  # finished: no request left
            assert not await theirs.request_cancel("s1", "t1")  # not running
        finally:
            await mine.close()
            await theirs.close()


async def test_a_store_of_one_process_takes_no_cancel_requests() -> None:
    store = MemoryStore()
    await store.create(session("s1"))
    await store.create_turn(turn("t1", "s1", "a"))
    assert await store.cancel_requests("a") == []
    try:
        await store.request_cancel("s1", "t1")
    except StoreError as exc:
        assert "no cancel requests across processes" in str(exc)
    else:
        raise AssertionError("a memory store took a cancel request")
