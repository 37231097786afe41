"""What only ``SQLiteStore`` promises: files, permissions, durability, schema, errors."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from trioserve.errors import SessionExpired, StoreError
from trioserve.stores import Session, SessionStatus, SQLiteStore
from trioserve.stores.sqlite import BUSY_TIMEOUT_MS, SCHEMA_VERSION

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
        plan = conn.execute(
            "EXPLAIN QUERY PLAN SELECT * FROM sessions WHERE status = 'active' "
            "ORDER BY last_active_at DESC, created_at DESC, id DESC LIMIT 10"
        ).fetchall()
        assert "sessions_by_status" in str(plan) and "TEMP B-TREE" not in str(plan)


async def test_mark_expired_with_a_huge_exclude(tmp_path: Path) -> None:
    store = await SQLiteStore.open(tmp_path / "sessions.db")
    try:
        await store.create(make("idle"))
        await store.create(make("busy"))
        exclude = [f"id-{i}" for i in range(100_000)] + ["busy"]  # far above SQLite's 32766
        assert await store.mark_expired(T0 + timedelta(days=1), exclude=exclude) == ["idle"]
    finally:
        await store.close()
