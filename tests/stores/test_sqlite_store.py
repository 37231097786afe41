"""What only ``SQLiteStore`` promises: files, permissions, durability, schema, errors."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import trio
import trio.testing

from trioserve.errors import LogConflict, SessionBusy, SessionExpired, StoreError
from trioserve.protocol import SessionStatus, TurnStatus
from trioserve.stores import (
    IdempotencyClaim,
    IdempotencyRecord,
    LogBounds,
    LoggedEvent,
    Session,
    SQLiteStore,
    TurnEnd,
    TurnRecord,
    sqlite_log,
    sqlite_schema,
    sqlite_sessions,
)
from trioserve.stores.sqlite_schema import _MIGRATIONS, BUSY_TIMEOUT_MS, SCHEMA_VERSION

pytestmark = pytest.mark.backends("sqlite")

T0 = datetime(2026, 3, 1, 12, 0, 0, 654321, tzinfo=UTC)
is_root = os.geteuid() == 0


def make(sid: str = "s1", status: SessionStatus = SessionStatus.ACTIVE) -> Session:
    return Session(
        id=sid,
        agent_name="agent",
        runtime_type="pi",
        status=status,
        created_at=T0,
        last_active_at=T0 + timedelta(seconds=1),
        spec={"name": "agent", "task": "do ✓", "tools": ["a", "b"]},
        inputs={"x": "1"},
        adapter_state="state",
    )


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The most permissive umask, so the test shows the store does not rely on it."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


@contextlib.contextmanager
def raw(path: Path) -> Iterator[sqlite3.Connection]:
    """A second, plain connection to the file (autocommit), closed on exit."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()


async def test_creates_private_dirs_and_files(tmp_path: Path, open_umask: None) -> None:
    path = tmp_path / "a" / "b" / "sessions.db"
    store = await SQLiteStore.open(path)
    try:
        await store.create(make())  # writes, so -wal and -shm exist
        assert mode(tmp_path / "a") == 0o700
        assert mode(tmp_path / "a" / "b") == 0o700
        for name in ("sessions.db", "sessions.db-wal", "sessions.db-shm"):
            assert mode(path.parent / name) == 0o600, name
    finally:
        await store.close()
    assert mode(path) == 0o600


async def test_leaves_existing_dirs_alone_and_tightens_the_file(
    tmp_path: Path, open_umask: None
) -> None:
    directory = tmp_path / "shared"
    directory.mkdir(mode=0o755)
    path = directory / "sessions.db"
    path.touch(mode=0o644)
    store = await SQLiteStore.open(path)
    try:
        await store.create(make())
        assert mode(directory) == 0o755
        assert mode(path) == 0o600
        assert mode(directory / "sessions.db-wal") == 0o600
        assert mode(directory / "sessions.db-shm") == 0o600
    finally:
        await store.close()


async def test_connection_settings(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    store = await SQLiteStore.open(path)
    try:
        conn = store._conn  # white-box: the test is the only task using it
        assert conn is not None
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL
        assert conn.execute("PRAGMA busy_timeout").fetchone() == (BUSY_TIMEOUT_MS,)
    finally:
        await store.close()
    with raw(path) as conn:  # WAL mode is persistent in the file
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    assert SCHEMA_VERSION >= 1


async def test_session_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    store = await SQLiteStore.open(path)
    await store.create(make("kept"))
    await store.create(make("gone"))
    await store.update("kept", status=SessionStatus.PAUSED, adapter_state=None)
    await store.delete("gone")
    await store.close()

    reopened = await SQLiteStore.open(path)
    try:
        got = await reopened.get("kept")
        assert got.status is SessionStatus.PAUSED and got.adapter_state is None
        assert got.spec == make().spec and got.inputs == {"x": "1"}
        assert got.created_at == T0 and got.last_active_at == T0 + timedelta(seconds=1)
        assert [s.id for s in await reopened.list()] == ["kept"]
    finally:
        await reopened.close()


async def test_times_are_integer_microseconds(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    store = await SQLiteStore.open(path)
    await store.create(make())
    await store.close()
    with raw(path) as conn:
        row = conn.execute("SELECT typeof(created_at), created_at FROM sessions").fetchone()
    assert row == ("integer", int(T0.timestamp()) * 1_000_000 + 654321)


@pytest.mark.parametrize(
    "content",
    [b"this is not a database, just some text\n" * 50, b"SQLite format 3\x00" + b"\xff" * 4080],
)
async def test_non_database_file_gives_a_clear_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "sessions.db"
    path.write_bytes(content)
    with pytest.raises(StoreError, match="not a SQLite database or is corrupt") as info:
        await SQLiteStore.open(path)
    assert str(path) in str(info.value)
    assert path.read_bytes() == content  # left as it was


async def test_unusable_paths_give_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    path = blocker / "sub" / "sessions.db"
    with pytest.raises(StoreError, match="cannot create directory") as info:
        await SQLiteStore.open(path)
    assert str(blocker / "sub") in str(info.value)

    directory = tmp_path / "is-a-dir.db"
    directory.mkdir()
    with pytest.raises(StoreError, match="cannot open session store") as info:
        await SQLiteStore.open(directory)
    assert str(directory) in str(info.value)


@pytest.mark.skipif(is_root, reason="root ignores file permissions")
async def test_unwritable_directory_gives_a_clear_error(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    path = locked / "sessions.db"
    try:
        with pytest.raises(StoreError) as info:
            await SQLiteStore.open(path)
        assert str(path) in str(info.value)
    finally:
        locked.chmod(0o700)


async def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    with raw(path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match="newer than this trioserve supports") as info:
        await SQLiteStore.open(path)
    assert str(path) in str(info.value)


async def test_foreign_sessions_table_is_refused_without_changes(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    with raw(path) as conn:
        conn.execute("CREATE TABLE sessions (whatever TEXT)")
    with pytest.raises(StoreError, match=str(path)):
        await SQLiteStore.open(path)
    with raw(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (0,)


async def test_expired_is_final_at_the_sql_level(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    store = await SQLiteStore.open(path)
    try:
        await store.create(make(status=SessionStatus.EXPIRED))
        with raw(path) as conn:
            with pytest.raises(sqlite3.IntegrityError, match="session is expired"):
                conn.execute("UPDATE sessions SET status = 'active'")
            conn.execute("UPDATE sessions SET status = 'expired', adapter_state = 'x'")
        with pytest.raises(SessionExpired):
            await store.update("s1", status=SessionStatus.ACTIVE)
        got = await store.get("s1")
        assert got.status is SessionStatus.EXPIRED and got.adapter_state == "x"
    finally:
        await store.close()


async def test_schema_has_the_query_indexes(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    store = await SQLiteStore.open(path)
    await store.close()
    with raw(path) as conn:
        names = {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        assert {"sessions_by_last_active", "sessions_by_status", "sessions_by_agent"} <= names
        plan = conn.execute(
            "EXPLAIN QUERY PLAN UPDATE sessions SET status = 'expired' "
            "WHERE status = 'active' AND last_active_at < 5"
        ).fetchall()
        assert "sessions_by_status" in str(plan)
        order = "ORDER BY last_active_at DESC, id DESC LIMIT 51"
        page = "(last_active_at, id) < (5, 's')"
        plans = {  # list's pages, first and deep, with and without a filter: no sort
            f"SELECT * FROM sessions {order}": "sessions_by_last_active",
            f"SELECT * FROM sessions WHERE {page} {order}": "sessions_by_last_active",
            f"SELECT * FROM sessions WHERE status = 'active' {order}": "sessions_by_status",
            f"SELECT * FROM sessions WHERE status = 'ended' AND {page} {order}": (
                "sessions_by_status"
            ),
            f"SELECT * FROM sessions WHERE agent_name = 'a' AND {page} {order}": (
                "sessions_by_agent"
            ),
        }
        for sql, index in plans.items():
            shown = str(conn.execute(f"EXPLAIN QUERY PLAN {sql}").fetchall())
            assert index in shown and "TEMP B-TREE" not in shown, (sql, shown)
            if "<" in sql:  # a deep page starts where it should: no scan of the ones before
                assert "(last_active_at,id)<(?,?)" in shown, (sql, shown)


async def test_mark_expired_with_a_huge_exclude(tmp_path: Path) -> None:
    store = await SQLiteStore.open(tmp_path / "sessions.db")
    try:
        await store.create(make("idle"))
        await store.create(make("busy"))
        exclude = [f"id-{i}" for i in range(100_000)] + ["busy"]  # far above SQLite's 32766
        assert await store.mark_expired(T0 + timedelta(days=1), exclude=exclude) == ["idle"]
    finally:
        await store.close()


# --- turns and the event log ------------------------------------------------------


def turn(tid: str = "t1", sid: str = "s1") -> TurnRecord:
    return TurnRecord(id=tid, session_id=sid, input="go", status=TurnStatus.RUNNING, created_at=T0)


def events(first: int, last: int, tid: str = "t1") -> list[LoggedEvent]:
    return [
        LoggedEvent(seq=n, turn_id=tid, type="message", raw=b'{"seq":%d}' % n)
        for n in range(first, last + 1)
    ]


def ended(at: datetime = T0) -> TurnEnd:
    return TurnEnd(status=TurnStatus.COMPLETED, reason="completed", ended_at=at)


async def test_seqs_are_never_reused_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    store = await SQLiteStore.open(path)
    await store.create(make())
    await store.create_turn(turn("t1"))
    await store.append_events("s1", "t1", events(1, 5), end=ended())
    await store.create(make("s2"))
    await store.create_turn(turn("t2", "s2"))
    await store.append_events("s2", "t2", events(1, 3, "t2"))
    assert await store.drop_events(T0 + timedelta(days=1)) == 5  # s1's log is now empty
    await store.close()

    store = await SQLiteStore.open(path)
    try:
        assert (await store.get("s1")).last_seq == 5
        assert await store.log_bounds("s1") == LogBounds(earliest=6, last=5)
        await store.create_turn(turn("t3"))
        for reused in (1, 5, 7):
            with pytest.raises(LogConflict, match="expected event seq 6"):
                await store.append_events("s1", "t3", events(reused, reused, "t3"))
        await store.append_events("s1", "t3", events(6, 7, "t3"))
        assert [e.seq for e in await store.read_events("s1")] == [6, 7]
        # s2 kept its events (its turn is still running) and goes on from them
        with pytest.raises(LogConflict):
            await store.append_events("s2", "t2", events(3, 3, "t2"))
        await store.append_events("s2", "t2", events(4, 4, "t2"))
        assert [e.seq for e in await store.read_events("s2")] == [1, 2, 3, 4]
        assert [t.id for t in await store.running_turns()] == ["t2", "t3"]
    finally:
        await store.close()


def make_v1_database(path: Path) -> None:
    """A database exactly as trioserve with schema version 1 left it, with one session."""
    with raw(path) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        for statement in _MIGRATIONS[0]:
            conn.execute(statement)
        conn.execute("PRAGMA user_version = 1")
        created = (T0 - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
        conn.execute(
            "INSERT INTO sessions (id, agent_name, runtime_type, status, created_at, "
            "last_active_at, spec, inputs, adapter_state) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            ("old", "agent", "pi", "paused", created, created + 1_000_000,
             '{"name":"agent","task":"do ✓","tools":["a","b"]}', '{"x":"1"}', "state"),
        )  # fmt: skip


async def test_a_v1_database_migrates_on_open(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    make_v1_database(path)
    store = await SQLiteStore.open(path)
    try:
        got = await store.get("old")
        assert got == Session(
            id="old",
            agent_name="agent",
            runtime_type="pi",
            status=SessionStatus.PAUSED,
            created_at=T0,
            last_active_at=T0 + timedelta(seconds=1),
            spec={"name": "agent", "task": "do ✓", "tools": ["a", "b"]},
            inputs={"x": "1"},
            adapter_state="state",
            last_seq=0,
        )
        assert await store.log_bounds("old") == LogBounds(earliest=1, last=0)
        await store.create_turn(turn("t1", "old"))
        await store.append_events("old", "t1", events(1, 2), end=ended(T0 + timedelta(hours=1)))
        assert (await store.get("old")).last_seq == 2
    finally:
        await store.close()
    with raw(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) == (10,)
        tables = {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"sessions", "turns", "events", "approvals"} <= tables
    reopened = await SQLiteStore.open(path)  # an up-to-date file opens as it is
    try:
        assert [e.seq for e in await reopened.read_events("old")] == [1, 2]
    finally:
        await reopened.close()


async def test_a_failed_migration_leaves_the_v1_file_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "sessions.db"
    make_v1_database(path)
    broken = (*_MIGRATIONS[:1], (*_MIGRATIONS[1], "THIS IS NOT SQL"))
    monkeypatch.setattr(sqlite_schema, "_MIGRATIONS", broken)
    with pytest.raises(StoreError, match=str(path)):
        await SQLiteStore.open(path)
    with raw(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (1,)
        tables = {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert tables == {"sessions"}
        columns = [row[1] for row in conn.execute("PRAGMA table_info(sessions)")]
        assert "last_seq" not in columns


def make_v2_database(path: Path) -> None:
    """A database as trioserve with schema version 2 left it: sessions, a turn, a log."""
    with raw(path) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        for step in _MIGRATIONS[:2]:
            for statement in step:
                conn.execute(statement)
        conn.execute("PRAGMA user_version = 2")
        base = (T0 - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
        for i, (sid, status) in enumerate(
            [("active", "active"), ("ended", "ended"), ("expired", "expired"), ("failed", "failed")]
        ):
            conn.execute(
                "INSERT INTO sessions (id, agent_name, runtime_type, status, created_at, "
                "last_active_at, spec, inputs, last_seq) VALUES (?, 'agent', 'pi', ?, ?, ?, "
                "'{}', '{}', ?)",
                (sid, status, base, base + i * 1_000_000, 2 if sid == "ended" else 0),
            )
        conn.execute(
            "INSERT INTO turns (id, session_id, input, status, created_at, ended_at, first_seq, "
            "last_seq) VALUES ('t1', 'ended', 'go', 'completed', ?, ?, 1, 2)",
            (base, base),
        )
        conn.execute("INSERT INTO events VALUES ('ended', 1, 't1', 'message', x'7b7d')")
        conn.execute("INSERT INTO events VALUES ('ended', 2, 't1', 'message', x'7b7d')")


async def test_a_v2_database_migrates_on_open(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    make_v2_database(path)
    store = await SQLiteStore.open(path)
    try:
        got = {s.id: s for s in await store.list()}
        assert list(got) == ["failed", "expired", "ended", "active"]  # newest activity first
        # terminal sessions ended, as far as anyone knows, at their last activity
        assert got["active"].ended_at is None
        for sid in ("ended", "expired", "failed"):
            assert got[sid].ended_at == got[sid].last_active_at
        assert [e.seq for e in await store.read_events("ended")] == [1, 2]
        page = await store.list(limit=2, before=got["expired"].key)
        assert [s.id for s in page] == ["ended", "active"]
        assert await store.purge_sessions(T0 + timedelta(seconds=2)) == 1  # "ended", at +1 s
        assert {s.id for s in await store.list()} == {"active", "expired", "failed"}
    finally:
        await store.close()
    with raw(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) == (10,)
        columns = {
            index: [row[2] for row in conn.execute(f"PRAGMA index_info({index})")]
            for index in ("sessions_by_last_active", "sessions_by_status", "sessions_by_agent")
        }
        assert columns == {
            "sessions_by_last_active": ["last_active_at", "id"],
            "sessions_by_status": ["status", "last_active_at", "id"],
            "sessions_by_agent": ["agent_name", "last_active_at", "id"],
        }
        assert conn.execute("SELECT count(*) FROM events").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM turns").fetchone() == (0,)


def make_database_at(path: Path, version: int) -> None:
    """``make_v2_database``, then the migrations up to schema ``version``."""
    make_v2_database(path)
    with raw(path) as conn:
        for step in _MIGRATIONS[2:version]:
            for statement in step:
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {version}")


async def test_a_v3_database_migrates_to_sessions_with_a_tenant(tmp_path: Path) -> None:
    """Schema 3 -> 4 adds the tenant; sessions made without keys have none."""
    path = tmp_path / "sessions.db"
    make_database_at(path, 3)
    store = await SQLiteStore.open(path)
    try:
        assert {s.tenant for s in await store.list()} == {None}
        await store.create(replace(make("new"), tenant="acme"))
        assert [s.id for s in await store.list(tenant="acme")] == ["new"]
        assert len(await store.list()) == 5
    finally:
        await store.close()
    with raw(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        plan = conn.execute(
            "EXPLAIN QUERY PLAN SELECT id FROM sessions WHERE tenant = 'acme' "
            "ORDER BY last_active_at DESC, id DESC"
        ).fetchall()
        assert "sessions_by_tenant" in " ".join(str(row[-1]) for row in plan)


async def test_a_v4_database_migrates_to_one_running_turn_per_session(tmp_path: Path) -> None:
    """Schema 4 -> 5: single flight in the schema, and leases; extra running turns end."""
    path = tmp_path / "sessions.db"
    make_database_at(path, 4)
    with raw(path) as conn:
        for tid, micros in (("old", 1), ("new", 2), ("newest", 3)):  # v4 allowed this
            conn.execute(
                "INSERT INTO turns (id, session_id, input, status, created_at) "
                "VALUES (?, 'active', 'go', 'running', ?)",
                (tid, micros),
            )
    store = await SQLiteStore.open(path)
    try:
        (running,) = await store.running_turns()
        assert running.id == "newest" and running.owner is None
        assert running.lease_expires_at is None
        for tid in ("old", "new"):
            record = await store.get_turn("active", tid)
            assert (record.status, record.reason) == (TurnStatus.INTERRUPTED, "server_restart")
            assert record.ended_at == record.created_at
        with pytest.raises(SessionBusy):
            await store.create_turn(turn("another", "active"))
    finally:
        await store.close()
    with raw(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        with pytest.raises(sqlite3.IntegrityError):  # the schema's own guard
            conn.execute(
                "INSERT INTO turns (id, session_id, input, status, created_at) "
                "VALUES ('raw', 'active', 'go', 'running', 9)"
            )


async def test_a_v5_database_migrates_to_idempotency_keys(tmp_path: Path) -> None:
    """Schema 5 -> 6 adds the idempotency keys; what was there stays."""
    path = tmp_path / "sessions.db"
    make_database_at(path, 5)
    store = await SQLiteStore.open(path)
    try:
        assert len(await store.list()) == 4
        now = datetime.now(UTC)
        key = IdempotencyClaim("acme", "k1", "f", now, now + timedelta(hours=1))
        await store.create(replace(make("new"), tenant="acme"), idempotency=key)
        assert await store.find_key("acme", "k1") == IdempotencyRecord(key, session_id="new")
    finally:
        await store.close()
    with raw(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        plan = conn.execute(
            "EXPLAIN QUERY PLAN DELETE FROM idempotency_keys WHERE expires_at <= 1"
        ).fetchall()
        assert "idempotency_keys_by_expiry" in " ".join(str(row[-1]) for row in plan)


async def test_a_v6_database_migrates_to_queued_turns(tmp_path: Path) -> None:
    """Schema 6 -> 7 copies the turns into a table that takes queued ones; every row, the
    single flight and the leases' indexes stay."""
    path = tmp_path / "sessions.db"
    make_database_at(path, 6)
    with raw(path) as conn:
        conn.execute(
            "INSERT INTO turns (id, session_id, input, status, created_at, owner, "
            "lease_expires_at) VALUES ('run', 'active', 'go', 'running', 5, 'me', 7)"
        )
    store = await SQLiteStore.open(path)
    try:
        (running,) = await store.running_turns()
        assert (running.id, running.owner) == ("run", "me")
        assert (await store.get_turn("ended", "t1")).last_seq == 2
        queued = replace(turn("q", "active"), status=TurnStatus.QUEUED)
        await store.create_turn(queued)
        assert [t.id for t in await store.queued_turns()] == ["q"]
        with pytest.raises(SessionBusy):
            await store.begin_turn("active", "q")
    finally:
        await store.close()
    with raw(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        indexes = {row[1] for row in conn.execute("PRAGMA index_list(turns)")}
        assert {"turns_one_running", "turns_by_lease", "turns_by_owner", "turns_queued"} <= indexes
        with pytest.raises(sqlite3.IntegrityError):  # single flight, still the schema's
            conn.execute(
                "INSERT INTO turns (id, session_id, input, status, created_at) "
                "VALUES ('raw', 'active', 'go', 'running', 9)"
            )
        with pytest.raises(sqlite3.IntegrityError):  # a queued turn has not ended
            conn.execute(
                "INSERT INTO turns (id, session_id, input, status, created_at, ended_at) "
                "VALUES ('raw', 'active', 'go', 'queued', 9, 9)"
            )


async def test_a_v9_database_migrates_to_waiting_turns(tmp_path: Path) -> None:
    """Schema 9 -> 10 copies the turns into a table that takes waiting ones (approvals);
    every row, queued and running turns, their indexes and the outbox stay."""
    path = tmp_path / "sessions.db"
    make_database_at(path, 9)
    with raw(path) as conn:
        conn.execute(
            "INSERT INTO turns (id, session_id, input, status, created_at, owner, "
            "lease_expires_at) VALUES ('run', 'active', 'go', 'running', 5, 'me', 7)"
        )
        with pytest.raises(sqlite3.IntegrityError):  # no waiting turn in schema 9
            conn.execute(
                "INSERT INTO turns (id, session_id, input, status, created_at) "
                "VALUES ('w', 'active', 'go', 'waiting', 9)"
            )
    store = await SQLiteStore.open(path)
    try:
        (running,) = await store.running_turns()
        assert (running.id, running.owner) == ("run", "me")
        assert (await store.get_turn("ended", "t1")).last_seq == 2
        assert await store.list_approvals("active") == []
    finally:
        await store.close()
    with raw(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) == (10,)
        tables = {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"approvals", "webhook_outbox", "crons"} <= tables
        indexes = {row[1] for row in conn.execute("PRAGMA index_list(turns)")}
        assert {"turns_one_running", "turns_by_lease", "turns_by_owner", "turns_queued"} <= indexes
        conn.execute(
            "INSERT INTO turns (id, session_id, input, status, created_at) "
            "VALUES ('w', 'ended', 'go', 'waiting', 9)"
        )
        with pytest.raises(sqlite3.IntegrityError):  # single flight: a waiting turn holds it
            conn.execute(
                "INSERT INTO turns (id, session_id, input, status, created_at) "
                "VALUES ('r', 'ended', 'go', 'running', 9)"
            )
        with pytest.raises(sqlite3.IntegrityError):  # a waiting turn has not ended
            conn.execute(
                "INSERT INTO turns (id, session_id, input, status, created_at, ended_at) "
                "VALUES ('w2', 'other', 'go', 'waiting', 9, 9)"
            )


async def test_a_failed_migration_leaves_the_v2_file_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "sessions.db"
    make_v2_database(path)
    broken = (*_MIGRATIONS[:2], (*_MIGRATIONS[2], "THIS IS NOT SQL"))
    monkeypatch.setattr(sqlite_schema, "_MIGRATIONS", broken)
    with pytest.raises(StoreError, match=str(path)):
        await SQLiteStore.open(path)
    with raw(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (2,)
        columns = [row[1] for row in conn.execute("PRAGMA table_info(sessions)")]
        assert "ended_at" not in columns
        index = [row[2] for row in conn.execute("PRAGMA index_info(sessions_by_status)")]
        assert index == ["status", "last_active_at", "created_at", "id"]


async def test_purge_works_in_chunks_that_let_other_calls_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await SQLiteStore.open(tmp_path / "sessions.db")
    try:
        for sid in ("a", "b", "c", "busy"):
            await store.create(make(sid))
            for i in range(2):  # two turns of 175 events each
                tid = f"{sid}{i}"
                await store.create_turn(turn(tid, sid))
                first = 175 * i + 1
                end = None if sid == "busy" and i else ended()
                await store.append_events(sid, tid, events(first, first + 174, tid), end=end)
            await store.update(sid, status=SessionStatus.ENDED)
        monkeypatch.setattr(store, "_chunk_rows", 100)
        monkeypatch.setattr(store, "_chunk_sessions", 2)
        calls: list[str] = []  # appended in the worker thread, in the order the calls ran
        real_chunk, real_select = sqlite_sessions._purge_chunk, sqlite_sessions._select
        held = False

        def chunk(
            conn: sqlite3.Connection, cutoff: int, rows: int, sessions: int
        ) -> tuple[int, bool]:
            nonlocal held
            assert (rows, sessions) == (100, 2)
            if not held:  # hold the first chunk until a get() waits for the connection
                held = True
                trio.from_thread.run(start_getter)
            calls.append("chunk")
            return real_chunk(conn, cutoff, rows, sessions)

        def select(conn: sqlite3.Connection, session_id: str) -> Session:
            calls.append("get")
            return real_select(conn, session_id)

        monkeypatch.setattr(store, "_q", replace(store._q, purge_chunk=chunk, select=select))

        async with trio.open_nursery() as nursery:

            async def start_getter() -> None:
                nursery.start_soon(store.get, "a")
                await trio.testing.wait_all_tasks_blocked()

            assert await store.purge_sessions(T0 + timedelta(days=365 * 100)) == 3
        # a and b: 7 chunks of 100 events, then their turns and rows; c: 3, then the rest
        assert calls == ["chunk", "get"] + ["chunk"] * 11
        assert [s.id for s in await store.list()] == ["busy"]  # its turn still runs
        assert [e.seq for e in await store.read_events("busy")] == list(range(1, 351))
        calls.clear()
        assert await store.purge_sessions(T0 + timedelta(days=365 * 100)) == 0
        assert calls == ["chunk"]
    finally:
        await store.close()


async def test_drop_events_works_in_chunks_that_let_other_calls_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await SQLiteStore.open(tmp_path / "sessions.db")
    try:
        await store.create(make())
        for i in range(3):
            await store.create_turn(turn(f"t{i}"))
            first = 350 * i + 1
            tid = f"t{i}"
            await store.append_events("s1", tid, events(first, first + 349, tid), end=ended())
        monkeypatch.setattr(store, "_chunk_rows", 100)
        calls: list[str] = []  # appended in the worker thread, in the order the calls ran
        real_chunk, real_select = sqlite_log._drop_chunk, sqlite_sessions._select
        held = False

        def chunk(conn: sqlite3.Connection, cutoff: int, size: int) -> tuple[int, bool]:
            nonlocal held
            assert size == 100
            if not held:  # hold the first chunk until a get() waits for the connection
                held = True
                trio.from_thread.run(start_getter)
            calls.append("chunk")
            return real_chunk(conn, cutoff, size)

        def select(conn: sqlite3.Connection, session_id: str) -> Session:
            calls.append("get")
            return real_select(conn, session_id)

        monkeypatch.setattr(store, "_q", replace(store._q, drop_chunk=chunk, select=select))

        async with trio.open_nursery() as nursery:

            async def start_getter() -> None:
                nursery.start_soon(store.get, "s1")
                await trio.testing.wait_all_tasks_blocked()

            assert await store.drop_events(T0 + timedelta(seconds=1)) == 1050
        assert calls == ["chunk", "get"] + ["chunk"] * 10  # 10 full chunks, then 50: done
        assert await store.read_events("s1") == []
        calls.clear()
        assert await store.drop_events(T0 + timedelta(seconds=1)) == 0
        assert calls == ["chunk"]
    finally:
        await store.close()


async def test_drop_skips_turns_it_has_emptied(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    store = await SQLiteStore.open(path)
    try:
        await store.create(make())
        await store.create_turn(turn("t1"))
        await store.append_events("s1", "t1", events(1, 2), end=ended(T0))
        await store.create_turn(turn("t2"))
        await store.append_events("s1", "t2", events(3, 3, "t2"), end=ended(T0 + timedelta(days=2)))
        assert await store.drop_events(T0 + timedelta(days=1)) == 2
        with raw(path) as conn:
            flags = dict(conn.execute("SELECT id, events_dropped FROM turns").fetchall())
        assert flags == {"t1": 1, "t2": 0}
        assert await store.drop_events(T0 + timedelta(days=3)) == 1
    finally:
        await store.close()


async def test_a_failure_in_the_middle_of_a_batch_leaves_nothing_of_it(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    store = await SQLiteStore.open(path)
    try:
        await store.create(make())
        await store.create_turn(turn())
        with raw(path) as conn:  # a stray row: the batch's INSERT of seq 450 will fail
            conn.execute(
                "INSERT INTO events (session_id, seq, turn_id, type, raw) "
                "VALUES ('s1', 450, 'stray', 'x', x'00')"
            )
        with pytest.raises(StoreError, match="UNIQUE constraint failed") as info:
            await store.append_events("s1", "t1", events(1, 500), started_at=T0, end=ended())
        assert str(path) in str(info.value)
        await _assert_nothing_logged(store, path)

        # a row the schema refuses (a raw that is not a BLOB), past the checks in Python
        batch = [*events(1, 300), LoggedEvent(301, "t1", "message", "text")]  # type: ignore[arg-type]
        with pytest.raises(StoreError, match="CHECK constraint failed"):
            await store._run(sqlite_log._append, "s1", "t1", batch, None, None)
        await _assert_nothing_logged(store, path)

        with raw(path) as conn:
            conn.execute("DELETE FROM events WHERE turn_id = 'stray'")
        await store.append_events("s1", "t1", events(1, 500), end=ended())  # usable as ever
        assert len(await store.read_events("s1")) == 500
    finally:
        await store.close()


async def _assert_nothing_logged(store: SQLiteStore, path: Path) -> None:
    record = await store.get_turn("s1", "t1")
    assert record.status is TurnStatus.RUNNING and record.started_at is None
    assert record.first_seq is None and record.last_seq is None
    assert (await store.get("s1")).last_seq == 0
    with raw(path) as conn:
        assert conn.execute("SELECT seq FROM events").fetchall() == [(450,)]


async def test_turn_times_are_integer_microseconds(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    store = await SQLiteStore.open(path)
    await store.create(make())
    await store.create_turn(turn())
    await store.append_events("s1", "t1", [], started_at=T0, end=ended(T0))
    await store.close()
    micros = int(T0.timestamp()) * 1_000_000 + 654321
    with raw(path) as conn:
        row = conn.execute(
            "SELECT typeof(created_at), created_at, started_at, ended_at FROM turns"
        ).fetchone()
    assert row == ("integer", micros, micros, micros)


async def test_schema_of_the_log(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    store = await SQLiteStore.open(path)
    await store.close()
    with raw(path) as conn:
        names = {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        assert {
            "turns_by_session",
            "turns_running",
            "turns_to_drop",
            "events_by_session",
            "events_by_turn",
        } <= names
        (events_sql,) = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'events'"
        ).fetchone()
        assert "WITHOUT ROWID" not in events_sql.upper()  # rows may be megabytes
        conn.execute(
            "INSERT INTO sessions (id, agent_name, runtime_type, status, created_at, "
            "last_active_at, spec, inputs) VALUES ('s', 'a', 'pi', 'active', 0, 0, '{}', '{}')"
        )
        conn.execute("INSERT INTO events VALUES ('s', 1, 't', 'x', x'00')")
        with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):  # (session_id, seq) is a key
            conn.execute("INSERT INTO events VALUES ('s', 1, 'u', 'x', x'00')")
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            conn.execute(
                "INSERT INTO turns (id, session_id, input, status, created_at) "
                "VALUES ('t', 's', '', 'paused', 0)"
            )
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):  # running, yet ended
            conn.execute(
                "INSERT INTO turns (id, session_id, input, status, created_at, ended_at) "
                "VALUES ('t', 's', '', 'running', 0, 0)"
            )
        plans = {
            "SELECT seq FROM events WHERE session_id = 's' AND seq > 0 AND seq < 9 "
            "ORDER BY seq LIMIT 10": ["events_by_session"],
            "SELECT seq FROM events WHERE turn_id = 't' AND seq > 0 ORDER BY seq": [
                "events_by_turn"
            ],
            "SELECT * FROM turns WHERE session_id = 's' ORDER BY created_at, id": [
                "turns_by_session"
            ],
            "SELECT * FROM turns WHERE status = 'running' ORDER BY created_at, id": [
                "turns_running"
            ],
            "SELECT e.rowid FROM turns AS t CROSS JOIN events AS e ON e.turn_id = t.id "
            "WHERE t.events_dropped = 0 AND t.ended_at < 5 LIMIT 10": [
                "turns_to_drop",
                "events_by_turn",
            ],
        }
        for sql, indexes in plans.items():
            plan = str(conn.execute(f"EXPLAIN QUERY PLAN {sql}").fetchall())
            assert "TEMP B-TREE" not in plan, plan
            for index in indexes:
                assert index in plan, plan


async def test_append_is_fast_enough(tmp_path: Path) -> None:
    """A smoke check of the bulk path (the real figure is in the report/benchmarks)."""
    store = await SQLiteStore.open(tmp_path / "sessions.db")
    try:
        await store.create(make())
        await store.create_turn(turn())
        batch = [
            LoggedEvent(n, "t1", "message_delta", b'{"seq":%d,"type":"message_delta","d":"hi"}' % n)
            for n in range(1, 20_001)
        ]
        start = trio.current_time()
        await store.append_events("s1", "t1", batch)
        assert trio.current_time() - start < 5  # ~0.05 s on a laptop; only a gross regression fails
        assert len(await store.read_events("s1", after=19_990)) == 10
    finally:
        await store.close()
