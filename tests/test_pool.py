"""The warm adapter pool over real processes: hand-over, replacement, idle death,
expiry, the process bound, drain and shutdown, trace context starting cold."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest
import trio
import trio.lowlevel

from conftest import (
    FAKE_ADAPTER,
    Server,
    ServerFactory,
    compiled_spec,
    fake_adapters,
    parse_sse,
    pid_alive,
    script,
    wait_gone,
)
from trioserve.pool import WarmPool

HANG = script({"event": "message", "data": {"ready": 1}}, {"hang": True})
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def pool_of(server: Server) -> WarmPool:
    pool = server.manager.pool
    assert pool is not None
    return pool


async def full(server: Server) -> set[int]:
    pool = pool_of(server)
    with trio.fail_after(10):
        await pool.wait_ready()
    return set(pool.pids())


async def turn_pid(server: Server, session_id: str, text: str = "hi", **kw: object) -> int:
    frames = await server.turn(session_id, text, **kw)  # type: ignore[arg-type]
    assert frames[-1].data["data"]["reason"] == "completed", frames
    pid: int = frames[0].data["data"]["pid"]
    return pid


async def test_a_turn_takes_a_started_process_and_a_replacement_starts(
    start_server: ServerFactory,
) -> None:
    server = await start_server(warm_adapters=2)
    sid = (await server.create())["id"]
    before = await full(server)
    assert len(before) == 2 and before <= fake_adapters()
    pid = await turn_pid(server, sid)
    assert pid in before, "the turn ran in a process started before the request"
    after = await full(server)
    assert len(after) == 2 and pid not in after
    assert before - {pid} <= after, "the other warm process is still waiting"
    await wait_gone(pid, 5)  # the turn's process is reaped like any adapter


async def test_the_warm_process_gets_the_turn_spec(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    server = await start_server()
    sid = (await server.create())["id"]
    await full(server)
    record = tmp_path / "spec.json"
    frames = await server.turn(sid, script({"record": str(record)}, {"end": "completed"}))
    assert frames[-1].data["data"]["reason"] == "completed"
    assert f'"sessionId":"{sid}"' in record.read_text()


async def test_a_warm_process_killed_while_idle_is_replaced_and_turns_go_on(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    sid = (await server.create())["id"]
    (victim,) = await full(server)
    os.kill(victim, 9)
    await wait_gone(victim, 5)  # dead (a zombie at least): it died while idle
    # At once: the turn must not get the dead process (a new one, or its own).
    pid = await turn_pid(server, sid)
    assert pid != victim
    replacement = await full(server)
    assert victim not in replacement


async def test_idle_processes_are_replaced_after_max_idle(start_server: ServerFactory) -> None:
    server = await start_server(warm_max_idle=0.3)
    (first,) = await full(server)
    with trio.fail_after(10):
        while first in pool_of(server).pids():
            await trio.sleep(0.02)
    await wait_gone(first, 5)  # stopped and reaped, not left behind
    (second,) = await full(server)
    assert second != first


async def test_stderr_printed_while_waiting_is_kept_with_the_turns(
    start_server: ServerFactory,
) -> None:
    command = [*FAKE_ADAPTER, "--startup-stderr", "loaded my libraries\n"]
    server = await start_server(command=command)
    sid = (await server.create())["id"]
    await full(server)
    frames = await server.turn(sid, script({"stderr": "then died"}, {"exit": 3}))
    message = frames[-1].data["data"]["message"]
    assert "exited with status 3" in message
    assert "loaded my libraries" in message and "then died" in message


async def test_trace_context_starts_cold_with_it_in_the_environment(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    sid = (await server.create())["id"]
    warm = await full(server)
    text = script({"env": "TRACEPARENT"}, {"env": "TRACESTATE"}, {"end": "completed"})
    resp = await server.client.post(
        f"/v1/sessions/{sid}/turns",
        json={"input": text},
        headers={"traceparent": TRACEPARENT, "tracestate": "vendor=1"},
    )
    frames = parse_sse(resp.text)
    assert frames[0].data["data"]["pid"] not in warm
    assert [f.data["data"]["env"] for f in frames[1:3]] == [TRACEPARENT, "vendor=1"]
    assert set(pool_of(server).pids()) == warm, "the warm process was left for others"
    # A malformed traceparent is ignored (W3C): the turn is like any other.
    resp = await server.client.post(
        f"/v1/sessions/{sid}/turns", json={"input": text}, headers={"traceparent": "garbage"}
    )
    frames = parse_sse(resp.text)
    assert frames[0].data["data"]["pid"] in warm
    assert [f.data["data"]["env"] for f in frames[1:3]] == [None, None]


async def test_the_process_count_stays_within_the_cap_plus_the_pool(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    cap, warm = 2, 2
    server = await start_server(max_concurrent_turns=cap, warm_adapters=warm)
    sessions = [(await server.create())["id"] for _ in range(6)]
    await full(server)
    peak = 0
    sampling = True

    async def sample() -> None:
        nonlocal peak
        while sampling:
            peak = max(peak, len(fake_adapters()))
            await trio.lowlevel.checkpoint()

    nursery.start_soon(sample)
    quick = script({"event": "message", "data": {}}, {"end": "completed"})
    statuses: list[int] = []

    async def burst(sid: str) -> None:
        for _ in range(5):
            resp = await server.client.post(f"/v1/sessions/{sid}/turns", json={"input": quick})
            statuses.append(resp.status_code)

    async with trio.open_nursery() as turns:
        for sid in sessions:
            turns.start_soon(burst, sid)
    sampling = False
    assert set(statuses) <= {200, 429} and statuses.count(200) >= 5
    assert 0 < peak <= cap + warm, peak


async def test_a_burst_larger_than_the_pool_runs_cold_without_errors(
    start_server: ServerFactory,
) -> None:
    server = await start_server(warm_adapters=1, max_concurrent_turns=0)
    sessions = [(await server.create())["id"] for _ in range(5)]
    warm = await full(server)
    pids: list[int] = []

    async def one(sid: str) -> None:
        pids.append(await turn_pid(server, sid))

    async with trio.open_nursery() as nursery:
        for sid in sessions:
            nursery.start_soon(one, sid)
    assert len(set(pids)) == 5
    assert len(set(pids) & warm) == 1, "one turn took the warm process, the rest started cold"


async def test_drain_stops_the_warm_processes_first(start_server: ServerFactory) -> None:
    server = await start_server(shutdown_grace=30)
    sid = (await server.create())["id"]
    await full(server)
    async with server.client.stream(
        "POST",
        f"/v1/sessions/{sid}/turns",
        json={"input": script({"sleep": 1.0}, {"end": "completed"})},
    ) as resp:
        chunks = resp.aiter_text()
        await chunks.__anext__()  # the turn runs
        warm = await full(server)
        server.stop.drain.set()
        for pid in warm:
            await wait_gone(pid, 3)  # stopped while the turn still runs
        assert not server.done.is_set()
        rest = "".join([chunk async for chunk in chunks])
    assert '"reason": "completed"' in rest
    with trio.fail_after(10):
        await server.done.wait()
    assert fake_adapters() == set()


async def test_no_adapter_is_left_after_shutdown(start_server: ServerFactory) -> None:
    server = await start_server(warm_adapters=3)
    warm = await full(server)
    server.stop.drain.set()
    with trio.fail_after(10):
        await server.done.wait()
    assert not any(pid_alive(pid) for pid in warm)
    assert fake_adapters() == set()


async def test_a_broken_adapter_command_backs_off(
    start_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trioserve.pool")
    dies = [sys.executable, "-c", "import sys; sys.stderr.write('no runtime here'); sys.exit(7)"]
    await start_server(command=dies, spec=compiled_spec())
    await trio.sleep(1.5)
    deaths = [r for r in caplog.records if "exited while idle" in r.getMessage()]
    assert 2 <= len(deaths) <= 6, [r.getMessage() for r in deaths]
    assert "status 7" in deaths[0].getMessage() and "no runtime here" in deaths[0].getMessage()


async def test_readyz_reports_the_pool(start_server: ServerFactory) -> None:
    server = await start_server(warm_adapters=2)
    await full(server)
    resp = await server.client.get("/readyz")
    assert (resp.status_code, resp.text) == (200, "ready")
    assert resp.headers["trioserve-warm-adapters"] == "2/2"
    resp = await server.client.get("/readyz", headers={"Accept": "application/json"})
    assert resp.json() == {"status": "ready", "warmAdapters": {"ready": 2, "target": 2}}
    server.manager.start_draining()
    resp = await server.client.get("/readyz", headers={"Accept": "application/json"})
    assert resp.status_code == 503 and resp.json()["status"] == "draining"
    off = await start_server(warm_adapters=0)
    assert (await off.client.get("/readyz")).headers["trioserve-warm-adapters"] == "0/0"
    assert off.manager.pool is None
