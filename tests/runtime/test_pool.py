"""The warm adapter pool over real processes: hand-over, replacement, idle death,
expiry, the process bound, drain and shutdown, trace context starting cold;
loading vs ready, which process a turn gets, nice, holding back replacements,
growth and shrink, the load time."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel

from tests.helpers import (
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
from trioserve.runtime._handle import ProcessHandle, stop_process
from trioserve.runtime._pool import NICE, WarmPool
from trioserve.runtime._process import Started
from trioserve.runtime._procinfo import children, read_stat

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


def _state(pid: int) -> str | None:
    stat = read_stat(pid)
    return None if stat is None else stat.state


async def held(server: Server, count: int) -> list[int]:
    """Wait until the pool holds ``count`` processes, loading or ready; their pids."""
    pool = pool_of(server)
    with trio.fail_after(10):
        while len(pool.pids()) != count:
            await trio.sleep(0.01)
    return pool.pids()


async def turn_pid(server: Server, session_id: str, text: str = "hi", **kw: object) -> int:
    frames = await server.turn(session_id, text, **kw)
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
    await wait_gone(pid)  # the turn's process is reaped like any adapter


async def test_the_warm_process_gets_the_turn_spec(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    server = await start_server(warm_adapters=1)
    sid = (await server.create())["id"]
    await full(server)
    record = tmp_path / "spec.json"
    frames = await server.turn(sid, script({"record": str(record)}, {"end": "completed"}))
    assert frames[-1].data["data"]["reason"] == "completed"
    assert f'"sessionId":"{sid}"' in record.read_text()


async def test_a_warm_process_killed_while_idle_is_replaced_and_turns_go_on(
    start_server: ServerFactory,
) -> None:
    server = await start_server(warm_adapters=1)
    sid = (await server.create())["id"]
    (victim,) = await full(server)
    os.kill(victim, 9)
    await wait_gone(victim)  # dead (a zombie at least): it died while idle
    # At once: the turn must not get the dead process (a new one, or its own).
    pid = await turn_pid(server, sid)
    assert pid != victim
    replacement = await full(server)
    assert victim not in replacement


async def test_idle_processes_are_replaced_after_max_idle(start_server: ServerFactory) -> None:
    server = await start_server(warm_max_idle=0.3, warm_adapters=1)
    (first,) = await full(server)
    with trio.fail_after(10):
        while first in pool_of(server).pids():
            await trio.sleep(0.02)
    await wait_gone(first)  # stopped and reaped, not left behind
    (second,) = await full(server)
    assert second != first


async def test_stderr_printed_while_waiting_is_kept_with_the_turns(
    start_server: ServerFactory,
) -> None:
    command = [*FAKE_ADAPTER, "--startup-stderr", "loaded my libraries\n"]
    server = await start_server(command=command, warm_adapters=1)
    sid = (await server.create())["id"]
    await full(server)
    frames = await server.turn(sid, script({"stderr": "then died"}, {"exit": 3}))
    message = frames[-1].data["data"]["message"]
    assert "exited with status 3" in message
    assert "loaded my libraries" in message and "then died" in message


async def test_trace_context_starts_cold_with_it_in_the_environment(
    start_server: ServerFactory,
) -> None:
    server = await start_server(warm_adapters=1)
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
    server = await start_server(
        max_concurrent_turns=cap, warm_adapters=warm, warm_adapters_max=warm
    )
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


async def test_drain_stops_the_warm_processes_first(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    server = await start_server(shutdown_grace=30, warm_adapters=1)
    sid = (await server.create())["id"]
    await full(server)
    gate = tmp_path / "gate"
    async with server.client.stream(
        "POST",
        f"/v1/sessions/{sid}/turns",
        json={"input": script({"wait": str(gate)}, {"end": "completed"})},
    ) as resp:
        chunks = resp.aiter_text()
        await chunks.__anext__()  # the turn runs, until the gate opens
        warm = await full(server)
        server.stop.drain.set()
        for pid in warm:
            await wait_gone(pid)  # stopped while the turn still runs
        assert not server.done.is_set()
        gate.touch()
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
    await start_server(command=dies, spec=compiled_spec(), warm_adapters=1)
    await trio.sleep(1.5)
    deaths = [r for r in caplog.records if "exited while idle" in r.getMessage()]
    assert 2 <= len(deaths) <= 6, [r.getMessage() for r in deaths]
    assert "status 7" in deaths[0].getMessage() and "no runtime here" in deaths[0].getMessage()


async def test_readyz_reports_the_pool(start_server: ServerFactory) -> None:
    server = await start_server(warm_adapters=2, warm_adapters_max=3)
    await full(server)
    resp = await server.client.get("/readyz")
    assert (resp.status_code, resp.text) == (200, "ready\n")
    assert resp.headers["trioserve-warm-adapters"] == "2/2"
    resp = await server.client.get("/readyz", headers={"Accept": "application/json"})
    body = resp.json()
    warm = body["warmAdapters"]
    assert body["status"] == "ready"
    load_ms, cpu_ms = warm.pop("loadMs"), warm.pop("loadCpuMs")
    assert warm == {
        "ready": 2,
        "loading": 0,
        "paused": 0,
        "target": 2,
        "min": 2,
        "max": 3,
        "turnsPerLoad": 0,
        "standingDown": False,
    }
    assert isinstance(load_ms, int) and load_ms > 0  # learned from the two loads
    assert isinstance(cpu_ms, int) and cpu_ms > 0
    assert server.pool.loads.count == 2
    server.manager.start_draining()
    resp = await server.client.get("/readyz", headers={"Accept": "application/json"})
    assert resp.status_code == 503 and resp.json()["status"] == "draining"
    off = await start_server(warm_adapters=0)
    resp = await off.client.get("/readyz", headers={"Accept": "application/json"})
    assert resp.headers["trioserve-warm-adapters"] == "0/0"
    assert resp.json()["warmAdapters"] == {
        "ready": 0,
        "loading": 0,
        "paused": 0,
        "target": 0,
        "min": 0,
        "max": 0,
        "loadMs": None,
        "loadCpuMs": None,
        "turnsPerLoad": 0,
        "standingDown": False,
    }
    assert off.manager.pool is None


# -- loading and ready ---------------------------------------------------------------


def nice_of(pid: int) -> int:
    """Field 19 of /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])


async def readyz(server: Server) -> dict[str, Any]:
    resp = await server.client.get("/readyz", headers={"Accept": "application/json"})
    warm: dict[str, Any] = resp.json()["warmAdapters"]
    assert resp.headers["trioserve-warm-adapters"] == f"{warm['ready']}/{warm['target']}"
    return warm


async def test_readyz_never_counts_a_loading_process_as_ready(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    mark = tmp_path / "loaded"
    command = [*FAKE_ADAPTER, "--startup-sleep", "2", "--startup-mark", str(mark)]
    server = await start_server(command=command, warm_adapters=1)
    seen_loading = 0
    with trio.fail_after(30):
        while True:
            warm = await readyz(server)
            if warm["ready"]:
                assert await trio.Path(mark).exists(), "/readyz said ready before it had loaded"
                break
            assert warm["loadMs"] is None
            if warm["loading"] == 1:
                seen_loading += 1
            else:  # not spawned yet (a loaded machine); once loading, loading until ready
                assert (warm["loading"], seen_loading) == (0, 0), warm
            await trio.sleep(0.05)
    assert seen_loading >= 5  # it was seen loading for most of its 2 s
    warm = await readyz(server)
    assert (warm["ready"], warm["loading"]) == (1, 0)
    assert warm["loadMs"] >= 2000  # spawn to ready: the 2 s sleep and more


async def test_a_turn_takes_the_process_ready_longest_before_a_loading_one(
    start_server: ServerFactory,
) -> None:
    server = await start_server(command=[*FAKE_ADAPTER, "--startup-sleep", "1"], warm_adapters=2)
    sessions = [(await server.create())["id"] for _ in range(2)]
    pool = pool_of(server)
    await full(server)
    first, second = pool.ready_pids()
    assert await turn_pid(server, sessions[0]) == first
    await held(server, 2)
    loading = [pid for pid, state in pool.states().items() if state == "loading"]
    assert len(loading) == 1, pool.states()  # the replacement, still asleep
    assert await turn_pid(server, sessions[1]) == second, "ready goes before loading"


async def test_a_turn_waits_for_a_loading_process_rather_than_start_cold(
    start_server: ServerFactory,
) -> None:
    server = await start_server(command=[*FAKE_ADAPTER, "--startup-sleep", "1"], warm_adapters=1)
    sid = (await server.create())["id"]
    pool = pool_of(server)
    (first,) = await full(server)
    assert await turn_pid(server, sid) == first
    (replacement,) = await held(server, 1)
    assert pool.states()[replacement] == "loading"
    # Started before this turn, it will be ready sooner than a cold start.
    assert await turn_pid(server, sid) == replacement


async def test_a_loading_process_without_progress_is_passed_over(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    # The command loads by burning CPU; a process held up before the burn (a
    # shell waiting for a file) has none of the load done: a cold start
    # would be ready no later, so the turn starts cold and leaves it.
    gate = tmp_path / "gate"
    gate.touch()
    command = [
        "sh",
        "-c",
        '[ -e "$0" ] || sleep 60; exec "$@"',
        str(gate),
        *FAKE_ADAPTER,
        "--startup-burn",
        "0.5",
    ]
    server = await start_server(command=command, warm_adapters=1)
    sid = (await server.create())["id"]
    pool = pool_of(server)
    (first,) = await full(server)
    assert pool.loads.cpu is not None and pool.loads.cpu >= 0.5
    gate.unlink()
    assert await turn_pid(server, sid) == first
    (stuck,) = await held(server, 1)
    with trio.fail_after(10):
        # It found no gate: it sleeps, and waits for its sleep (on a busy machine a shell
        # that has forked but not yet reached its wait is still "R", as a load would be).
        while not children(stuck) or _state(stuck) != "S":
            await trio.sleep(0.01)
    assert pool.states()[stuck] == "loading"
    gate.touch()  # a cold start goes straight to its burn
    pid = await turn_pid(server, sid)
    assert pid != stuck, pool.stats()  # it has had none of the load's CPU: not nearly loaded
    assert pool.states() == {stuck: "loading"}, "it was left in the pool"


async def test_warm_processes_start_niced_and_turns_get_the_priority_back(
    start_server: ServerFactory,
) -> None:
    server = await start_server(warm_adapters=2)
    sid = (await server.create())["id"]
    base = os.getpriority(os.PRIO_PROCESS, 0)
    warm = await full(server)
    assert {nice_of(pid) for pid in warm} == {min(19, base + NICE)}
    frames = await server.turn(sid, script({"nice": True}, {"end": "completed"}))
    assert frames[0].data["data"]["pid"] in warm
    if os.geteuid() == 0:  # may raise priorities back
        assert frames[1].data["data"]["nice"] == base
    else:
        assert frames[1].data["data"]["nice"] == min(19, base + NICE)
    replacements = await full(server)
    assert {nice_of(pid) for pid in replacements} == {min(19, base + NICE)}


# -- holding back replacements -------------------------------------------------------


@asynccontextmanager
async def running_pool(pool: WarmPool) -> AsyncIterator[WarmPool]:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pool.run)
        try:
            yield pool
        finally:
            pool.close()


async def release(started: Started | None) -> None:
    assert started is not None
    await stop_process(started.proc, ProcessHandle(grace=1.0))


async def test_replacements_wait_for_the_first_event_when_cores_are_short() -> None:
    # One core, two turns running: the replacement waits for the turn's first event
    # (at most twice the load time: over 2 s here).
    command = [*FAKE_ADAPTER, "--startup-sleep", "1"]
    pool = WarmPool(command, 1, turns=lambda: 2, cpus=1, stop_grace=1.0)
    async with running_pool(pool):
        with trio.fail_after(20):
            await pool.wait_ready()
        first_event = trio.Event()
        started = await pool.take(first_event.wait)
        await trio.sleep(0.3)
        assert pool.pids() == [], "no replacement before the turn's first event"
        first_event.set()
        with trio.fail_after(20):
            await pool.wait_ready()
        await release(started)


async def test_replacements_start_at_once_when_cores_are_free() -> None:
    pool = WarmPool(FAKE_ADAPTER, 1, turns=lambda: 0, cpus=2, stop_grace=1.0)
    async with running_pool(pool):
        with trio.fail_after(20):
            await pool.wait_ready()
        first_event = trio.Event()  # never set: the turn has not had its first event
        started = await pool.take(first_event.wait)
        with trio.fail_after(20):
            await pool.wait_ready()
        assert not first_event.is_set()
        await release(started)


# -- size ------------------------------------------------------------------------------


async def test_the_pool_grows_with_the_turn_rate_and_shrinks_back_when_idle() -> None:
    command = [*FAKE_ADAPTER, "--startup-sleep", "0.3"]
    pool = WarmPool(command, 1, max_size=3, max_idle=1.5, stop_grace=1.0)
    async with running_pool(pool):
        with trio.fail_after(20):
            await pool.wait_ready()
        assert pool.target == 1
        taken = [await pool.take() for _ in range(5)]  # five turns within one load time
        assert pool.target == 3, "grown to its maximum, no further"
        assert len(pool.pids()) <= 3
        # Generous bounds: the pool's loads run at nice 10, and on a machine the
        # rest of the suite keeps busy they get what the tests leave.
        with trio.fail_after(90):
            await pool.wait_ready(3)
        assert len(pool.pids()) == 3
        for started in taken:
            if started is not None:
                await release(started)
        # Nobody takes them: the ones above the floor go after max_idle.
        with trio.fail_after(60):
            while pool.target > 1 or len(pool.pids()) > 1:
                assert len(pool.pids()) <= 3
                await trio.sleep(0.05)
        assert pool.stats().floor == 1 and pool.stats().ceiling == 3


async def test_the_process_count_stays_within_the_cap_plus_the_pool_maximum(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    cap, floor, ceiling = 2, 1, 3
    server = await start_server(
        command=[*FAKE_ADAPTER, "--startup-sleep", "0.2"],
        max_concurrent_turns=cap,
        warm_adapters=floor,
        warm_adapters_max=ceiling,
    )
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
        for _ in range(4):
            resp = await server.client.post(f"/v1/sessions/{sid}/turns", json={"input": quick})
            statuses.append(resp.status_code)

    async with trio.open_nursery() as turns:
        for sid in sessions:
            turns.start_soon(burst, sid)
    sampling = False
    assert set(statuses) <= {200, 429} and statuses.count(200) >= 4
    assert pool_of(server).target > floor, "the burst grew the pool"
    assert 0 < peak <= cap + ceiling, peak


async def test_cpu_bound_loads_start_no_faster_than_cores_free_up() -> None:
    # One CPU: a load that burns CPU has it to itself; the next waits.
    command = [*FAKE_ADAPTER, "--startup-burn", "0.3"]
    pool = WarmPool(command, 1, max_size=3, stop_grace=1.0, cpus=1)
    async with running_pool(pool):
        with trio.fail_after(20):
            await pool.wait_ready()
        assert pool.loads.cpu_work
        taken = [await pool.take() for _ in range(3)]
        assert pool.target == 3
        most = 0
        with trio.fail_after(30):
            while pool.ready < 3:
                most = max(most, pool.loading)
                await trio.sleep(0.01)
        assert most == 1, "one load at a time on one core"
        for started in taken:
            if started is not None:
                await release(started)
