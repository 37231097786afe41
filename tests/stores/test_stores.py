"""The ``Store`` contract (CONTRACT §4), run against every store backend."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta, timezone
from functools import partial
from pathlib import Path

import pytest
import trio

from tests.helpers.backends import DURABLE
from trioserve import stores
from trioserve.errors import (
    DuplicateSession,
    DuplicateTurn,
    LogConflict,
    NotFound,
    SessionBusy,
    SessionCapReached,
    SessionExpired,
    SessionNotFound,
    StoreError,
    TenantSessionCapReached,
    TenantTurnCapReached,
    TurnCapReached,
    TurnNotFound,
)
from trioserve.protocol import SessionStatus, TurnStatus
from trioserve.stores import (
    UNSET,
    IdempotencyClaim,
    IdempotencyKeyBound,
    IdempotencyRecord,
    LogBounds,
    LoggedEvent,
    MemoryStore,
    Session,
    SessionKey,
    SQLiteStore,
    Store,
    TurnBatch,
    TurnEnd,
    TurnRecord,
    default_sqlite_path,
    open_store,
    utcnow,
)

T0 = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
ACTIVE = SessionStatus.ACTIVE
EXPIRED = SessionStatus.EXPIRED


def make(
    sid: str = "s1",
    *,
    agent: str = "agent",
    status: SessionStatus = ACTIVE,
    created: datetime = T0,
    last: datetime | None = None,
    **kw: object,
) -> Session:
    return Session(
        id=sid,
        agent_name=agent,
        runtime_type="pi",
        status=status,
        created_at=created,
        last_active_at=created if last is None else last,
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
async def store(backend_url: str) -> AsyncIterator[Store]:
    """A fresh store of each backend (``backend`` is a parameter: tests/helpers/backends.py)."""
    opened = await open_store(backend_url)
    try:
        yield opened
    finally:
        await opened.close()


# --- create / get -------------------------------------------------------------


async def test_create_get_round_trips_every_field(store: Store) -> None:
    session = Session(
        id="sess-1",
        agent_name="researcher",
        runtime_type="pi",
        status=SessionStatus.PAUSED,
        created_at=T0,
        last_active_at=T0 + timedelta(microseconds=1),
        spec={"name": "researcher", "task": "hi ✓", "n": [1, 2.5, None, True], "o": {"k": {}}},
        inputs={"topic": "trio", "empty": ""},
        adapter_state='{"cursor": 3}',
        tenant="acme",
    )
    await store.create(session)
    got = await store.get("sess-1")
    assert got == session
    assert got.created_at.tzinfo is UTC and got.last_active_at.tzinfo is UTC
    assert got.last_active_at - got.created_at == timedelta(microseconds=1)


@pytest.mark.parametrize("status", list(SessionStatus))
async def test_every_status_round_trips(store: Store, status: SessionStatus) -> None:
    await store.create(make(status=status))
    assert (await store.get("s1")).status is status


@pytest.mark.parametrize(
    "when",
    [
        datetime(1960, 5, 4, 3, 2, 1, 999999, tzinfo=UTC),  # before the epoch
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    ],
)
async def test_times_round_trip_to_the_microsecond(store: Store, when: datetime) -> None:
    await store.create(make(created=when))
    got = await store.get("s1")
    assert got.created_at == when and got.created_at.microsecond == when.microsecond


async def test_times_in_other_zones_come_back_in_utc(store: Store) -> None:
    local = datetime(2026, 3, 1, 14, 0, 0, 5, tzinfo=timezone(timedelta(hours=2)))
    await store.create(make(created=local))
    got = await store.get("s1")
    assert got.created_at == local
    assert got.created_at.tzinfo is UTC and got.created_at.hour == 12


async def test_naive_datetimes_are_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        await store.create(make(created=datetime(2026, 1, 1)))
    await store.create(make())
    with pytest.raises(ValueError, match="timezone-aware"):
        await store.update("s1", last_active_at=datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="timezone-aware"):
        await store.mark_expired(datetime(2026, 1, 1))


async def test_spec_must_be_json(store: Store) -> None:
    with pytest.raises(ValueError, match="JSON"):
        await store.create(make(spec={"x": object()}))
    with pytest.raises(SessionNotFound):
        await store.get("s1")


async def test_duplicate_id_is_refused(store: Store) -> None:
    await store.create(make(agent="first"))
    with pytest.raises(DuplicateSession):
        await store.create(make(agent="second"))
    assert (await store.get("s1")).agent_name == "first"


async def test_get_unknown_raises_not_found(store: Store) -> None:
    with pytest.raises(SessionNotFound):
        await store.get("nope")


async def test_callers_cannot_mutate_stored_state(store: Store) -> None:
    spec: dict[str, object] = {"tools": ["a"], "nested": {"k": 1}}
    inputs = {"x": "1"}
    await store.create(make(spec=spec, inputs=inputs))
    spec["tools"].append("b")  # type: ignore[attr-defined]
    inputs["x"] = "changed"
    got = await store.get("s1")
    got.spec["nested"]["k"] = 2
    got.inputs["y"] = "2"
    (listed,) = await store.list()
    listed.spec.clear()
    fresh = await store.get("s1")
    assert fresh.spec == {"tools": ["a"], "nested": {"k": 1}}
    assert fresh.inputs == {"x": "1"}
    updated = await store.update("s1", adapter_state="z")
    updated.spec.clear()
    assert (await store.get("s1")).spec == {"tools": ["a"], "nested": {"k": 1}}


# --- update -------------------------------------------------------------------


async def test_update_unknown_raises_not_found(store: Store) -> None:
    with pytest.raises(SessionNotFound):
        await store.update("nope", status=SessionStatus.ENDED)


async def test_update_changes_mutable_fields_and_keeps_identity(store: Store) -> None:
    original = make(spec={"task": "t"}, inputs={"a": "b"})
    await store.create(original)
    later = T0 + timedelta(hours=1, microseconds=7)
    called = utcnow()
    updated = await store.update(
        "s1", status=SessionStatus.ENDED, last_active_at=later, adapter_state="st"
    )
    assert updated.ended_at is not None and called <= updated.ended_at <= utcnow()
    expected = Session(
        id="s1",
        agent_name="agent",
        runtime_type="pi",
        status=SessionStatus.ENDED,
        created_at=T0,
        last_active_at=later,
        spec={"task": "t"},
        inputs={"a": "b"},
        adapter_state="st",
        ended_at=updated.ended_at,  # when it became terminal: now, not its last activity
    )
    assert updated == expected
    assert await store.get("s1") == expected


async def test_update_with_nothing_changes_nothing(store: Store) -> None:
    await store.create(make(adapter_state="keep"))
    assert await store.update("s1") == make(adapter_state="keep")


async def test_update_adapter_state_set_clear_and_unset(store: Store) -> None:
    await store.create(make())
    assert (await store.update("s1", adapter_state="one")).adapter_state == "one"
    kept = await store.update("s1", adapter_state=UNSET, status=SessionStatus.PAUSED)
    assert kept.adapter_state == "one"
    assert (await store.update("s1", last_active_at=T0)).adapter_state == "one"
    assert (await store.update("s1", adapter_state=None)).adapter_state is None
    assert (await store.get("s1")).adapter_state is None


async def test_expired_cannot_be_revived(store: Store) -> None:
    await store.create(make(status=EXPIRED, adapter_state="old"))
    for status in set(SessionStatus) - {EXPIRED}:
        with pytest.raises(SessionExpired):
            await store.update("s1", status=status, last_active_at=T0 + timedelta(days=1))
    row = await store.get("s1")
    assert row.status is EXPIRED
    assert row.last_active_at == T0  # the refused call changed nothing
    assert row.adapter_state == "old"


async def test_expired_row_other_fields_may_change(store: Store) -> None:
    await store.create(make(status=EXPIRED))
    later = T0 + timedelta(minutes=5)
    touched = await store.update("s1", last_active_at=later, adapter_state="new")
    assert touched.status is EXPIRED and touched.last_active_at == later
    again = await store.update("s1", status=EXPIRED)
    assert again.status is EXPIRED and again.adapter_state == "new"


async def test_expired_guard_error_is_a_store_error(store: Store) -> None:
    await store.create(make(status=EXPIRED))
    with pytest.raises(StoreError):
        await store.update("s1", status=ACTIVE)


# --- delete -------------------------------------------------------------------


async def test_delete_is_idempotent(store: Store) -> None:
    await store.create(make())
    await store.delete("s1")
    await store.delete("s1")
    await store.delete("never-existed")
    with pytest.raises(SessionNotFound):
        await store.get("s1")
    await store.create(make())  # the id is free again
    assert (await store.get("s1")).id == "s1"


# --- list ---------------------------------------------------------------------


async def test_list_newest_last_active_first_with_tie_breaks(store: Store) -> None:
    t = T0
    rows = [
        make("a", created=t, last=t + timedelta(seconds=3)),
        make("b", created=t, last=t + timedelta(seconds=1)),
        make("c", created=t + timedelta(seconds=1), last=t + timedelta(seconds=1)),
        make("d", created=t, last=t + timedelta(seconds=1)),
        make("e", created=t, last=t + timedelta(microseconds=1)),
        make("f", created=t, last=t),
    ]
    for row in reversed(rows):
        await store.create(row)
    # last_active desc, then id desc ("d", "c", "b"; created_at plays no part)
    assert [s.id for s in await store.list()] == ["a", "d", "c", "b", "e", "f"]
    assert await store.list() == [rows[i] for i in (0, 3, 2, 1, 4, 5)]


async def test_list_filters_and_limit(store: Store) -> None:
    for i in range(6):
        await store.create(
            make(
                f"s{i}",
                agent="x" if i % 2 else "y",
                status=ACTIVE if i < 3 else SessionStatus.ENDED,
                last=T0 + timedelta(seconds=i),
            )
        )
    assert [s.id for s in await store.list(agent_name="x")] == ["s5", "s3", "s1"]
    assert [s.id for s in await store.list(status=ACTIVE)] == ["s2", "s1", "s0"]
    assert [s.id for s in await store.list(agent_name="x", status=ACTIVE)] == ["s1"]
    assert [s.id for s in await store.list(limit=2)] == ["s5", "s4"]
    assert [s.id for s in await store.list(agent_name="y", limit=1)] == ["s4"]
    assert await store.list(limit=0) == []
    assert len(await store.list(limit=100)) == 6
    assert await store.list(agent_name="nobody") == []
    assert await store.list(status=SessionStatus.FAILED) == []
    with pytest.raises(ValueError, match="limit"):
        await store.list(limit=-1)


async def _seed_for_paging(store: Store) -> list[Session]:
    """Sessions with ties in ``last_active_at``, two agents, two statuses; in list order."""
    rows = []
    for i in range(23):
        rows.append(
            make(
                f"s{i:02}",
                agent="x" if i % 3 else "y",
                status=ACTIVE if i % 2 else SessionStatus.ENDED,
                last=T0 + timedelta(seconds=i // 4),  # runs of four equal times
            )
        )
    for row in rows[::2] + rows[1::2]:  # inserted out of order
        await store.create(row)
    return sorted(rows, key=lambda r: (r.last_active_at, r.id), reverse=True)


async def _pages(store: Store, size: int, **filters: object) -> list[list[str]]:
    pages: list[list[str]] = []
    before = None
    while page := await store.list(limit=size, before=before, **filters):  # type: ignore[arg-type]
        pages.append([s.id for s in page])
        before = page[-1].key
    return pages


@pytest.mark.parametrize("size", [1, 2, 4, 5, 23, 50])
async def test_list_pages_stitch_to_the_whole_list(store: Store, size: int) -> None:
    ordered = await _seed_for_paging(store)
    assert [s.id for s in await store.list()] == [r.id for r in ordered]
    for filters in ({}, {"status": ACTIVE}, {"agent_name": "x"}, {"agent_name": "y"}):
        whole = [s.id for s in await store.list(**filters)]
        pages = await _pages(store, size, **filters)
        assert [sid for page in pages for sid in page] == whole, filters
        assert all(len(page) == size for page in pages[:-1])


async def test_list_before_a_key(store: Store) -> None:
    ordered = await _seed_for_paging(store)
    ids = [r.id for r in ordered]
    # each session's key: exactly the sessions after it
    for i, row in enumerate(ordered):
        assert [s.id for s in await store.list(before=row.key)] == ids[i + 1 :]
    # a key between rows (no session has it): the sessions after that position
    tie = T0 + timedelta(seconds=2)  # s08 .. s11 share it
    assert [s.id for s in await store.list(before=SessionKey(tie, "s09z"), limit=3)] == [
        "s09",
        "s08",
        "s07",
    ]
    later = SessionKey(T0 + timedelta(days=1), "")
    assert [s.id for s in await store.list(before=later)] == ids
    assert await store.list(before=SessionKey(T0 - timedelta(days=1), "s99")) == []
    local = SessionKey(tie.astimezone(timezone(timedelta(hours=-5))), "s09z")
    assert [s.id for s in await store.list(before=local, limit=1)] == ["s09"]
    with pytest.raises(ValueError, match="timezone-aware"):
        await store.list(before=SessionKey(datetime(2026, 1, 1), "s1"))


async def test_list_before_a_deleted_session(store: Store) -> None:
    ordered = await _seed_for_paging(store)
    first = await store.list(limit=5)
    cursor = first[-1].key
    await store.delete(cursor.id)  # the page's last session goes; its key still pages
    rest = await store.list(before=cursor)
    assert [s.id for s in first + rest] == [r.id for r in ordered]


async def test_list_pages_while_sessions_are_added(store: Store) -> None:
    ordered = await _seed_for_paging(store)
    seen: list[str] = []
    before = None
    for n in range(100):
        page = await store.list(limit=3, before=before)
        if not page:
            break
        seen += [s.id for s in page]
        before = page[-1].key
        # newer activity lands ahead of the pages already read, never in later ones
        await store.create(make(f"new{n:03}", last=T0 + timedelta(hours=1, seconds=n)))
    assert seen == [r.id for r in ordered]


# --- ended_at -----------------------------------------------------------------------


async def test_ended_at_is_when_a_session_became_terminal(store: Store) -> None:
    await store.create(make("a"))
    await store.create(make("b", status=SessionStatus.PAUSED))
    assert (await store.get("a")).ended_at is None
    called = utcnow()
    ended = await store.update("a", status=SessionStatus.ENDED)
    assert ended.ended_at is not None and called <= ended.ended_at <= utcnow()
    assert (await store.get("a")).ended_at == ended.ended_at
    # touching a terminal session, or moving it to another terminal status, keeps it
    touched = await store.update("a", last_active_at=T0 + DAY, adapter_state="x")
    failed = await store.update("a", status=SessionStatus.FAILED)
    assert touched.ended_at == failed.ended_at == ended.ended_at
    # non-terminal again: no ended_at; terminal again: a new one
    assert (await store.update("a", status=ACTIVE)).ended_at is None
    again = await store.update("a", status=SessionStatus.ENDED)
    assert again.ended_at is not None and again.ended_at >= ended.ended_at
    assert (await store.update("b", status=ACTIVE)).ended_at is None


async def test_mark_expired_sets_ended_at(store: Store) -> None:
    await store.create(make("idle"))
    called = utcnow()
    assert await store.mark_expired(T0 + DAY) == ["idle"]
    got = await store.get("idle")
    assert got.ended_at is not None and called <= got.ended_at <= utcnow()
    assert got.last_active_at == T0


async def test_create_keeps_ended_at_of_terminal_sessions_only(store: Store) -> None:
    await store.create(make("plain", status=SessionStatus.ENDED, last=T0 + DAY))
    await store.create(make("given", status=EXPIRED, ended_at=T0 + 2 * DAY))
    assert (await store.get("plain")).ended_at == T0 + DAY  # its last activity
    assert (await store.get("given")).ended_at == T0 + 2 * DAY
    for status in (ACTIVE, SessionStatus.PAUSED):
        with pytest.raises(ValueError, match="ended_at"):
            await store.create(make("live", status=status, ended_at=T0))
    with pytest.raises(SessionNotFound):
        await store.get("live")
    with pytest.raises(ValueError, match="timezone-aware"):
        await store.create(make("naive", status=EXPIRED, ended_at=datetime(2026, 1, 1)))


# --- purge_sessions -------------------------------------------------------------------


async def test_purge_deletes_terminal_sessions_ended_before_the_cutoff(store: Store) -> None:
    cutoff = T0 + DAY
    before = cutoff - timedelta(microseconds=1)
    for sid, status, ended_at in [
        ("ended-old", SessionStatus.ENDED, T0),
        ("expired-old", EXPIRED, before),
        ("failed-old", SessionStatus.FAILED, T0),
        ("ended-at-cutoff", SessionStatus.ENDED, cutoff),
        ("ended-new", SessionStatus.ENDED, cutoff + DAY),
    ]:
        await store.create(make(sid, status=status, ended_at=ended_at))
    for sid in ("active-old", "paused-old"):  # never purged, however old
        status = ACTIVE if sid.startswith("active") else SessionStatus.PAUSED
        await store.create(make(sid, status=status, last=T0 - 1000 * DAY))
    # an old ended session whose turn still runs (ended while the turn stops)
    await store.create(make("busy", status=SessionStatus.ENDED, ended_at=T0))
    await store.create_turn(turn("busy-t", "busy"))
    # the purged sessions' turns and logs go with them
    await store.create_turn(turn("old-t1", "ended-old"))
    await store.append_events("ended-old", "old-t1", events(1, 3, "old-t1"), end=done(T0))
    await store.create_turn(turn("old-t2", "ended-old", status=COMPLETED, ended_at=T0))

    assert await store.purge_sessions(cutoff) == 3
    left = {s.id for s in await store.list()}
    assert left == {"ended-at-cutoff", "ended-new", "active-old", "paused-old", "busy"}
    for sid in ("ended-old", "expired-old", "failed-old"):
        with pytest.raises(SessionNotFound):
            await store.get(sid)
        with pytest.raises(SessionNotFound):
            await store.read_events(sid)
        with pytest.raises(SessionNotFound):
            await store.list_turns(sid)
    with pytest.raises(TurnNotFound):
        await store.get_turn("ended-old", "old-t1")
    assert [t.id for t in await store.running_turns()] == ["busy-t"]
    assert await store.drop_events(cutoff + 1000 * DAY) == 0  # no events were left behind
    assert await store.purge_sessions(cutoff) == 0  # idempotent

    # once its turn has ended, the busy session goes too; ids are free again
    await store.append_events("busy", "busy-t", [], end=done(T0))
    assert await store.purge_sessions(cutoff) == 1
    await store.create(make("ended-old"))
    assert (await store.get("ended-old")).last_seq == 0
    assert await store.read_events("ended-old") == []
    with pytest.raises(ValueError, match="timezone-aware"):
        await store.purge_sessions(datetime(2026, 1, 1))


async def test_purge_goes_by_ended_at_not_last_activity(store: Store) -> None:
    await store.create(make("s1", last=T0 - 100 * DAY))
    await store.update("s1", status=SessionStatus.ENDED)  # ended now, idle for long before
    assert await store.purge_sessions(utcnow() - DAY) == 0
    assert await store.purge_sessions(utcnow() + DAY) == 1


async def test_list_by_tenant_and_the_tenant_outlives_updates(store: Store) -> None:
    for i, tenant in enumerate(["acme", None, "zeta", "acme", "acme"]):
        status = SessionStatus.ENDED if i == 3 else ACTIVE
        await store.create(make(f"s{i}", tenant=tenant, status=status, last=T0 + timedelta(i)))
    assert [s.id for s in await store.list(tenant="acme")] == ["s4", "s3", "s0"]
    assert [s.id for s in await store.list(tenant="acme", status=ACTIVE)] == ["s4", "s0"]
    assert [s.id for s in await store.list(tenant="acme", limit=1)] == ["s4"]
    s4 = await store.get("s4")  # paging within a tenant
    assert [s.id for s in await store.list(tenant="acme", before=s4.key, limit=1)] == ["s3"]
    assert [s.id for s in await store.list(tenant="zeta", before=s4.key)] == ["s2"]
    assert [s.id for s in await store.list(tenant="zeta")] == ["s2"]
    assert await store.list(tenant="nobody") == []
    assert len(await store.list()) == 5  # no tenant given: every session
    assert (await store.get("s1")).tenant is None
    updated = await store.update("s0", status=SessionStatus.ENDED, adapter_state="x")
    assert updated.tenant == "acme" == (await store.get("s0")).tenant


# --- mark_expired ---------------------------------------------------------------


async def _seed_for_expiry(store: Store) -> datetime:
    cutoff = T0 + timedelta(hours=1)
    old = T0
    for sid, status, last in [
        ("old-1", ACTIVE, old),
        ("old-2", ACTIVE, cutoff - timedelta(microseconds=1)),
        ("at-cutoff", ACTIVE, cutoff),
        ("fresh", ACTIVE, cutoff + timedelta(minutes=1)),
        ("ended", SessionStatus.ENDED, old),
        ("paused", SessionStatus.PAUSED, old),
        ("failed", SessionStatus.FAILED, old),
        ("already", EXPIRED, old),
    ]:
        await store.create(make(sid, status=status, last=last))
    return cutoff


async def test_mark_expired_moves_only_idle_active_sessions(store: Store) -> None:
    cutoff = await _seed_for_expiry(store)
    moved = await store.mark_expired(cutoff)
    assert sorted(moved) == ["old-1", "old-2"]
    statuses = {s.id: s.status for s in await store.list()}
    assert statuses == {
        "old-1": EXPIRED,
        "old-2": EXPIRED,
        "at-cutoff": ACTIVE,
        "fresh": ACTIVE,
        "ended": SessionStatus.ENDED,
        "paused": SessionStatus.PAUSED,
        "failed": SessionStatus.FAILED,
        "already": EXPIRED,
    }
    assert (await store.get("old-1")).last_active_at == T0  # only the status moves
    assert await store.mark_expired(cutoff) == []


async def test_mark_expired_respects_exclude(store: Store) -> None:
    cutoff = await _seed_for_expiry(store)
    assert await store.mark_expired(cutoff, exclude={"old-1", "missing"}) == ["old-2"]
    assert (await store.get("old-1")).status is ACTIVE
    assert await store.mark_expired(cutoff, exclude=["old-1"]) == []
    assert await store.mark_expired(cutoff) == ["old-1"]


async def test_mark_expired_with_thousands_excluded(store: Store) -> None:
    for i in range(60):
        await store.create(make(f"s{i:03}", last=T0))
    kept = {f"s{i:03}" for i in range(0, 60, 2)}
    exclude = list(kept) + [f"other-{i}" for i in range(5000)] + ["x'); DROP TABLE sessions;--"]
    moved = await store.mark_expired(T0 + timedelta(seconds=1), exclude=exclude)
    assert moved == sorted(f"s{i:03}" for i in range(1, 60, 2))
    assert await store.count(status=ACTIVE) == 30
    assert {s.id for s in await store.list(status=ACTIVE)} == kept


async def test_mark_expired_refuses_a_bare_string(store: Store) -> None:
    with pytest.raises(TypeError):
        await store.mark_expired(T0, exclude="s1")


# --- count --------------------------------------------------------------------


async def test_count_by_status(store: Store) -> None:
    assert await store.count(status=ACTIVE) == 0
    for i, status in enumerate([ACTIVE, ACTIVE, SessionStatus.ENDED, EXPIRED]):
        await store.create(make(f"s{i}", status=status))
    assert await store.count(status=ACTIVE) == 2
    assert await store.count(status=SessionStatus.ENDED) == 1
    assert await store.count(status=EXPIRED) == 1
    assert await store.count(status=SessionStatus.FAILED) == 0


# --- close --------------------------------------------------------------------


async def test_close_is_idempotent_and_later_calls_fail(store: Store) -> None:
    await store.create(make())
    await store.close()
    await store.close()
    calls = [
        store.create(make("s2")),
        store.get("s1"),
        store.update("s1", status=ACTIVE),
        store.delete("s1"),
        store.list(),
        store.mark_expired(T0),
        store.count(status=ACTIVE),
        store.create_turn(turn()),
        store.get_turn("s1", "t1"),
        store.list_turns("s1"),
        store.running_turns(),
        store.append_events("s1", "t1", [event(1)]),
        store.read_events("s1"),
        store.log_bounds("s1"),
        store.drop_events(T0),
    ]
    for call in calls:
        with pytest.raises(StoreError, match="store is closed"):
            await call


async def test_close_under_cancellation_still_closes(store: Store) -> None:
    with trio.CancelScope() as scope:
        scope.cancel()
        await store.close()
    with pytest.raises(StoreError, match="store is closed"):
        await store.get("s1")


async def test_concurrent_close_and_calls(store: Store) -> None:
    await store.create(make())
    outcomes: list[str] = []

    async def call() -> None:
        try:
            await store.get("s1")
            outcomes.append("ok")
        except StoreError as exc:
            assert exc.message == "store is closed"
            outcomes.append("closed")

    async with trio.open_nursery() as nursery:
        for _ in range(20):
            nursery.start_soon(call)
        nursery.start_soon(store.close)
        nursery.start_soon(store.close)
        for _ in range(20):
            nursery.start_soon(call)
    assert len(outcomes) == 40


# --- concurrency ----------------------------------------------------------------


async def test_concurrent_creates_all_land(store: Store) -> None:
    async with trio.open_nursery() as nursery:
        for i in range(200):
            nursery.start_soon(store.create, make(f"s{i:03}", last=T0 + timedelta(seconds=i)))
    assert await store.count(status=ACTIVE) == 200
    assert len(await store.list()) == 200


async def test_concurrent_duplicate_creates_admit_exactly_one(store: Store) -> None:
    wins: list[int] = []

    async def attempt(n: int) -> None:
        try:
            await store.create(make(agent=f"a{n}"))
            wins.append(n)
        except DuplicateSession:
            pass

    async with trio.open_nursery() as nursery:
        for n in range(30):
            nursery.start_soon(attempt, n)
    assert len(wins) == 1
    assert (await store.get("s1")).agent_name == f"a{wins[0]}"


async def test_concurrent_updates_lose_no_rows(store: Store) -> None:
    for i in range(20):
        await store.create(make(f"s{i:02}"))

    async def churn(sid: str, n: int) -> None:
        await store.update(sid, last_active_at=T0 + timedelta(seconds=n), adapter_state=str(n))

    async with trio.open_nursery() as nursery:
        for i in range(20):
            for n in range(10):
                nursery.start_soon(churn, f"s{i:02}", n)
        nursery.start_soon(store.mark_expired, T0 - timedelta(days=1))
    rows = await store.list()
    assert sorted(s.id for s in rows) == [f"s{i:02}" for i in range(20)]
    for row in rows:
        assert row.agent_name == "agent" and row.created_at == T0 and row.status is ACTIVE
        assert row.adapter_state is not None
        assert row.last_active_at == T0 + timedelta(seconds=int(row.adapter_state))


# --- turns ----------------------------------------------------------------------

RUNNING = TurnStatus.RUNNING
COMPLETED = TurnStatus.COMPLETED


def turn(
    tid: str = "t1",
    sid: str = "s1",
    *,
    created: datetime = T0,
    status: TurnStatus = RUNNING,
    text: str | None = None,
    **kw: object,
) -> TurnRecord:
    return TurnRecord(
        id=tid,
        session_id=sid,
        input=f"input of {tid} ✓" if text is None else text,
        status=status,
        created_at=created,
        **kw,  # type: ignore[arg-type]
    )


def event(seq: int, tid: str = "t1", raw: bytes | None = None) -> LoggedEvent:
    data = b'{"seq":%d,"type":"message","text":"hi"}' % seq if raw is None else raw
    return LoggedEvent(seq=seq, turn_id=tid, type="message", raw=data)


def events(first: int, last: int, tid: str = "t1") -> list[LoggedEvent]:
    return [event(seq, tid) for seq in range(first, last + 1)]


def done(at: datetime, status: TurnStatus = COMPLETED, reason: str = "completed") -> TurnEnd:
    return TurnEnd(status=status, reason=reason, ended_at=at)


async def seed(store: Store, sid: str = "s1", tid: str = "t1") -> None:
    """A session ``sid`` with one running turn ``tid``."""
    await store.create(make(sid))
    await store.create_turn(turn(tid, sid, created=T0))


async def then(store: Store, sid: str, tid: str, second: int) -> None:
    """The session's next running turn ``tid``, made ``second`` s after T0 (the last one ended)."""
    await store.create_turn(turn(tid, sid, created=T0 + timedelta(seconds=second)))


async def test_create_get_turn_round_trips(store: Store) -> None:
    await store.create(make(last=T0))
    record = turn(created=T0 + timedelta(minutes=1, microseconds=3))
    await store.create_turn(record)
    got = await store.get_turn("s1", "t1")
    assert got == record
    assert got.status is RUNNING and got.created_at.tzinfo is UTC
    assert got.first_seq is None and got.last_seq is None and got.started_at is None
    assert (await store.get("s1")).last_active_at == record.created_at


async def test_create_turn_needs_its_session_and_a_new_id(store: Store) -> None:
    with pytest.raises(SessionNotFound):
        await store.create_turn(turn())
    await seed(store, "s1")
    await store.create(make("s2"))
    for duplicate in (turn("t1", text="other"), turn("t1", "s2")):
        with pytest.raises(DuplicateTurn):
            await store.create_turn(duplicate)
    assert (await store.get_turn("s1", "t1")).input == "input of t1 ✓"
    assert await store.list_turns("s2") == []


async def test_create_turn_refuses_fields_the_store_keeps(store: Store) -> None:
    await store.create(make())
    bad = [
        turn(first_seq=1),
        turn(last_seq=3),
        turn(ended_at=T0),  # running, yet ended
        turn(status=COMPLETED),  # finished, yet no ended_at
        turn(created=datetime(2026, 1, 1)),  # naive
    ]
    for record in bad:
        with pytest.raises(ValueError):
            await store.create_turn(record)
    assert await store.list_turns("s1") == []
    with pytest.raises(ValueError, match="last_seq"):
        await store.create(make("s2", last_seq=4))


async def test_a_turn_created_finished_takes_no_events(store: Store) -> None:
    await store.create(make())
    record = turn(status=TurnStatus.FAILED, ended_at=T0, reason="adapter_crash", started_at=T0)
    await store.create_turn(record)
    assert await store.get_turn("s1", "t1") == record
    with pytest.raises(LogConflict):
        await store.append_events("s1", "t1", [event(1)])
    assert (await store.get("s1")).last_seq == 0


async def test_get_turn_only_within_its_session(store: Store) -> None:
    await seed(store, "s1")
    await store.create(make("s2"))
    for sid, tid in [("s2", "t1"), ("s1", "nope"), ("nope", "t1")]:
        with pytest.raises(TurnNotFound) as info:
            await store.get_turn(sid, tid)
        assert isinstance(info.value, NotFound) and info.value.reason == "not_found"


async def test_list_turns_oldest_first_with_filter_and_limit(store: Store) -> None:
    await store.create(make())
    await store.create(make("other"))
    created = {"b": 0, "a": 1, "c": 1, "d": 2, "e": 3}  # "a" and "c" tie: by id
    cancelled = TurnStatus.CANCELLED
    for tid in "cabde":  # not in their order; one running turn at a time: a and d end
        second = created[tid]
        status = cancelled if tid in "bc" else RUNNING
        ended = None if status is RUNNING else T0
        await store.create_turn(
            turn(tid, created=T0 + timedelta(seconds=second), status=status, ended_at=ended)
        )
        if tid in "ad":
            await store.append_events("s1", tid, [], end=done(T0))
    await store.create_turn(turn("x", "other"))
    ids = [t.id for t in await store.list_turns("s1")]
    assert ids == ["b", "a", "c", "d", "e"]
    assert [t.id for t in await store.list_turns("s1", status=RUNNING)] == ["e"]
    assert [t.id for t in await store.list_turns("s1", status=COMPLETED)] == ["a", "d"]
    assert [t.id for t in await store.list_turns("s1", status=cancelled)] == ["b", "c"]
    assert await store.list_turns("s1", status=TurnStatus.FAILED) == []
    assert [t.id for t in await store.list_turns("s1", limit=2)] == ["b", "a"]
    assert [t.id for t in await store.list_turns("s1", status=COMPLETED, limit=1)] == ["a"]
    assert await store.list_turns("s1", limit=0) == []
    with pytest.raises(ValueError, match="limit"):
        await store.list_turns("s1", limit=-1)
    with pytest.raises(SessionNotFound):
        await store.list_turns("nope")


async def test_running_turns_across_sessions(store: Store) -> None:
    assert await store.running_turns() == []
    await store.create(make("s1"))
    await store.create(make("s2"))
    await store.create_turn(turn("late", "s1", created=T0 + timedelta(seconds=5)))
    await store.create_turn(turn("gone", "s2", created=T0 + timedelta(seconds=1)))
    await store.append_events("s2", "gone", [], end=done(T0, TurnStatus.CANCELLED, "cancelled"))
    await store.create_turn(turn("early", "s2", created=T0))
    running = await store.running_turns()
    assert [(t.session_id, t.id) for t in running] == [("s2", "early"), ("s1", "late")]
    assert running[0] == await store.get_turn("s2", "early")


# --- the event log ----------------------------------------------------------------


async def test_append_keeps_seq_ranges_and_last_seq(store: Store) -> None:
    await seed(store)
    await store.append_events("s1", "t1", events(1, 3))
    await store.append_events("s1", "t1", events(4, 5))
    first = await store.get_turn("s1", "t1")
    assert (first.first_seq, first.last_seq) == (1, 5)
    await store.append_events("s1", "t1", [], end=done(T0 + timedelta(seconds=9)))
    await then(store, "s1", "t2", 1)
    await store.append_events("s1", "t2", events(6, 6, "t2"))
    second = await store.get_turn("s1", "t2")
    assert (second.first_seq, second.last_seq) == (6, 6)
    assert (await store.get_turn("s1", "t1")).last_seq == 5
    assert (await store.get("s1")).last_seq == 6
    (listed,) = await store.list()
    assert listed.last_seq == 6
    assert await store.log_bounds("s1") == LogBounds(earliest=1, last=6)
    updated = await store.update("s1", status=SessionStatus.PAUSED, adapter_state="x")
    assert updated.last_seq == 6


@pytest.mark.parametrize(
    "seqs",
    [[0], [2], [0, 1], [1, 3], [1, 1], [2, 1], [1, 2, 2], [1, 2, 4], [1, 2, 3, 2]],
    ids=str,
)
async def test_a_batch_must_run_on_from_the_log(store: Store, seqs: list[int]) -> None:
    await seed(store)
    with pytest.raises(LogConflict, match=r"expected event seq \d+, got \d+ \(the log ends at 0"):
        await store.append_events("s1", "t1", [event(n) for n in seqs], started_at=T0)
    await _assert_untouched(store)
    await store.append_events("s1", "t1", events(1, 3))
    moved = [n + 3 for n in seqs]
    with pytest.raises(LogConflict, match=r"expected event seq \d+, got \d+ \(the log ends at 3"):
        await store.append_events("s1", "t1", [event(n) for n in moved])
    assert [e.seq for e in await store.read_events("s1")] == [1, 2, 3]
    assert (await store.get("s1")).last_seq == 3


async def test_a_turn_batch_is_trusted_only_for_its_own_turn_and_where_it_runs_on(
    store: Store,
) -> None:
    """A ``TurnBatch`` (what a turn's log writer numbered) is not walked event by event,
    but its first seq must still continue the log, and one of another turn is
    checked like any other sequence."""
    await seed(store)
    mine = TurnBatch("t1", events(1, 3))
    await store.append_events("s1", "t1", mine, started_at=T0)
    mine.append(event(4))  # the store took a copy
    with pytest.raises(LogConflict, match=r"expected event seq 4, got 5 \(the log ends at 3"):
        await store.append_events("s1", "t1", TurnBatch("t1", events(5, 6)))
    with pytest.raises(LogConflict, match=r"expected event seq 4, got 3"):
        await store.append_events("s1", "t1", TurnBatch("t1", events(3, 4)))
    with pytest.raises(ValueError, match="must be of this turn"):
        await store.append_events("s1", "t1", TurnBatch("t2", events(4, 5, "t2")))
    await store.append_events("s1", "t1", TurnBatch("t1", events(4, 5)))
    assert [e.seq for e in await store.read_events("s1")] == [1, 2, 3, 4, 5]
    assert (await store.get("s1")).last_seq == 5


async def _assert_untouched(store: Store, sid: str = "s1", tid: str = "t1") -> None:
    """Nothing was ever logged for ``tid`` of ``sid``, and it is still running."""
    assert await store.read_events(sid) == []
    assert (await store.get(sid)).last_seq == 0
    record = await store.get_turn(sid, tid)
    assert record.status is RUNNING and record.started_at is None and record.ended_at is None
    assert record.first_seq is None and record.last_seq is None
    assert (await store.get(sid)).last_active_at == T0
    assert await store.log_bounds(sid) == LogBounds(earliest=1, last=0)


async def test_seqs_are_per_session(store: Store) -> None:
    await seed(store, "s1")
    await store.create(make("s2"))
    await store.create_turn(turn("t2", "s2"))
    await store.append_events("s1", "t1", events(1, 4))
    await store.append_events("s2", "t2", events(1, 2, "t2"))
    with pytest.raises(LogConflict):
        await store.append_events("s2", "t2", events(5, 5, "t2"))
    assert [e.seq for e in await store.read_events("s2")] == [1, 2]
    assert (await store.get("s1")).last_seq == 4


async def test_events_are_checked_before_anything_else(store: Store) -> None:
    await seed(store)
    bad_batches: list[list[LoggedEvent]] = [
        [event(1), event(2, "t2")],  # another turn's event
        [event(1), LoggedEvent(2, "t1", "message", "text, not bytes")],  # type: ignore[arg-type]
        [LoggedEvent(1, "t1", "message", bytearray(b"{}"))],  # type: ignore[arg-type]
        [LoggedEvent(1.0, "t1", "message", b"{}")],  # type: ignore[arg-type]
        [LoggedEvent(1, "t1", 7, b"{}")],  # type: ignore[arg-type]
    ]
    for batch in bad_batches:
        with pytest.raises(ValueError):
            await store.append_events("s1", "t1", batch)
    with pytest.raises(ValueError, match="cannot end as running"):
        await store.append_events("s1", "t1", [event(1)], end=done(T0, RUNNING))
    for naive in ({"started_at": datetime(2026, 1, 1)}, {"end": done(datetime(2026, 1, 1))}):
        with pytest.raises(ValueError, match="timezone-aware"):
            await store.append_events("s1", "t1", [event(1)], **naive)
    await _assert_untouched(store)


async def test_append_needs_the_session_and_its_own_turn(store: Store) -> None:
    await seed(store, "s1")
    await store.create(make("s2"))
    with pytest.raises(SessionNotFound):
        await store.append_events("nope", "t1", [event(1)])
    with pytest.raises(TurnNotFound):
        await store.append_events("s1", "nope", [event(1, "nope")])
    with pytest.raises(TurnNotFound):  # t1 is s1's
        await store.append_events("s2", "t1", [event(1)])
    await _assert_untouched(store)
    assert (await store.get("s2")).last_seq == 0


@pytest.mark.parametrize(
    "bad",
    [
        LoggedEvent(2, "t2", "message", b"{}"),  # another turn's
        LoggedEvent("2", "t1", "message", b"{}"),  # type: ignore[arg-type]  # a str seq
        LoggedEvent(2, "t1", 7, b"{}"),  # type: ignore[arg-type]  # an int type
        LoggedEvent(2, "t1", "message", "{}"),  # type: ignore[arg-type]  # a str raw
    ],
    ids=["turn", "seq", "type", "raw"],
)
async def test_a_batch_with_one_wrong_event_is_refused_whole(
    store: Store, bad: LoggedEvent
) -> None:
    await seed(store)
    with pytest.raises(ValueError, match=r"event '?2'? must be of this turn"):
        await store.append_events("s1", "t1", [event(1), bad, event(3)])
    await _assert_untouched(store)


async def test_started_at_is_set_once(store: Store) -> None:
    await seed(store)
    await store.append_events("s1", "t1", [])
    assert (await store.get_turn("s1", "t1")).started_at is None
    start = T0 + timedelta(seconds=1, microseconds=1)
    await store.append_events("s1", "t1", events(1, 2), started_at=start)
    await store.append_events("s1", "t1", events(3, 3), started_at=start + timedelta(hours=1))
    await store.append_events("s1", "t1", events(4, 4))
    record = await store.get_turn("s1", "t1")
    assert record.started_at == start and record.status is RUNNING
    assert (record.first_seq, record.last_seq) == (1, 4)


@pytest.mark.parametrize("status", [s for s in TurnStatus if s.finished])
async def test_end_finishes_the_turn_and_touches_the_session(
    store: Store, status: TurnStatus
) -> None:
    await seed(store)
    ended = T0 + timedelta(minutes=3, microseconds=5)
    await store.append_events(
        "s1", "t1", events(1, 2), started_at=T0, end=done(ended, status, "why")
    )
    record = await store.get_turn("s1", "t1")
    assert record.status is status and record.reason == "why" and record.ended_at == ended
    assert (record.first_seq, record.last_seq, record.started_at) == (1, 2, T0)
    session = await store.get("s1")
    assert session.last_active_at == ended and session.last_seq == 2
    assert await store.running_turns() == []
    later = [
        ([event(3)], None),
        ([], None),
        ([], done(ended + timedelta(seconds=1), TurnStatus.FAILED, "again")),
        ([event(3)], done(ended)),
    ]
    for batch, end in later:
        with pytest.raises(LogConflict, match="already ended"):
            await store.append_events("s1", "t1", batch, end=end)
    assert await store.get_turn("s1", "t1") == record
    assert await store.get("s1") == session
    assert [e.seq for e in await store.read_events("s1")] == [1, 2]


async def test_empty_batch_with_end(store: Store) -> None:
    await seed(store)
    ended = T0 + timedelta(seconds=30)
    await store.append_events(
        "s1", "t1", [], end=done(ended, TurnStatus.INTERRUPTED, "server_restart")
    )
    record = await store.get_turn("s1", "t1")
    assert record.status is TurnStatus.INTERRUPTED and record.reason == "server_restart"
    assert record.first_seq is None and record.last_seq is None and record.ended_at == ended
    session = await store.get("s1")
    assert session.last_seq == 0 and session.last_active_at == ended


async def test_the_batch_is_the_callers_no_more(store: Store) -> None:
    await seed(store)
    batch = events(1, 2)
    await store.append_events("s1", "t1", batch)
    batch.append(event(3))
    batch[0] = event(1, raw=b"changed")
    got = await store.read_events("s1")
    assert [e.seq for e in got] == [1, 2] and got[0] == event(1)
    got.clear()
    assert len(await store.read_events("s1")) == 2


async def test_create_turn_sets_last_active_at(store: Store) -> None:
    await store.create(make(last=T0))
    later = T0 + timedelta(hours=2)
    await store.create_turn(turn(created=later))
    assert (await store.get("s1")).last_active_at == later


# --- read_events / log_bounds --------------------------------------------------


async def _two_turn_log(store: Store) -> None:
    """Session s1: turn a holds seqs 1..4 (ended), turn b 5..10 (running); s2 has its own."""
    await seed(store, "s1", "a")
    await store.append_events("s1", "a", events(1, 4, "a"), end=done(T0))
    await then(store, "s1", "b", 1)
    await store.append_events("s1", "b", events(5, 10, "b"))
    await seed(store, "s2", "c")
    await store.append_events("s2", "c", events(1, 3, "c"))


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, list(range(1, 11))),
        ({"after": 3}, list(range(4, 11))),
        ({"after": 10}, []),
        ({"after": 99}, []),
        ({"after": -5}, list(range(1, 11))),
        ({"before": 6}, [1, 2, 3, 4, 5]),
        ({"before": 1}, []),
        ({"after": 3, "before": 6}, [4, 5]),
        ({"after": 6, "before": 6}, []),
        ({"limit": 3}, [1, 2, 3]),
        ({"limit": 0}, []),
        ({"after": 8, "limit": 5}, [9, 10]),
        ({"turn_id": "a"}, [1, 2, 3, 4]),
        ({"turn_id": "b"}, [5, 6, 7, 8, 9, 10]),
        ({"turn_id": "b", "after": 2}, [5, 6, 7, 8, 9, 10]),
        ({"turn_id": "b", "after": 7, "limit": 2}, [8, 9]),
        ({"turn_id": "b", "before": 7}, [5, 6]),
        ({"turn_id": "a", "after": 4}, []),
        ({"turn_id": "c"}, []),  # s2's turn
        ({"turn_id": "nope"}, []),
        ({"before": 2**70, "after": -(2**70)}, list(range(1, 11))),
    ],
    ids=str,
)
async def test_read_events_windows(
    store: Store, kwargs: dict[str, object], expected: list[int]
) -> None:
    await _two_turn_log(store)
    got = await store.read_events("s1", **kwargs)  # type: ignore[arg-type]
    assert [e.seq for e in got] == expected
    for e in got:
        assert e == event(e.seq, "a" if e.seq <= 4 else "b")


async def test_read_events_max_bytes_stops_at_the_event_that_reaches_it(store: Store) -> None:
    await seed(store)
    sizes = [10, 20, 30, 5000, 5]
    await store.append_events(
        "s1", "t1", [LoggedEvent(i + 1, "t1", "message", b"x" * n) for i, n in enumerate(sizes)]
    )
    got = await store.read_events("s1", max_bytes=30)
    assert [e.seq for e in got] == [1, 2]  # 10 + 20 reaches 30
    assert [e.seq for e in await store.read_events("s1", max_bytes=31)] == [1, 2, 3]
    # However large, the first event comes alone rather than not at all.
    assert [e.seq for e in await store.read_events("s1", after=3, max_bytes=1)] == [4]
    got = await store.read_events("s1", after=1, max_bytes=10**6, limit=2)
    assert [e.seq for e in got] == [2, 3]
    assert [e.seq for e in await store.read_events("s1", turn_id="t1", max_bytes=35)] == [1, 2, 3]
    with pytest.raises(ValueError, match="max_bytes"):
        await store.read_events("s1", max_bytes=0)


async def test_read_events_refuses_bad_calls(store: Store) -> None:
    await _two_turn_log(store)
    with pytest.raises(ValueError, match="limit"):
        await store.read_events("s1", limit=-1)
    with pytest.raises(SessionNotFound):
        await store.read_events("nope")
    with pytest.raises(SessionNotFound):
        await store.log_bounds("nope")
    assert [e.seq for e in await store.read_events("s2")] == [1, 2, 3]


async def test_raw_bytes_round_trip_exactly(store: Store) -> None:
    await seed(store)
    raws = [
        b'{"seq":1,"text":"caf\xc3\xa9 \xe2\x9c\x93"}',
        b"\xff\xfe\x00 not UTF-8 \x80\x81\x00",
        b"",
        bytes(range(256)),
        b'{"seq":5,"blob":"' + b"x" * (8 * 1024 * 1024 - 20) + b'"}',  # ~8 MiB
    ]
    batch = [
        LoggedEvent(seq=n, turn_id="t1", type=kind, raw=raw)
        for n, (kind, raw) in enumerate(zip(["a", "b", "", "ü", "big"], raws, strict=True), 1)
    ]
    await store.append_events("s1", "t1", batch)
    got = await store.read_events("s1")
    assert got == batch
    assert all(type(e.raw) is bytes for e in got)
    assert len(got[4].raw) == len(raws[4])
    (big,) = await store.read_events("s1", after=4, turn_id="t1")
    assert big.raw == raws[4]


async def test_log_bounds(store: Store) -> None:
    await seed(store, "s1", "a")
    assert await store.log_bounds("s1") == LogBounds(earliest=1, last=0)
    await store.append_events("s1", "a", events(1, 4, "a"), end=done(T0))
    assert await store.log_bounds("s1") == LogBounds(earliest=1, last=4)
    await then(store, "s1", "b", 1)
    await store.append_events("s1", "b", events(5, 7, "b"), end=done(T0 + timedelta(hours=1)))
    assert await store.drop_events(T0 + timedelta(seconds=1)) == 4
    assert await store.log_bounds("s1") == LogBounds(earliest=5, last=7)
    assert await store.drop_events(T0 + timedelta(days=1)) == 3
    assert await store.log_bounds("s1") == LogBounds(earliest=8, last=7)
    assert await store.read_events("s1") == []


# --- drop_events --------------------------------------------------------------------


async def test_drop_events_only_of_turns_ended_before_the_cutoff(store: Store) -> None:
    cutoff = T0 + timedelta(hours=1)
    await seed(store, "s1", "old")
    await store.append_events("s1", "old", events(1, 3, "old"), end=done(T0))
    await then(store, "s1", "at-cutoff", 1)
    await store.append_events("s1", "at-cutoff", events(4, 5, "at-cutoff"), end=done(cutoff))
    await then(store, "s1", "running", 2)
    await store.append_events("s1", "running", events(6, 8, "running"), started_at=T0)
    before_cutoff = cutoff - timedelta(microseconds=1)
    await seed(store, "s2", "old2")
    await store.append_events("s2", "old2", events(1, 2, "old2"), end=done(before_cutoff))
    await then(store, "s2", "new2", 1)
    await store.append_events("s2", "new2", events(3, 3, "new2"), end=done(cutoff + DAY))
    records = {t.id: t for sid in ("s1", "s2") for t in await store.list_turns(sid)}

    assert await store.drop_events(cutoff) == 5
    assert [e.seq for e in await store.read_events("s1")] == [4, 5, 6, 7, 8]
    assert [e.seq for e in await store.read_events("s2")] == [3]
    assert await store.read_events("s1", turn_id="old") == []
    # the turn records stay as they were, with their seq ranges; so do the seqs
    assert {t.id: t for sid in ("s1", "s2") for t in await store.list_turns(sid)} == records
    assert (await store.get("s1")).last_seq == 8 and (await store.get("s2")).last_seq == 3
    assert await store.drop_events(cutoff) == 0

    # a running turn's events are never dropped, however old the cutoff
    assert await store.drop_events(cutoff + 1000 * DAY) == 3
    assert [e.seq for e in await store.read_events("s1")] == [6, 7, 8]
    await store.append_events("s1", "running", events(9, 9, "running"))
    with pytest.raises(LogConflict):  # a dropped seq is never reused
        await store.append_events("s1", "running", events(1, 1, "running"))
    assert await store.log_bounds("s1") == LogBounds(earliest=6, last=9)
    with pytest.raises(ValueError, match="timezone-aware"):
        await store.drop_events(datetime(2026, 1, 1))


DAY = timedelta(days=1)


async def test_drop_events_of_a_turn_ended_later(store: Store) -> None:
    await seed(store)
    await store.append_events("s1", "t1", events(1, 2))
    assert await store.drop_events(T0 + DAY) == 0
    await store.append_events("s1", "t1", events(3, 3), end=done(T0))
    assert await store.drop_events(T0 + DAY) == 3
    assert await store.log_bounds("s1") == LogBounds(earliest=4, last=3)


async def test_delete_takes_the_turns_and_log_along(store: Store) -> None:
    await _two_turn_log(store)
    await store.delete("s1")
    with pytest.raises(SessionNotFound):
        await store.read_events("s1")
    with pytest.raises(TurnNotFound):
        await store.get_turn("s1", "a")
    assert [t.id for t in await store.running_turns()] == ["c"]
    assert await store.drop_events(T0 + DAY) == 0  # turn a's events went with the session
    # the ids are free again, and the new session's log starts afresh
    await store.create(make("s1"))
    await store.create_turn(turn("a"))
    await store.append_events("s1", "a", events(1, 1, "a"))
    assert (await store.get("s1")).last_seq == 1
    assert [e.seq for e in await store.read_events("s1")] == [1]
    assert [e.seq for e in await store.read_events("s2")] == [1, 2, 3]


async def test_cancelled_append_changes_nothing(store: Store) -> None:
    await seed(store)
    with trio.CancelScope() as scope:
        scope.cancel()
        await store.append_events("s1", "t1", events(1, 3), started_at=T0, end=done(T0))
    assert scope.cancelled_caught
    await _assert_untouched(store)


async def test_concurrent_appends_keep_each_log_contiguous(store: Store) -> None:
    sessions = [f"s{i:02}" for i in range(12)]
    goal = 120
    conflicts = 0
    for sid in sessions:
        await seed(store, sid, f"{sid}-t")

    async def writer(sid: str, size: int) -> None:
        """Append batches at whatever the log's end is, racing the session's other writers."""
        nonlocal conflicts
        while True:
            last = (await store.log_bounds(sid)).last
            if last >= goal:
                return
            batch = [
                LoggedEvent(n, f"{sid}-t", "message", f"{sid}:{n}".encode())
                for n in range(last + 1, min(goal, last + size) + 1)
            ]
            await trio.lowlevel.checkpoint()  # others may write meanwhile (memory: only here)
            try:
                await store.append_events(sid, f"{sid}-t", batch)
            except LogConflict:
                conflicts += 1

    async with trio.open_nursery() as nursery:
        for sid in sessions:
            for size in (1, 3, 7):
                nursery.start_soon(writer, sid, size)
    for sid in sessions:
        log = await store.read_events(sid)
        assert [e.seq for e in log] == list(range(1, goal + 1))
        assert [e.raw for e in log] == [f"{sid}:{n}".encode() for n in range(1, goal + 1)]
        record = await store.get_turn(sid, f"{sid}-t")
        assert (record.first_seq, record.last_seq) == (1, goal)
        assert (await store.get(sid)).last_seq == goal
    assert conflicts > 0  # the writers did race


# --- single flight, caps and leases ---------------------------------------------------


async def test_a_session_runs_one_turn_at_a_time(store: Store) -> None:
    await seed(store)
    with pytest.raises(SessionBusy, match="s1"):
        await store.create_turn(turn("t2", created=T0 + timedelta(seconds=1)))
    with pytest.raises(TurnNotFound):  # nothing of it was stored
        await store.get_turn("s1", "t2")
    with pytest.raises(DuplicateTurn):  # an id that exists is that, busy or not
        await store.create_turn(turn("t1"))
    finished = turn("done", created=T0 + timedelta(seconds=2), status=COMPLETED, ended_at=T0)
    await store.create_turn(finished)  # a finished turn is no flight
    await seed(store, "s2", "u1")  # nor does another session's turn count
    await store.append_events("s1", "t1", [], end=done(T0))
    await store.create_turn(turn("t2", created=T0 + timedelta(seconds=3)))
    running = {(t.session_id, t.id) for t in await store.running_turns()}
    assert running == {("s1", "t2"), ("s2", "u1")}


async def test_max_running_caps_the_running_turns_of_all_sessions(store: Store) -> None:
    for sid in ("s1", "s2", "s3"):
        await store.create(make(sid))
    await store.create_turn(turn("a", "s1"), max_running=2)
    await store.create_turn(turn("b", "s2"), max_running=2)
    with pytest.raises(TurnCapReached, match="max 2"):
        await store.create_turn(turn("c", "s3"), max_running=2)
    with pytest.raises(TurnNotFound):
        await store.get_turn("s3", "c")
    with pytest.raises(SessionBusy):  # busy before capped
        await store.create_turn(turn("a2", "s1"), max_running=2)
    await store.create_turn(turn("c", "s3"), max_running=3)  # another cap, another answer
    finished = turn("f", "s3", status=COMPLETED, ended_at=T0)
    await store.create_turn(finished, max_running=1)  # only running turns are capped
    await store.append_events("s1", "a", [], end=done(T0))
    await store.create_turn(turn("a2", "s1"), max_running=3)
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="max_running"):
            await store.create_turn(turn("x", "s1"), max_running=bad)  # type: ignore[arg-type]


async def test_max_active_caps_the_active_sessions(store: Store) -> None:
    await store.create(make("a"), max_active=2)
    await store.create(make("b"), max_active=2)
    with pytest.raises(SessionCapReached, match="max 2"):
        await store.create(make("c"), max_active=2)
    with pytest.raises(SessionNotFound):
        await store.get("c")
    with pytest.raises(DuplicateSession):  # an id that exists is that, capped or not
        await store.create(make("a"), max_active=2)
    await store.create(make("p", status=SessionStatus.PAUSED), max_active=1)  # not active
    await store.update("a", status=SessionStatus.ENDED)
    await store.create(make("c"), max_active=2)
    assert await store.count(status=ACTIVE) == 2
    with pytest.raises(ValueError, match="max_active"):
        await store.create(make("d"), max_active=0)


async def test_max_active_per_tenant_caps_each_tenants_active_sessions(store: Store) -> None:
    cap = partial(store.create, max_active_per_tenant=2, max_active=4)
    await cap(make("a1", tenant="acme"))
    await cap(make("a2", tenant="acme"))
    with pytest.raises(TenantSessionCapReached, match=r"tenant acme .*max 2"):
        await cap(make("a3", tenant="acme"))
    with pytest.raises(SessionNotFound):
        await store.get("a3")
    await cap(make("b1", tenant="bolt"))  # another tenant's own count
    await cap(make("n1"))  # no tenant: only the global cap
    with pytest.raises(TenantSessionCapReached):  # the tenant's cap is checked first
        await cap(make("a3", tenant="acme"))
    with pytest.raises(SessionCapReached):  # 4 active: the global cap
        await cap(make("b2", tenant="bolt"))
    await store.update("a1", status=SessionStatus.ENDED)
    await cap(make("a3", tenant="acme"))  # ended sessions do not count
    await store.create(make("a4", tenant="acme"))  # no cap asked, none applied
    with pytest.raises(ValueError, match="max_active_per_tenant"):
        await store.create(make("a5", tenant="acme"), max_active_per_tenant=0)


async def test_max_running_per_tenant_caps_each_tenants_running_turns(store: Store) -> None:
    for sid, tenant in (("a1", "acme"), ("a2", "acme"), ("a3", "acme"), ("b1", "bolt")):
        await store.create(make(sid, tenant=tenant))
    await store.create(make("n1"))
    cap = partial(store.create_turn, max_running_per_tenant=2, max_running=4)
    await cap(turn("t1", "a1"))
    await cap(turn("t2", "a2"))
    with pytest.raises(SessionBusy):  # busy before capped
        await cap(turn("t1b", "a1"))
    with pytest.raises(TenantTurnCapReached, match=r"tenant acme .*max 2"):
        await cap(turn("t3", "a3"))
    with pytest.raises(TurnNotFound):
        await store.get_turn("a3", "t3")
    await cap(turn("u1", "b1"))  # another tenant's own count
    await cap(turn("v1", "n1"))  # no tenant: only the global cap
    await store.append_events("a1", "t1", [], end=done(T0))
    await cap(turn("t3", "a3"))  # a finished turn does not count
    with pytest.raises(TurnCapReached):  # 4 run now: the global cap after the tenant's
        await cap(turn("t1c", "a1"), max_running_per_tenant=3)
    with pytest.raises(ValueError, match="max_running_per_tenant"):
        await store.create_turn(turn("x", "a1"), max_running_per_tenant=-1)


async def test_racing_creates_leave_exactly_the_cap(store: Store) -> None:
    won: list[str] = []

    async def create(sid: str) -> None:
        with contextlib.suppress(SessionCapReached):
            await store.create(make(sid), max_active=7)
            won.append(sid)

    async def start(sid: str) -> None:
        with contextlib.suppress(TurnCapReached):
            await store.create_turn(turn(f"t-{sid}", sid), max_running=3)
            won.append(f"t-{sid}")

    async with trio.open_nursery() as nursery:
        for i in range(20):
            nursery.start_soon(create, f"s{i:02}")
    assert len(won) == 7 and await store.count(status=ACTIVE) == 7
    sessions = [s.id for s in await store.list()]
    async with trio.open_nursery() as nursery:
        for sid in sessions:
            nursery.start_soon(start, sid)
    assert len(await store.running_turns()) == 3 == len(won) - 7


async def test_leases_are_renewed_by_their_owner_only(store: Store) -> None:
    for sid in ("s1", "s2", "s3", "s4"):
        await store.create(make(sid))
    lease = T0 + timedelta(seconds=10)
    await store.create_turn(turn("mine", "s1", owner="p1", lease_expires_at=lease))
    await store.create_turn(
        turn("theirs", "s2", created=T0 + timedelta(seconds=1), owner="p2", lease_expires_at=lease)
    )
    await store.create_turn(turn("forever", "s3", owner="p2"))  # no lease: never lapses
    await store.create_turn(
        turn("ended", "s4", owner="p1", lease_expires_at=lease, status=COMPLETED, ended_at=T0)
    )
    got = await store.get_turn("s1", "mine")
    assert (got.owner, got.lease_expires_at) == ("p1", lease)
    assert got.lease_expires_at is not None and got.lease_expires_at.tzinfo is UTC

    later = T0 + timedelta(seconds=30)
    assert await store.renew_leases("p1", later) == 1  # running turns of p1 only
    assert (await store.get_turn("s1", "mine")).lease_expires_at == later
    assert (await store.get_turn("s2", "theirs")).lease_expires_at == lease
    assert (await store.get_turn("s3", "forever")).lease_expires_at is None
    assert (await store.get_turn("s4", "ended")).lease_expires_at == lease
    assert await store.renew_leases("nobody", later) == 0
    with pytest.raises(ValueError, match="timezone-aware"):
        await store.renew_leases("p1", datetime(2026, 1, 1))


@pytest.fixture
async def two_stores(backend: str, backend_url: str) -> AsyncIterator[tuple[Store, Store]]:
    """Two stores on one database: what two server processes sharing it see (its tests are
    marked ``backends(*DURABLE)``: two memory stores share nothing)."""
    if backend not in DURABLE:
        pytest.fail("a test of two_stores is marked @pytest.mark.backends(*DURABLE)")
    first, second = await open_store(backend_url), await open_store(backend_url)
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()


@pytest.mark.backends(*DURABLE)
async def test_two_processes_racing_get_exactly_the_caps(two_stores: tuple[Store, Store]) -> None:
    first, second = two_stores
    outcomes: list[str] = []

    async def attempt(call: Callable[[], Awaitable[None]]) -> None:
        try:
            await call()
            outcomes.append("ok")
        except (SessionCapReached, TurnCapReached, SessionBusy) as exc:
            outcomes.append(exc.reason)

    async with trio.open_nursery() as nursery:
        for i in range(24):
            store = (first, second)[i % 2]
            nursery.start_soon(attempt, partial(store.create, make(f"s{i:02}"), max_active=9))
    assert sorted(outcomes) == ["ok"] * 9 + ["session_cap"] * 15
    assert await second.count(status=ACTIVE) == 9
    sessions = [s.id for s in await first.list()]

    outcomes.clear()  # every session twice, once from each store: one turn each, 4 in all
    async with trio.open_nursery() as nursery:
        for sid in sessions:
            for n, store in enumerate((first, second)):
                record = turn(f"{sid}-{n}", sid)
                nursery.start_soon(attempt, partial(store.create_turn, record, max_running=4))
    assert outcomes.count("ok") == 4
    assert outcomes.count("ok") + outcomes.count("turn_cap") + outcomes.count("session_busy") == 18
    running = await first.running_turns()
    assert len(running) == 4 and len({t.session_id for t in running}) == 4

    outcomes.clear()  # single flight alone, no cap: one turn per session, whoever asks
    await first.create(make("solo"))
    async with trio.open_nursery() as nursery:
        for n in range(6):
            store = (first, second)[n % 2]
            nursery.start_soon(attempt, partial(store.create_turn, turn(f"solo-{n}", "solo")))
    assert sorted(outcomes) == ["ok"] + ["session_busy"] * 5
    assert len(await second.list_turns("solo", status=RUNNING)) == 1


# --- idempotency keys -----------------------------------------------------------


def claim(
    key: str = "k1",
    *,
    tenant: str | None = None,
    request: str = "create",
    at: datetime = T0,
    lasts: timedelta = timedelta(hours=24),
) -> IdempotencyClaim:
    return IdempotencyClaim(tenant, key, f"fingerprint of {request}", at, at + lasts)


async def test_a_key_is_bound_with_its_session_and_answers_it(store: Store) -> None:
    first = claim(at=utcnow())
    await store.create(make("s1"), idempotency=first)
    assert await store.find_key(None, "k1") == IdempotencyRecord(first, session_id="s1")
    with pytest.raises(IdempotencyKeyBound) as bound:  # a repeat: nothing stored
        await store.create(make("s2"), idempotency=claim(request="create again", at=utcnow()))
    assert bound.value.record == IdempotencyRecord(first, session_id="s1")
    with pytest.raises(SessionNotFound):
        await store.get("s2")
    assert await store.find_key(None, "k2") is None
    assert await store.find_key("acme", "k1") is None  # another tenant's key is another key
    await store.create(make("s3", tenant="acme"), idempotency=claim(tenant="acme", at=utcnow()))
    found = await store.find_key("acme", "k1")
    assert found is not None and (found.session_id, found.claim.tenant) == ("s3", "acme")


async def test_a_key_is_bound_with_its_turn_before_single_flight_is_checked(
    store: Store,
) -> None:
    await store.create(make("s1"))
    first = claim("turn-key", at=utcnow())
    await store.create_turn(turn("t1", "s1"), idempotency=first)
    record = IdempotencyRecord(first, session_id="s1", turn_id="t1")
    assert await store.find_key(None, "turn-key") == record
    with pytest.raises(IdempotencyKeyBound) as bound:  # not SessionBusy: the key comes first
        await store.create_turn(turn("t2", "s1"), idempotency=claim("turn-key", at=utcnow()))
    assert bound.value.record == record
    with pytest.raises(TurnNotFound):
        await store.get_turn("s1", "t2")
    with pytest.raises(SessionBusy):  # a refusal binds nothing
        await store.create_turn(turn("t3", "s1"), idempotency=claim("other", at=utcnow()))
    assert await store.find_key(None, "other") is None


async def test_a_refused_create_binds_nothing(store: Store) -> None:
    await store.create(make("s1"))
    with pytest.raises(SessionCapReached):
        await store.create(make("s2"), max_active=1, idempotency=claim(at=utcnow()))
    assert await store.find_key(None, "k1") is None
    with pytest.raises(DuplicateSession):
        await store.create(make("s1"), idempotency=claim(at=utcnow()))
    assert await store.find_key(None, "k1") is None


async def test_a_remembered_refusal_binds_the_key(store: Store) -> None:
    refused = claim(at=utcnow())
    await store.remember_refusal(refused, "session_busy", "session s1 already has a turn")
    expected = IdempotencyRecord(
        refused, refusal="session_busy", message="session s1 already has a turn"
    )
    assert await store.find_key(None, "k1") == expected
    with pytest.raises(IdempotencyKeyBound) as bound:
        await store.remember_refusal(claim(at=utcnow()), "turn_cap", "too many")
    assert bound.value.record == expected
    with pytest.raises(IdempotencyKeyBound):
        await store.create(make("s1"), idempotency=claim(at=utcnow()))
    with pytest.raises(SessionNotFound):
        await store.get("s1")


async def test_an_expired_key_is_a_new_one_and_is_purged(store: Store) -> None:
    old = claim("old", at=T0, lasts=timedelta(hours=1))
    await store.create(make("s1"), idempotency=old)
    assert await store.find_key(None, "old") is None  # T0 + 1 h is long past
    await store.create(make("s2"), idempotency=claim("kept", at=T0, lasts=timedelta(hours=2)))
    # a claim made as the old one expires is a new request: it replaces the record
    fresh = claim("old", at=T0 + timedelta(hours=1), lasts=timedelta(days=36500))
    await store.create(make("s3"), idempotency=fresh)
    assert await store.find_key(None, "old") == IdempotencyRecord(fresh, session_id="s3")
    await store.create(make("s4"), idempotency=claim("gone", at=T0, lasts=timedelta(hours=1)))
    assert await store.purge_keys(T0 + timedelta(minutes=59)) == 0
    assert await store.purge_keys(T0 + timedelta(hours=1)) == 1  # "gone" (expired at 1 h)
    assert await store.purge_keys(T0 + timedelta(hours=3)) == 1  # "kept"
    assert await store.purge_keys(T0 + timedelta(hours=3)) == 0
    assert (await store.find_key(None, "old")) is not None  # the fresh one stays
    with pytest.raises(IdempotencyKeyBound):  # and binds: the old claim's time is past
        await store.create(make("s5"), idempotency=claim("old", at=T0 + timedelta(hours=2)))


async def test_a_bad_claim_changes_nothing(store: Store) -> None:
    bad = [
        claim(""),
        claim("x" * 256),
        claim("nul\x00"),
        claim(tenant=""),
        claim(lasts=timedelta(0)),
        IdempotencyClaim(None, "k1", "", T0, T0 + timedelta(hours=1)),
        IdempotencyClaim(None, "k1", "f", datetime(2026, 1, 1), datetime(2026, 1, 2)),
    ]
    for wrong in bad:
        with pytest.raises(ValueError):
            await store.create(make("s1"), idempotency=wrong)
        with pytest.raises(ValueError):
            await store.remember_refusal(wrong, "turn_cap", "too many")
    assert await store.count(status=ACTIVE) == 0
    with pytest.raises(ValueError):
        await store.find_key(None, "")
    with pytest.raises(ValueError, match="timezone-aware"):
        await store.purge_keys(datetime(2026, 1, 1))


@pytest.mark.backends(*DURABLE)
async def test_racing_claims_of_one_key_make_one_session_and_one_turn(
    two_stores: tuple[Store, Store],
) -> None:
    """Twelve creates with one key, from two processes at once: one session, the same
    record for all; likewise twelve turns."""
    first, second = two_stores
    won: list[str] = []
    answers: list[IdempotencyRecord] = []

    async def attempt(call: Callable[[], Awaitable[None]], what: str) -> None:
        try:
            await call()
            won.append(what)
        except IdempotencyKeyBound as exc:
            answers.append(exc.record)

    async with trio.open_nursery() as nursery:
        for i in range(12):
            store = (first, second)[i % 2]
            create = partial(store.create, make(f"s{i:02}"), idempotency=claim(at=utcnow()))
            nursery.start_soon(attempt, create, f"s{i:02}")
    assert len(won) == 1 and await first.count(status=ACTIVE) == 1
    assert {a.session_id for a in answers} == set(won) and len(answers) == 11

    won.clear()
    answers.clear()
    session = (await first.list())[0].id
    async with trio.open_nursery() as nursery:
        for i in range(12):
            store = (first, second)[i % 2]
            record = turn(f"t{i:02}", session)
            start = partial(store.create_turn, record, idempotency=claim("t", at=utcnow()))
            nursery.start_soon(attempt, start, f"t{i:02}")
    assert len(won) == 1 and len(await second.running_turns()) == 1
    assert {a.turn_id for a in answers} == set(won) and len(answers) == 11


async def test_keys_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    store = await SQLiteStore.open(path)
    first = claim(tenant="acme", at=utcnow())
    try:
        await store.create(make("s1", tenant="acme"), idempotency=first)
    finally:
        await store.close()
    reopened = await SQLiteStore.open(path)
    try:
        assert await reopened.find_key("acme", "k1") == IdempotencyRecord(first, "s1")
    finally:
        await reopened.close()


# --- wait_appended ----------------------------------------------------------------


async def test_wait_appended_returns_at_once_when_the_log_is_past(store: Store) -> None:
    await seed(store)
    await store.append_events("s1", "t1", events(1, 2))
    with trio.fail_after(30):  # a hang, not a timing: it must not wait at all
        await store.wait_appended("s1", 0)
        await store.wait_appended("s1", 1)
    with pytest.raises(SessionNotFound):
        await store.wait_appended("nope", 0)


async def test_wait_appended_is_woken_by_an_append(store: Store) -> None:
    await seed(store)
    await store.append_events("s1", "t1", events(1, 2))
    woken: list[int] = []

    async def reader() -> None:
        await store.wait_appended("s1", 2)
        woken.append((await store.log_bounds("s1")).last)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            with trio.move_on_after(0.3):  # it waits: nothing past seq 2 yet
                await store.wait_appended("s1", 2)
            assert woken == []
            await store.append_events("s1", "t1", [event(3)])
    assert woken == [3]


# --- open_store / default path ------------------------------------------------------


async def test_open_store_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    memory = await open_store("memory")
    assert isinstance(memory, MemoryStore) and memory.description == "memory"
    await memory.close()

    path = tmp_path / "x" / "s.db"
    sqlite = await open_store(f"sqlite:{path}")
    assert isinstance(sqlite, SQLiteStore) and sqlite.description == f"sqlite:{path}"
    await sqlite.close()

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    default = await open_store("sqlite")
    assert default.description == f"sqlite:{tmp_path / 'data' / 'trioserve' / 'sessions.db'}"
    await default.close()


@pytest.mark.parametrize(
    "url", ["", "mem", "memory:", "sqlite:", "mysql://x", "postgresql:x", "SQLITE:/x"]
)
async def test_open_store_rejects_bad_urls(url: str) -> None:
    with pytest.raises(ValueError, match=r"'memory', 'sqlite'.*'postgresql://\.\.\.'") as info:
        await open_store(url)
    assert repr(url) in str(info.value)


def test_importing_the_package_loads_no_backend() -> None:
    code = (
        "import sys, trioserve.stores\n"
        "loaded = [m for m in ('sqlite3', 'psycopg', 'trioserve.stores.sqlite',"
        " 'trioserve.stores.memory') if m in sys.modules]\n"
        "print(loaded)\n"
        "from trioserve.stores import MemoryStore, SQLiteStore\n"
        "print(MemoryStore.__module__, SQLiteStore.__module__, 'sqlite3' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "[]",
        "trioserve.stores.memory trioserve.stores.sqlite True",
    ]
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        stores.Nope  # noqa: B018


def test_default_sqlite_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_sqlite_path() == tmp_path / "trioserve" / "sessions.db"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for value in ("", "relative/dir"):
        monkeypatch.setenv("XDG_DATA_HOME", value)
        expected = tmp_path / "home" / ".local" / "share" / "trioserve" / "sessions.db"
        assert default_sqlite_path() == expected
    monkeypatch.delenv("XDG_DATA_HOME")
    assert default_sqlite_path() == expected


def test_session_is_frozen() -> None:
    session = make()
    with pytest.raises(AttributeError):
        session.status = EXPIRED  # type: ignore[misc]
