"""The scheduler's passes at chosen times (``CronScheduler.tick(now)``) on a real server:
a fire whose claimer died is started once, missed fires follow ``catchUp``, ``endAt``.

Each cron here is daily at noon UTC, so the server's own scheduler (on the real
clock) leaves it alone while these passes are told it is days later.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from tests.helpers import Server, ServerFactory
from trioserve.sessions import Crons, CronScheduler, Turn
from trioserve.stores.crons import CronRun

DAY = timedelta(days=1)
SECOND = timedelta(seconds=1)


async def daily(server: Server, **fields: Any) -> tuple[str, datetime]:
    body = {"schedule": "0 12 * * *", "input": "noon", "inputs": {}} | fields
    resp = await server.client.post("/v1/crons", json=body)
    assert resp.status_code == 201, resp.text
    cron = await server.manager.store.get_cron(resp.json()["id"])
    assert cron.next_run_at is not None
    return cron.id, cron.next_run_at


async def sessions(server: Server) -> list[dict[str, Any]]:
    return list((await server.client.get("/v1/sessions")).json())


async def test_a_fire_whose_claimer_died_after_starting_its_turn_is_not_started_again(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    store = server.manager.store
    cron_id, slot = await daily(server)
    # A process claims the fire, starts its turn, and dies before it records the run.
    dead = CronScheduler(server.manager, Crons(server.manager))
    claim = CronRun(cron_id, slot, owner="dead:1:x", lease_expires_at=slot + 2 * SECOND)
    assert await store.claim_fire(cron_id, slot, slot + DAY, claim)
    key = f"cron:{cron_id}:{(slot - datetime(1970, 1, 1, tzinfo=slot.tzinfo)) // SECOND * 10**6}"
    session, _ = await dead.keyed.create_session(f"{key}:session", {}, tenant=None)
    first = await dead.keyed.start_turn(
        f"{key}:turn",
        session.id,
        "noon",
        detach=True,
        on_disconnect="continue",
        tenant=None,
        multitask="reject",
    )
    assert isinstance(first, Turn)
    # A survivor's pass after the lease: it takes the fire over, and finds its turn.
    survivor = CronScheduler(server.manager, Crons(server.manager))
    await survivor.tick(slot + 5 * SECOND)
    (run,) = await store.list_runs(cron_id)
    assert (run.status, run.turn_id, run.session_id) == ("started", first.id, session.id)
    assert [s["id"] for s in await sessions(server)] == [session.id]
    turns = (await server.client.get(f"/v1/sessions/{session.id}/turns")).json()
    assert [t["id"] for t in turns] == [first.id]
    await survivor.tick(slot + 20 * SECOND)  # nothing more to do
    assert len(await store.list_runs(cron_id)) == 1 and len(await sessions(server)) == 1


async def test_a_fire_whose_claimer_died_before_its_turn_is_started_once(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    store = server.manager.store
    cron_id, slot = await daily(server)
    claim = CronRun(cron_id, slot, owner="dead:1:x", lease_expires_at=slot + 2 * SECOND)
    assert await store.claim_fire(cron_id, slot, slot + DAY, claim)
    survivors = [CronScheduler(server.manager, Crons(server.manager)) for _ in range(2)]
    await survivors[0].tick(slot + SECOND)  # the lease holds: not taken over yet
    assert (await store.list_runs(cron_id))[0].status == "claimed"
    for survivor in survivors:
        await survivor.tick(slot + 5 * SECOND)
    (run,) = await store.list_runs(cron_id)
    assert run.status == "started" and run.turn_id is not None
    assert [s["id"] for s in await sessions(server)] == [run.session_id]


async def test_catch_up_once_fires_one_turn_for_every_missed_fire(
    start_server: ServerFactory,
) -> None:
    server = await start_server(cron_misfire_grace=60.0)
    store = server.manager.store
    cron_id, slot = await daily(server, catchUp="once")
    scheduler = CronScheduler(server.manager, Crons(server.manager))
    now = slot + 3 * DAY + timedelta(hours=1)  # down for 4 noons
    await scheduler.tick(now)
    (run,) = await store.list_runs(cron_id)
    assert (run.status, run.missed, run.scheduled_at) == ("started", 3, slot)
    assert len(await sessions(server)) == 1
    assert (await store.get_cron(cron_id)).next_run_at == slot + 4 * DAY
    await scheduler.tick(now + SECOND)  # no burst
    assert len(await store.list_runs(cron_id)) == 1
    await scheduler.tick(slot + 4 * DAY + 10 * SECOND)  # the next noon, on time
    latest = (await store.list_runs(cron_id))[0]
    assert (latest.status, latest.missed, latest.scheduled_at) == ("started", 0, slot + 4 * DAY)
    assert len(await sessions(server)) == 2
    shown = (await server.client.get(f"/v1/crons/{cron_id}")).json()["lastRuns"]
    assert [r["missed"] for r in shown] == [0, 3]


async def test_catch_up_skip_records_the_missed_fires_and_starts_no_turn(
    start_server: ServerFactory,
) -> None:
    server = await start_server(cron_misfire_grace=60.0)
    store = server.manager.store
    cron_id, slot = await daily(server)  # catchUp: skip, the default
    scheduler = CronScheduler(server.manager, Crons(server.manager))
    await scheduler.tick(slot + 2 * DAY + 30 * SECOND)  # the third noon is within the grace
    runs = await store.list_runs(cron_id)
    assert [(r.status, r.reason, r.missed, r.turn_id) for r in runs] == [
        ("skipped", "missed", 1, None)
    ]
    assert (await store.get_cron(cron_id)).next_run_at == slot + 2 * DAY
    assert await sessions(server) == []
    await scheduler.tick(slot + 2 * DAY + 31 * SECOND)
    runs = await store.list_runs(cron_id)
    assert [(r.status, r.reason, r.missed) for r in runs] == [
        ("started", None, 0),
        ("skipped", "missed", 1),
    ]
    assert runs[0].scheduled_at == slot + 2 * DAY  # late, within the grace: fired
    assert len(await sessions(server)) == 1
    metrics = (await server.client.get("/metrics")).text
    assert 'trioserve_cron_skips_total{reason="missed"} 2.0' in metrics


async def test_no_fire_after_end_at(start_server: ServerFactory) -> None:
    server = await start_server()
    store = server.manager.store
    cron_id, slot = await daily(server)
    end = (slot + DAY + SECOND).isoformat()
    resp = await server.client.patch(f"/v1/crons/{cron_id}", json={"endAt": end})
    assert resp.status_code == 200, resp.text
    scheduler = CronScheduler(server.manager, Crons(server.manager))
    await scheduler.tick(slot + SECOND)
    await scheduler.tick(slot + DAY + SECOND)
    assert (await store.get_cron(cron_id)).next_run_at is None
    await scheduler.tick(slot + 2 * DAY + SECOND)
    runs = await store.list_runs(cron_id)
    assert [r.scheduled_at for r in runs] == [slot + DAY, slot]
    assert len(await sessions(server)) == 2
