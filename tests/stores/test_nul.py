"""NUL in what a store is given, on every backend (issue 22): the same answer everywhere.

PostgreSQL's ``text`` cannot hold a NUL; memory and SQLite can.  So that the
three behave alike: what a client writes (a turn's input) and what an adapter
says (a turn's reason) are kept whole, NUL included; a key (an id, a name, a
tenant, an owner) never holds one, so a look-up by such a key finds nothing
and a new record with one is refused (``ValueError``) before anything is stored.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from trioserve.errors import SessionNotFound, TurnNotFound
from trioserve.protocol import SessionStatus, TurnStatus
from trioserve.stores import (
    LoggedEvent,
    Session,
    SessionKey,
    Store,
    TurnEnd,
    TurnRecord,
    open_store,
)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
NUL_TEXT = "before\x00after \x00\x00 ✓"


@pytest.fixture
async def store(backend_url: str) -> AsyncIterator[Store]:
    opened = await open_store(backend_url)
    try:
        await opened.create(session("s1"))
        yield opened
    finally:
        await opened.close()


def session(sid: str, **kw: object) -> Session:
    fields: dict[str, object] = {
        "id": sid,
        "agent_name": "agent",
        "runtime_type": "echo",
        "status": SessionStatus.ACTIVE,
        "created_at": T0,
        "last_active_at": T0,
        **kw,
    }
    return Session(**fields)  # type: ignore[arg-type]


def turn(tid: str, text: str = "hi", **kw: object) -> TurnRecord:
    fields: dict[str, object] = {
        "id": tid,
        "session_id": "s1",
        "input": text,
        "status": TurnStatus.RUNNING,
        "created_at": T0 + timedelta(seconds=1),
        **kw,
    }
    return TurnRecord(**fields)  # type: ignore[arg-type]


async def test_a_turn_input_and_reason_with_nul_round_trip(store: Store) -> None:
    await store.create_turn(turn("t1", NUL_TEXT))
    assert (await store.get_turn("s1", "t1")).input == NUL_TEXT
    event = LoggedEvent(1, "t1", "message", b'{"text":"a\\u0000b"}')
    end = TurnEnd(TurnStatus.FAILED, "adapter\x00said", T0 + timedelta(seconds=2))
    await store.append_events("s1", "t1", [event], end=end)
    got = await store.get_turn("s1", "t1")
    assert (got.input, got.status, got.reason) == (NUL_TEXT, TurnStatus.FAILED, "adapter\x00said")
    assert [t.input for t in await store.list_turns("s1")] == [NUL_TEXT]
    assert await store.read_events("s1") == [event]


async def test_a_finished_turn_with_nul_is_stored_as_given(store: Store) -> None:
    ended = T0 + timedelta(seconds=3)
    record = turn("t1", "\x00", status=TurnStatus.CANCELLED, ended_at=ended, reason="\x00x")
    await store.create_turn(record)
    got = await store.get_turn("s1", "t1")
    assert (got.input, got.reason) == ("\x00", "\x00x")


@pytest.mark.parametrize("sid", ["\x00", "s1\x00", "s\x001"])
async def test_a_session_id_with_nul_is_never_found(store: Store, sid: str) -> None:
    with pytest.raises(SessionNotFound):
        await store.get(sid)
    with pytest.raises(SessionNotFound):
        await store.update(sid, status=SessionStatus.PAUSED)
    with pytest.raises(SessionNotFound):
        await store.list_turns(sid)
    with pytest.raises(SessionNotFound):
        await store.read_events(sid)
    with pytest.raises(SessionNotFound):
        await store.log_bounds(sid)
    with pytest.raises((SessionNotFound, TurnNotFound)):
        await store.get_turn(sid, "t1")
    with pytest.raises(SessionNotFound):
        await store.append_events(sid, "t1", [])
    with pytest.raises(SessionNotFound):
        await store.create_turn(turn("t9", session_id=sid))
    await store.delete(sid)  # idempotent: nothing to delete
    assert [s.id for s in await store.list()] == ["s1"]


async def test_a_turn_id_with_nul_is_never_found(store: Store) -> None:
    await store.create_turn(turn("t1"))
    with pytest.raises(TurnNotFound):
        await store.get_turn("s1", "t1\x00")
    with pytest.raises(TurnNotFound):
        await store.append_events("s1", "t1\x00", [])
    assert await store.read_events("s1", turn_id="t1\x00") == []
    assert (await store.get_turn("s1", "t1")).status is TurnStatus.RUNNING


async def test_filters_with_nul_find_nothing(store: Store) -> None:
    await store.create(session("s2", tenant="acme"))
    assert await store.list(agent_name="agent\x00") == []
    assert await store.list(tenant="acme\x00") == []
    assert [s.id for s in await store.list(tenant="acme")] == ["s2"]
    assert await store.renew_leases("owner\x00", T0) == 0


@pytest.mark.parametrize("field", ["id", "agent_name", "runtime_type", "tenant", "adapter_state"])
async def test_a_new_session_with_nul_in_a_key_is_refused(store: Store, field: str) -> None:
    value = "s2\x00" if field == "id" else "x\x00"
    with pytest.raises(ValueError, match=f"{field} must not contain NUL"):
        await store.create(session("s2", **{field: value}))
    assert [s.id for s in await store.list()] == ["s1"]


async def test_nul_where_the_store_keys_records_is_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="id must not contain NUL"):
        await store.create_turn(turn("t\x00"))
    with pytest.raises(ValueError, match="owner must not contain NUL"):
        await store.create_turn(turn("t1", owner="me\x00"))
    assert await store.list_turns("s1") == []
    with pytest.raises(ValueError, match="adapter_state must not contain NUL"):
        await store.update("s1", adapter_state="\x00")
    with pytest.raises(ValueError, match="before: the session id must not contain NUL"):
        await store.list(before=SessionKey(T0, "s\x00"))
    await store.create_turn(turn("t1"))
    bad = LoggedEvent(1, "t1", "mess\x00age", b"{}")
    with pytest.raises(ValueError, match="type must not contain NUL"):
        await store.append_events("s1", "t1", [bad])
    assert await store.read_events("s1") == []
