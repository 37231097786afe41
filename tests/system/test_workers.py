"""``trioserve run --workers N``: a supervisor and N real server processes on one port.

The workers share a PostgreSQL store (a fresh schema per test); these tests
are skipped when PostgreSQL is not reachable, and fail under ``CI=true``.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest
import trio

from tests.helpers import (
    WORKER,
    CLIServer,
    Frame,
    children,
    parse_sse,
    pid_alive,
    read_frames,
    run_cli,
    script,
    start_cli_server,
    write_spec,
)


async def turn_ppid(url: str) -> int:
    """Create a session and run a turn on a connection of its own: the server pid that ran it."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        session = (await client.post("/v1/sessions", json={})).json()
        resp = await client.post(f"/v1/sessions/{session['id']}/turns", json={"input": "hi"})
        assert resp.status_code == 200, resp.text
        frames = parse_sse(resp.text)
    assert [f.event for f in frames][-1] == "session.ended", frames
    return int(frames[0].data["data"]["ppid"])


async def wait_for(server: CLIServer, text: str, within: float = 30) -> None:
    with trio.fail_after(within):
        while text not in server.log:
            await trio.sleep(0.05)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([], "--workers 2 needs a PostgreSQL store (--store postgresql://...)"),
        (["--in-memory"], "and 'memory' is one process's"),
        (["--store", "sqlite:x.db"], "and 'sqlite:x.db' is one process's"),
    ],
)
def test_workers_without_postgres_is_one_line_and_exit_2(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    spec = write_spec(tmp_path, runtime="echo")
    result = run_cli(tmp_path, "run", str(spec), "--port", "0", "--workers", "2", *args)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert needle in result.stderr


@pytest.mark.parametrize(
    ("value", "needle"),
    [("0", "must be 1 or more, got 0"), ("many", "expected a number of processes or auto")],
)
def test_bad_workers_values_are_one_line_and_exit_2(
    tmp_path: Path, value: str, needle: str
) -> None:
    spec = write_spec(tmp_path, runtime="echo")
    result = run_cli(tmp_path, "run", str(spec), "--in-memory", "--workers", value)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.splitlines()) == 1 and needle in result.stderr, result.stderr


async def test_workers_serve_restart_and_drain(
    nursery: trio.Nursery, tmp_path: Path, store_url: str, launched: list[CLIServer]
) -> None:
    spec = write_spec(tmp_path)
    server = await start_cli_server(
        nursery, tmp_path, spec, "--workers", "2", "--store", store_url, "--warm-adapters", "0"
    )
    launched.append(server)
    assert "; workers 2)" in server.startup_line
    assert server.log.count(" on http://") == 1, server.log  # one startup line, not one each
    workers = children(server.proc.pid, WORKER)
    assert len(workers) == 2, server.log

    # Both serve: each new connection goes to either (the kernel's SO_REUSEPORT hash).
    seen = {await turn_ppid(server.url) for _ in range(12)}
    assert seen == workers

    # One killed: the supervisor starts another, which serves; the other served meanwhile.
    victim = min(workers)
    os.kill(victim, signal.SIGKILL)
    await wait_for(server, f"(pid {victim}) was killed by SIGKILL; restarting it")
    assert await turn_ppid(server.url) in children(server.proc.pid, WORKER) | workers
    await wait_for(server, "is serving again")
    now = children(server.proc.pid, WORKER)
    assert len(now) == 2 and victim not in now and (workers - {victim}) < now
    seen = {await turn_ppid(server.url) for _ in range(12)}
    assert seen == now

    # SIGTERM drains every worker and the supervisor exits 0.
    server.signal(signal.SIGTERM)
    assert await server.wait() == 0, server.log
    log = await server.whole_log()
    assert log.count("draining: 0 turn(s) in flight") == 2, log
    assert not [pid for pid in now if pid_alive(pid)]


async def test_workers_leave_when_the_supervisor_is_killed(
    nursery: trio.Nursery, tmp_path: Path, store_url: str, launched: list[CLIServer]
) -> None:
    spec = write_spec(tmp_path)
    server = await start_cli_server(
        nursery, tmp_path, spec, "--workers", "2", "--store", store_url, "--warm-adapters", "0"
    )
    launched.append(server)
    workers = children(server.proc.pid, WORKER)
    assert len(workers) == 2
    server.signal(signal.SIGKILL)
    await server.wait()
    with trio.fail_after(30):
        while any(pid_alive(pid) for pid in workers):
            await trio.sleep(0.05)
    log = await server.whole_log()  # the workers' last lines may still be in the pipe
    assert log.count("the supervisor is gone: draining") == 2, log


async def test_a_worker_killed_mid_turn_has_its_turn_interrupted_by_the_other(
    nursery: trio.Nursery, tmp_path: Path, store_url: str, launched: list[CLIServer]
) -> None:
    spec = write_spec(tmp_path)
    server = await start_cli_server(
        nursery,
        tmp_path,
        spec,
        *("--workers", "2", "--store", store_url, "--warm-adapters", "0", "--turn-lease", "2s"),
    )
    launched.append(server)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={})).json()["id"]
    hang = script({"event": "message", "data": {"ready": 1}}, {"hang": True})
    seen: list[Frame] = []
    running = trio.Event()

    async def run() -> None:
        with pytest.raises(httpx.HTTPError):  # its worker dies under it
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                url = f"/v1/sessions/{sid}/turns"
                async with client.stream("POST", url, json={"input": hang}) as resp:
                    async for frame in read_frames(resp):
                        seen.append(frame)
                        if frame.event == "message":
                            running.set()

    nursery.start_soon(run)
    with trio.fail_after(20):
        await running.wait()
    owner, adapter = seen[0].data["data"]["ppid"], seen[0].data["data"]["pid"]
    os.kill(owner, signal.SIGKILL)
    # The other worker (or the restarted one) closes the turn once its lease passed.
    # Until the killed worker is gone, a connection it had queued is reset: asked again.
    with trio.fail_after(30):
        while True:
            try:
                async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
                    record = (await client.get(f"/v1/sessions/{sid}/turns")).json()[-1]
            except httpx.TransportError:
                record = {"status": "running"}
            if record["status"] != "running":
                break
            await trio.sleep(0.1)
    assert record["status"] == "interrupted", record
    assert not pid_alive(adapter)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        log = parse_sse((await client.get(f"/v1/sessions/{sid}/events")).text)
        assert log[: len(seen)] == seen
        assert [f.event for f in log[len(seen) :]] == ["error", "session.ended"]
        resp = await client.post(f"/v1/sessions/{sid}/turns", json={"input": "again"})
        assert resp.status_code == 200
        assert parse_sse(resp.text)[-1].data["data"]["reason"] == "completed"
    await wait_for(server, f"(pid {owner}) was killed by SIGKILL; restarting it")
    server.signal(signal.SIGTERM)
    assert await server.wait() == 0, server.log
