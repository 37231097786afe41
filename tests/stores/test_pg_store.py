"""What only ``PostgresStore`` promises: URLs, its schema, many processes on one database.

The ``Store`` contract itself runs against PostgreSQL in test_stores.py.
Each test has a schema of its own (``pgstore_<uuid>``), dropped afterwards;
without a reachable server the tests skip (and fail under ``CI=true``).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import psycopg
import pytest
import trio

from tests.helpers.pg import fresh_schema, require_pg, with_schema
from trioserve.errors import LogConflict, SessionBusy, StoreError
from trioserve.stores import (
    LoggedEvent,
    PostgresStore,
    Session,
    SessionStatus,
    TurnRecord,
    TurnStatus,
    open_store,
    pg_schema,
)
from trioserve.stores.pg_schema import PG_SCHEMA_VERSION, parse_url

pytestmark = pytest.mark.backends("postgres")

T0 = datetime(2026, 3, 1, 12, 0, 0, 654321, tzinfo=UTC)


def make(sid: str = "s1") -> Session:
    return Session(
        id=sid,
        agent_name="agent",
        runtime_type="pi",
        status=SessionStatus.ACTIVE,
        created_at=T0,
        last_active_at=T0,
    )


def turn(tid: str = "t1", sid: str = "s1") -> TurnRecord:
    return TurnRecord(id=tid, session_id=sid, input="go", status=TurnStatus.RUNNING, created_at=T0)


def event(seq: int, tid: str = "t1") -> LoggedEvent:
    return LoggedEvent(seq=seq, turn_id=tid, type="message", raw=b'{"seq":%d}' % seq)


@pytest.fixture
def server() -> str:
    """The server's URL (skips, or fails under ``CI=true``, when it is unreachable)."""
    return require_pg()


@pytest.fixture
async def url(server: str) -> AsyncIterator[str]:
    async with fresh_schema() as schema_url:
        yield schema_url


async def test_both_schemes_open_a_postgres_store(url: str) -> None:
    for scheme in ("postgresql", "postgres"):
        store = await open_store(scheme + url.removeprefix("postgresql"))
        try:
            assert isinstance(store, PostgresStore)
            assert store.description.startswith("postgresql://") and "schema=pgstore_" in url
            assert store.description.endswith(url.rpartition("?")[2])
            await store.create(make(f"s-{scheme}"))
        finally:
            await store.close()
    reopened = await open_store(url)  # both wrote to the one schema
    try:
        assert sorted(s.id for s in await reopened.list()) == ["s-postgres", "s-postgresql"]
    finally:
        await reopened.close()


def test_the_description_never_shows_a_password() -> None:
    target = parse_url("postgresql://me:secret@db.example:6543/prod?schema=ts&sslmode=require")
    assert target.description == "postgresql://me@db.example:6543/prod?schema=ts"
    assert "secret" not in target.description and "schema" not in target.conninfo
    assert "sslmode=require" in target.conninfo
    assert parse_url("postgres://h/db").schema is None


@pytest.mark.parametrize("schema", ["", "1abc", "a-b", "x;drop", "a" * 64])
def test_a_bad_schema_name_is_refused(schema: str) -> None:
    with pytest.raises(ValueError, match="schema"):
        parse_url(f"postgresql://h/db?schema={schema}")


async def test_an_unreachable_server_is_a_clear_error(server: str) -> None:
    with pytest.raises(StoreError, match=r"cannot open session store postgresql://127\.0\.0\.1:1/"):
        await open_store("postgresql://127.0.0.1:1/nothing?connect_timeout=3")


async def test_without_psycopg_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "trioserve.stores.postgres", raising=False)
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg -> ImportError
    with pytest.raises(StoreError, match=r"install the 'postgres' extra"):
        await open_store("postgresql://127.0.0.1/test")


async def test_the_schema_is_versioned_and_a_newer_one_refused(url: str) -> None:
    store = await open_store(url)
    await store.close()
    target = parse_url(url)
    with psycopg.connect(target.conninfo, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {target.schema}")
        row = conn.execute("SELECT version FROM trioserve_schema").fetchall()
        assert row == [(PG_SCHEMA_VERSION,)]
        conn.execute("UPDATE trioserve_schema SET version = version + 1")
    with pytest.raises(StoreError, match="newer than this trioserve supports"):
        await open_store(url)


async def test_stores_opened_at_once_migrate_once(url: str) -> None:
    opened: list[PostgresStore] = []

    async def one() -> None:
        store = await PostgresStore.open(url)
        opened.append(store)

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(one)
    for store in opened:
        await store.close()
    target = parse_url(url)
    with psycopg.connect(target.conninfo) as conn:
        conn.execute(f"SET search_path TO {target.schema}")
        assert conn.execute("SELECT version FROM trioserve_schema").fetchall() == [
            (PG_SCHEMA_VERSION,)
        ]


async def test_two_processes_never_append_the_same_seq(url: str) -> None:
    """Two stores on one database (two processes' view) race to append seq n: one wins."""
    first, second = await PostgresStore.open(url), await PostgresStore.open(url)
    try:
        await first.create(make())
        await first.create_turn(turn())
        outcomes: list[str] = []

        async def append(store: PostgresStore, seq: int) -> None:
            try:
                await store.append_events("s1", "t1", [event(seq)])
                outcomes.append("ok")
            except LogConflict:
                outcomes.append("conflict")

        for seq in range(1, 21):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(append, first, seq)
                nursery.start_soon(append, second, seq)
        assert sorted(outcomes) == ["conflict"] * 20 + ["ok"] * 20
        assert [e.seq for e in await second.read_events("s1")] == list(range(1, 21))
        assert (await first.get("s1")).last_seq == 20
    finally:
        await first.close()
        await second.close()


async def test_a_reader_on_another_store_is_woken_by_notify(url: str) -> None:
    writer, reader = await PostgresStore.open(url), await PostgresStore.open(url)
    try:
        await writer.create(make())
        await writer.create_turn(turn())
        woken = trio.Event()

        async def follow() -> None:
            await reader.wait_appended("s1", 0)
            woken.set()

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(follow)
                while not reader._listener.waiting("s1"):  # white-box: it is listening
                    await trio.sleep(0.01)
                assert not woken.is_set()
                await writer.append_events("s1", "t1", [event(1)])
                await woken.wait()
        assert reader._listener.waiting("s1") == 0
    finally:
        await writer.close()
        await reader.close()


async def test_a_closed_store_refuses_calls_and_waits(url: str) -> None:
    store = await PostgresStore.open(url)
    await store.create(make())
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(StoreError, match="store is closed"):
        await store.get("s1")
    with pytest.raises(StoreError, match="store is closed"):
        await store.wait_appended("s1", 0)


def test_with_schema_keeps_other_parameters() -> None:
    assert with_schema("postgresql://h/db?sslmode=disable", "x") == (
        "postgresql://h/db?sslmode=disable&schema=x"
    )


async def test_a_v1_schema_migrates_to_one_running_turn_per_session(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Schema 1 -> 2: single flight in the schema, and leases; extra running turns end."""
    monkeypatch.setattr(pg_schema, "_MIGRATIONS", pg_schema._MIGRATIONS[:1])
    monkeypatch.setattr(pg_schema, "PG_SCHEMA_VERSION", 1)
    store = await PostgresStore.open(url)
    await store.create(make())
    await store.close()
    target = parse_url(url)
    with psycopg.connect(target.conninfo, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {target.schema}")
        for tid, micros in (("old", 1), ("new", 2), ("newest", 3)):  # v1 allowed this
            conn.execute(
                "INSERT INTO turns (id, session_id, input, status, created_at) "
                "VALUES (%s, 's1', 'go', 'running', %s)",
                (tid, micros),
            )
    monkeypatch.undo()
    store = await PostgresStore.open(url)
    try:
        (running,) = await store.running_turns()
        assert (running.id, running.owner, running.lease_expires_at) == ("newest", None, None)
        for tid in ("old", "new"):
            record = await store.get_turn("s1", tid)
            assert (record.status, record.reason) == (TurnStatus.INTERRUPTED, "server_restart")
            assert record.ended_at == record.created_at
        with pytest.raises(SessionBusy):
            await store.create_turn(turn("another"))
    finally:
        await store.close()
    with psycopg.connect(target.conninfo, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {target.schema}")
        version = conn.execute("SELECT version FROM trioserve_schema").fetchall()
        assert version == [(PG_SCHEMA_VERSION,)]  # and on to the latest
        with pytest.raises(psycopg.errors.UniqueViolation):  # the schema's own guard
            conn.execute(
                "INSERT INTO turns (id, session_id, input, status, created_at) "
                "VALUES ('raw', 's1', 'go', 'running', 9)"
            )
