"""Crons across real ``trioserve run`` replicas on one PostgreSQL database, and across a
restart: one turn per fire (no duplicate, no gap), a ``kill -9`` of the process running a
fire, fires missed while no server was up.

The replicas' tests skip when PostgreSQL is not reachable (they fail under ``CI=true``).
"""

from __future__ import annotations

import itertools
import signal
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.helpers import CLIServer, ServerFactory, script, start_cli_server, write_spec
from trioserve.stores import Store, open_store
from trioserve.stores.crons import CronRun


async def replicas(
    nursery: trio.Nursery, tmp_path: Path, store_url: str, launched: list[CLIServer]
) -> list[CLIServer]:
    spec = write_spec(tmp_path)
    for _ in range(2):
        launched.append(
            await start_cli_server(
                nursery, tmp_path, spec, "--store", store_url, "--turn-lease", "2s"
            )
        )
    return launched[-2:]


async def runs_of(store: Store, cron_id: str) -> list[CronRun]:
    """Every run of the cron (the store keeps 50), oldest first."""
    return list(reversed(await store.list_runs(cron_id, limit=1000)))


async def wait_runs(store: Store, cron_id: str, count: int, within: float) -> list[CronRun]:
    """Wait until ``count`` of the cron's runs have finished (started, skipped, ...)."""
    with trio.fail_after(within):
        while sum(run.status != "claimed" for run in await runs_of(store, cron_id)) < count:
            await trio.sleep(0.1)
    return await runs_of(store, cron_id)


async def stop_and_settle(url: str, store: Store, cron_id: str) -> list[CronRun]:
    """Disable the cron, wait until no run of it is still claimed; its runs."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        resp = await client.patch(f"/v1/crons/{cron_id}", json={"enabled": False})
        assert resp.status_code == 200, resp.text
    with trio.fail_after(60):
        while True:
            runs = await runs_of(store, cron_id)
            if all(run.status != "claimed" for run in runs):
                return runs
            await trio.sleep(0.1)


@asynccontextmanager
async def opened(url: str) -> AsyncIterator[Store]:
    store = await open_store(url)
    try:
        yield store
    finally:
        await store.close()


async def check_one_turn_per_fire(url: str, runs: list[CronRun], step: float) -> None:
    """Consecutive slots ``step`` apart (no gap), each started one turn on a session of its
    own, and no other session or turn exists (no duplicate)."""
    slots = [run.scheduled_at for run in runs]
    assert all(b - a == timedelta(seconds=step) for a, b in itertools.pairwise(slots)), slots
    assert [run.status for run in runs] == ["started"] * len(runs), runs
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        sessions = (await client.get("/v1/sessions")).json()
        assert sorted(s["id"] for s in sessions) == sorted(str(run.session_id) for run in runs)
        for run in runs:
            turns = (await client.get(f"/v1/sessions/{run.session_id}/turns")).json()
            assert [t["id"] for t in turns] == [run.turn_id], (run, turns)


async def test_two_replicas_run_one_turn_per_fire_for_ten_seconds(
    nursery: trio.Nursery, tmp_path: Path, store_url: str, launched: list[CLIServer]
) -> None:
    a, b = await replicas(nursery, tmp_path, store_url, launched)
    async with httpx.AsyncClient(base_url=a.url, timeout=30) as client:
        resp = await client.post("/v1/crons", json={"schedule": "@every 1s", "input": "tick"})
        assert resp.status_code == 201, resp.text
        cron_id = resp.json()["id"]
    async with opened(store_url) as store:
        await wait_runs(store, cron_id, 10, within=120)
        runs = await stop_and_settle(b.url, store, cron_id)
    assert len(runs) >= 10
    await check_one_turn_per_fire(a.url, runs, 1.0)
    fired = [line for s in (a, b) for line in s.log.splitlines() if "cron fired" in line]
    assert len(fired) == len(runs), fired  # one log line per fire, on the one that ran it


async def test_kill_9_of_the_replica_running_a_fire_runs_it_once(
    nursery: trio.Nursery, tmp_path: Path, store_url: str, launched: list[CLIServer]
) -> None:
    async with AsyncExitStack() as stack:
        await _kill_9(nursery, tmp_path, store_url, launched, stack)


async def _kill_9(
    nursery: trio.Nursery,
    tmp_path: Path,
    store_url: str,
    launched: list[CLIServer],
    stack: AsyncExitStack,
) -> None:
    servers = await replicas(nursery, tmp_path, store_url, launched)
    store = await stack.enter_async_context(opened(store_url))
    slow = script({"event": "message", "data": {"text": "working"}}, {"sleep": 3}, {"end": "ok"})
    async with httpx.AsyncClient(base_url=servers[0].url, timeout=30) as client:
        body = {"schedule": "@every 2s", "input": slow}
        resp = await client.post("/v1/crons", json=body)
        assert resp.status_code == 201, resp.text
        cron_id = resp.json()["id"]
        first = (await wait_runs(store, cron_id, 1, within=60))[0]
        assert first.status == "started", first
        with trio.fail_after(60):  # the first fire's turn runs: on which replica?
            while True:
                events = await client.get(
                    f"/v1/sessions/{first.session_id}/events", params={"format": "json"}
                )
                started = [e for e in events.json() if e["type"] == "session.started"]
                if started:
                    break
                await trio.sleep(0.1)
    ppid = started[0]["data"]["ppid"]
    (victim,) = [s for s in servers if s.proc.pid == ppid]
    (survivor,) = [s for s in servers if s is not victim]
    victim.signal(signal.SIGKILL)
    await victim.wait()
    await wait_runs(store, cron_id, 5, within=120)
    runs = await stop_and_settle(survivor.url, store, cron_id)
    await check_one_turn_per_fire(survivor.url, runs, 2.0)
    async with httpx.AsyncClient(base_url=survivor.url, timeout=30) as client:
        path = f"/v1/sessions/{first.session_id}/turns/{first.turn_id}"
        with trio.fail_after(60):  # its lease passes: the survivor closes it, once
            while (turn := (await client.get(path)).json())["status"] == "running":
                await trio.sleep(0.2)
    assert turn["status"] == "interrupted", turn


async def test_fires_missed_while_no_server_was_up_follow_catch_up(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    store = f"sqlite:{tmp_path / 'crons.db'}"
    server = await start_server(store=store, cron_misfire_grace=1.0)
    made: dict[str, str] = {}
    for catch_up in ("skip", "once"):
        body = {"schedule": "@every 1s", "input": catch_up, "catchUp": catch_up}
        resp = await server.client.post("/v1/crons", json=body)
        made[catch_up] = resp.json()["id"]
    await server.client.aclose()
    server.stop.drain.set()  # no server is up from here
    with trio.fail_after(30):
        await server.done.wait()
    before: set[datetime] = set()
    async with opened(store) as stopped:  # the runs of the first server
        for cron_id in made.values():
            before |= {run.scheduled_at for run in await runs_of(stopped, cron_id)}
    await trio.sleep(4)  # fires missed while down: 3 or more each
    again = await start_server(store=store, cron_misfire_grace=1.0)
    shown: dict[str, list[dict[str, Any]]] = {}
    with trio.fail_after(60):
        for catch_up, cron_id in made.items():
            while True:
                runs = (await again.client.get(f"/v1/crons/{cron_id}")).json()["lastRuns"][::-1]
                after = [r for r in runs if datetime.fromisoformat(r["scheduledAt"]) not in before]
                if len([r for r in after if r["status"] != "claimed"]) >= 3:
                    shown[catch_up] = [r for r in after if r["status"] != "claimed"]
                    break
                await trio.sleep(0.05)
    for cron_id in made.values():
        await again.client.patch(f"/v1/crons/{cron_id}", json={"enabled": False})
    skip, once = shown["skip"], shown["once"]
    # skip: one run records them all, with no turn; once: one turn for them all. Never a burst.
    assert (skip[0]["status"], skip[0]["reason"], skip[0]["turnId"]) == ("skipped", "missed", None)
    assert skip[0]["missed"] >= 2, skip
    assert once[0]["status"] == "started", once
    assert once[0]["missed"] >= 2 and once[0]["turnId"] is not None, once
    for runs in (skip, once):
        # Then on schedule again, from the first fire within the grace.
        assert [r["status"] for r in runs[1:]] == ["started"] * (len(runs) - 1), runs
        assert all(r["missed"] == 0 for r in runs[1:]), runs
    for runs in (skip, once):
        # The missed run stands for the fires up to the next run's: no other run, no turn,
        # for those (a run is the only way a fire starts a turn), and none lost.
        first, then = (datetime.fromisoformat(r["scheduledAt"]) for r in runs[:2])
        assert then - first == timedelta(seconds=runs[0]["missed"] + 1), runs
