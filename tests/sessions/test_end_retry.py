"""A turn always ends in the store (issue 22): when the store refuses a turn's last write,
the turn ends ``failed``/``store_error`` as soon as the store takes a write again.

The store is made to refuse writes for real: on PostgreSQL the server's own
role loses its write grants on the store's schema (``REVOKE``); on SQLite the
database file and its WAL become immutable (``chattr +i``: even root cannot
write them; the test skips where the file system or the process cannot set
it).  Meanwhile the turn is stopped, so its end has to be written.  Reads
still work, the session is not stuck: a new turn is ``503
store_unavailable`` while the store refuses (never a ``500``, never a
``409`` that lasts until a restart); once writes are allowed again the
server writes the turn's end on its own (with backoff), and the next turn
runs.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import trio

from tests.helpers.pg import require_pg, with_schema
from tests.helpers.server import Server, ServerFactory
from tests.helpers.specs import script
from trioserve.stores import open_store

pytestmark = pytest.mark.backends("sqlite", "postgres")

Switch = Callable[[bool], None]
"""Allow (``True``) or refuse (``False``) the server's writes to its store."""


@asynccontextmanager
async def refusable_store(backend: str, tmp_path: Path) -> AsyncIterator[tuple[str, Switch]]:
    """A store URL the server can use, and the switch that makes it refuse writes."""
    if backend == "postgres":
        async with _pg_role_store() as found:
            yield found
    else:
        yield _immutable_sqlite(tmp_path)


@asynccontextmanager
async def _pg_role_store() -> AsyncIterator[tuple[str, Switch]]:
    """A schema made by the superuser and used by a role of its own, whose write grants
    the switch revokes and gives back (``REVOKE`` holds at once, on open connections too)."""
    import psycopg

    admin_url = require_pg()
    name = f"ts_refuse_{uuid.uuid4().hex[:12]}"
    role_url = with_schema(admin_url.replace("://postgres@", f"://{name}@"), name)
    assert role_url != with_schema(admin_url, name), "TRIOSERVE_TEST_PG_URL must name its user"
    store = await open_store(with_schema(admin_url, name))  # the superuser migrates it
    await store.close()

    def sql(*statements: str) -> None:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement.format(role=f'"{name}"', schema=name).encode())

    tables = "ALL TABLES IN SCHEMA {schema}"
    sql(
        "CREATE ROLE {role} LOGIN",
        "GRANT USAGE, CREATE ON SCHEMA {schema} TO {role}",
        f'GRANT CREATE ON DATABASE "{urlsplit(admin_url).path.lstrip("/")}" TO {{role}}',
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON {tables} TO {{role}}",
    )

    def switch(allow: bool) -> None:
        verb = "GRANT" if allow else "REVOKE"
        sql(f"{verb} INSERT, UPDATE, DELETE ON {tables} {'TO' if allow else 'FROM'} {{role}}")

    try:
        yield role_url, switch
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(
                sql,
                "DROP SCHEMA IF EXISTS {schema} CASCADE",
                "DROP OWNED BY {role}",
                "DROP ROLE {role}",
            )


def _immutable_sqlite(tmp_path: Path) -> tuple[str, Switch]:
    path = tmp_path / "sessions.db"
    chattr = shutil.which("chattr")
    if chattr is None:
        pytest.skip("no chattr: cannot make the SQLite file read-only")
    probe = tmp_path / "probe"
    probe.touch()
    tried = subprocess.run([chattr, "+i", str(probe)], capture_output=True, text=True)
    if tried.returncode != 0:
        pytest.skip(f"chattr +i is refused here: {tried.stderr.strip()}")
    subprocess.run([chattr, "-i", str(probe)], check=True)

    def switch(allow: bool) -> None:
        files = [str(path), f"{path}-wal"]
        subprocess.run([chattr, "-i" if allow else "+i", *files], check=True)

    return f"sqlite:{path}", switch


async def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Until ``condition()`` holds (a safety net of 60 s, not a measurement)."""
    with trio.fail_after(60):
        while not condition():
            await trio.sleep(0.02)


async def an_end_being_retried(server: Server, allow: Switch) -> str:
    """A session whose turn was cancelled while the store refused writes: its end is being
    retried (writes are allowed again when this returns); the session's id."""
    session_id = (await server.create())["id"]
    path = f"/v1/sessions/{session_id}/turns"
    resp = await server.client.post(path, json={"input": script({"hang": True}), "detach": True})
    assert resp.status_code == 202, resp.text
    await wait_for(lambda: server.manager.turns_in_flight == 1, "the turn runs")
    allow(False)
    try:
        await server.client.delete(f"{path}/current")
        retries = server.manager.end_retries
        await wait_for(lambda: len(retries) == 1, "the turn's end is being retried")
    finally:
        allow(True)
    return str(session_id)


async def turn_record(server: Server, session_id: str) -> dict[str, object]:
    resp = await server.client.get(f"/v1/sessions/{session_id}/turns")
    assert resp.status_code == 200, resp.text
    turns = resp.json()
    assert len(turns) >= 1
    return dict(turns[0])


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


async def test_a_turn_whose_end_the_store_refuses_ends_once_it_takes_writes(
    start_server: ServerFactory,
    backend: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with refusable_store(backend, tmp_path) as (url, allow):
        server = await start_server(store=url)
        session_id = (await server.create())["id"]
        path = f"/v1/sessions/{session_id}/turns"
        resp = await server.client.post(
            path, json={"input": script({"event": "message"}, {"hang": True}), "detach": True}
        )
        assert resp.status_code == 202, resp.text
        await wait_for(lambda: server.manager.turns_in_flight == 1, "the turn runs")
        allow(False)
        try:
            resp = await server.client.delete(f"{path}/current")
            assert resp.status_code in (200, 202, 204), resp.text
            retries = server.manager.end_retries
            await wait_for(lambda: len(retries) == 1, "the turn's end is being retried")
            assert server.manager.turns_in_flight == 0
            # Reads work; the store has the turn running still.
            assert (await turn_record(server, session_id))["status"] == "running"
            metrics = (await server.client.get("/metrics")).text
            assert metric(metrics, "trioserve_turns_unwritten") == 1
            assert metric(metrics, "trioserve_turn_end_write_failures_total") >= 1
            assert 'reason="store_error",status="failed"' in metrics
            # A new turn is refused for now, with a 503 that says why.
            resp = await server.client.post(path, json={"input": "next"})
            assert resp.status_code == 503, resp.text
            error = resp.json()["error"]
            assert error["reason"] == "store_unavailable", error
            assert "not written yet" in error["message"]
            assert resp.headers["retry-after"] == "1"
        finally:
            allow(True)
        # The server writes the end on its own, with backoff, now that the store takes it.
        await wait_for(lambda: len(retries) == 0, "the turn's end is written")
        record = await turn_record(server, session_id)
        assert (record["status"], record["reason"]) == ("failed", "store_error")
        metrics = (await server.client.get("/metrics")).text
        assert metric(metrics, "trioserve_turns_unwritten") == 0
        frames = await server.turn(session_id, "next")  # the session is not stuck
        assert frames[-1].event == "session.ended"
        assert frames[-1].data["data"]["reason"] == "completed"
        log = caplog.text
        assert "could not write its log" in log or "the store refused its log" in log
        assert "its end is written at attempt" in log
        assert "Traceback" not in log


async def test_a_new_turn_writes_the_last_ones_end_at_once(
    start_server: ServerFactory, backend: str, tmp_path: Path
) -> None:
    """``settle``: the next turn does not wait for the retry's backoff."""
    async with refusable_store(backend, tmp_path) as (url, allow):
        server = await start_server(store=url)
        session_id = await an_end_being_retried(server, allow)
        path = f"/v1/sessions/{session_id}/turns"
        retries = server.manager.end_retries
        frames = await server.turn(session_id, "next")
        assert frames[-1].data["data"]["reason"] == "completed"
        turns = (await server.client.get(path)).json()
        assert [(t["status"], t["reason"]) for t in turns] == [
            ("failed", "store_error"),
            ("completed", "completed"),
        ]
        assert len(retries) == 0


async def test_a_new_turn_numbers_its_events_after_an_end_written_as_it_starts(
    start_server: ServerFactory, backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retry writes the last turn's end while the next turn reads its session: the next
    turn's events still follow that end's (it was numbered from the stale read, and the
    store refused its whole log)."""
    async with refusable_store(backend, tmp_path) as (url, allow):
        server = await start_server(store=url)
        session_id = await an_end_being_retried(server, allow)
        path = f"/v1/sessions/{session_id}/turns"
        retries = server.manager.end_retries
        store = server.manager.store
        read = store.get
        logged = (await read(session_id)).last_seq  # before the end is written

        async def get_then_let_the_retry_write(wanted: str) -> object:
            session = await read(wanted)
            await wait_for(lambda: len(retries) == 0, "the retry writes the end")
            return session  # as it was before the end was written

        monkeypatch.setattr(store, "get", get_then_let_the_retry_write)
        frames = await server.turn(session_id, "next")
        monkeypatch.setattr(store, "get", read)
        assert frames[-1].data["data"]["reason"] == "completed"
        log = await server.client.get(f"/v1/sessions/{session_id}/events?format=json")
        seqs = [e["seq"] for e in log.json()]
        assert seqs == list(range(1, len(seqs) + 1))
        assert len(seqs) >= logged + 2  # the first turn's end, then the next turn's events
        turns = (await server.client.get(path)).json()
        assert [t["status"] for t in turns] == ["failed", "completed"]
