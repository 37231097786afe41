"""The ``Store`` contract (CONTRACT §4), run against every store backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
import trio

from trioserve.errors import DuplicateSession, SessionExpired, SessionNotFound, StoreError
from trioserve.stores import (
    UNSET,
    MemoryStore,
    Session,
    SessionStatus,
    SQLiteStore,
    Store,
    default_sqlite_path,
    open_store,
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


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    url = "memory" if request.param == "memory" else f"sqlite:{tmp_path / 'sessions.db'}"
    opened = await open_store(url)
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
    updated = await store.update(
        "s1", status=SessionStatus.ENDED, last_active_at=later, adapter_state="st"
    )
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
    # last_active desc; then created desc ("c"); then id desc ("d" before "b")
    assert [s.id for s in await store.list()] == ["a", "c", "d", "b", "e", "f"]
    assert await store.list() == [rows[i] for i in (0, 2, 3, 1, 4, 5)]


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


@pytest.mark.parametrize("url", ["", "mem", "memory:", "sqlite:", "postgres://x", "SQLITE:/x"])
async def test_open_store_rejects_bad_urls(url: str) -> None:
    with pytest.raises(ValueError, match="'memory', 'sqlite'") as info:
        await open_store(url)
    assert repr(url) in str(info.value)


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
