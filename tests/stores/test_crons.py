"""The store contract's crons (``stores.crons``), run against every backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
import trio

from trioserve.errors import CronCapReached, CronNotFound, StoreError
from trioserve.stores import SessionKey, Store, open_store
from trioserve.stores.crons import KEEP_RUNS, CronRecord, CronRun

T0 = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
SECOND = timedelta(seconds=1)


@pytest.fixture
async def store(backend_url: str) -> AsyncIterator[Store]:
    opened = await open_store(backend_url)
    try:
        yield opened
    finally:
        await opened.close()


def cron(cid: str = "c1", tenant: str | None = None, second: int = 0) -> CronRecord:
    created = T0 + second * SECOND
    return CronRecord(
        id=cid,
        tenant=tenant,
        schedule="@every 1s",
        timezone="Europe/Paris",
        input="nul \x00 and ünïcode",
        session_id=None,
        inputs={"name": "Ada"},
        multitask="skip",
        catch_up="once",
        enabled=True,
        created_at=created,
        updated_at=created,
        next_run_at=T0 + 10 * SECOND,
        anchor_at=created,
        end_at=T0 + timedelta(days=1),
        webhook="https://example.invalid/hook",
    )


async def test_a_cron_round_trips_and_is_deleted_with_its_runs(store: Store) -> None:
    await store.create_cron(cron())
    assert await store.get_cron("c1") == cron()
    with pytest.raises(StoreError):
        await store.create_cron(cron())
    assert await store.claim_fire("c1", T0 + 10 * SECOND, T0 + 11 * SECOND, CronRun("c1", T0))
    assert await store.delete_cron("c1") is True
    assert await store.delete_cron("c1") is False
    with pytest.raises(CronNotFound):
        await store.get_cron("c1")
    with pytest.raises(CronNotFound):
        await store.get_cron("c\x00")
    assert await store.list_runs("c1") == []


async def test_crons_are_listed_per_tenant_newest_first_in_pages(store: Store) -> None:
    for i in range(5):
        await store.create_cron(cron(f"a{i}", "alpha", second=i))
    await store.create_cron(cron("b0", "beta"))
    await store.create_cron(cron("n0", None))
    first = await store.list_crons(tenant="alpha", limit=2)
    assert [c.id for c in first] == ["a4", "a3"]
    rest = await store.list_crons(tenant="alpha", before=first[-1].key)
    assert [c.id for c in rest] == ["a2", "a1", "a0"]
    assert [c.id for c in await store.list_crons(tenant="beta")] == ["b0"]
    assert [c.id for c in await store.list_crons()] == ["n0"]
    assert await store.list_crons(tenant="gamma") == []
    assert await store.list_crons(tenant="alpha", before=SessionKey(T0, "a0")) == []


async def test_the_tenant_cap_is_exact_under_racing_creates(store: Store) -> None:
    outcomes: list[str] = []

    async def one(i: int) -> None:
        try:
            await store.create_cron(cron(f"c{i}", "alpha"), max_per_tenant=3)
            outcomes.append("made")
        except CronCapReached:
            outcomes.append("capped")

    async with trio.open_nursery() as nursery:
        for i in range(8):
            nursery.start_soon(one, i)
    assert sorted(outcomes) == ["capped"] * 5 + ["made"] * 3
    await store.create_cron(cron("other", "beta"), max_per_tenant=3)  # another tenant's count


async def test_update_replaces_the_mutable_fields_only(store: Store) -> None:
    await store.create_cron(cron(tenant="alpha"))
    changed = replace(
        cron(tenant="beta"),
        created_at=T0 + timedelta(days=3),
        enabled=False,
        next_run_at=None,
        schedule="0 * * * *",
        inputs=None,
        session_id="s1",
    )
    kept = await store.update_cron(changed, reschedule=False)
    assert kept.next_run_at == T0 + 10 * SECOND and kept.anchor_at == T0
    assert kept.schedule == "0 * * * *" and kept.enabled is False
    stored = await store.update_cron(replace(changed, anchor_at=T0 + SECOND), reschedule=True)
    assert stored.tenant == "alpha" and stored.created_at == T0
    assert (stored.enabled, stored.next_run_at, stored.schedule) == (False, None, "0 * * * *")
    assert stored.session_id == "s1" and stored.inputs is None
    assert stored.anchor_at == T0 + SECOND
    assert await store.get_cron("c1") == stored
    with pytest.raises(CronNotFound):
        await store.update_cron(cron("nope"), reschedule=True)


async def test_only_enabled_due_crons_are_due_soonest_first(store: Store) -> None:
    await store.create_cron(replace(cron("late"), next_run_at=T0 + 5 * SECOND))
    await store.create_cron(replace(cron("soon"), next_run_at=T0 + 2 * SECOND))
    await store.create_cron(replace(cron("off"), next_run_at=T0, enabled=False))
    await store.create_cron(replace(cron("never"), next_run_at=None))
    await store.create_cron(replace(cron("later"), next_run_at=T0 + 60 * SECOND))
    due = await store.due_crons(T0 + 5 * SECOND)
    assert [c.id for c in due] == ["soon", "late"]
    assert [c.id for c in await store.due_crons(T0 + 5 * SECOND, limit=1)] == ["soon"]


async def test_a_slot_is_claimed_once_of_many_racing_claims(store: Store) -> None:
    slot = T0 + 10 * SECOND
    await store.create_cron(cron())
    won: list[int] = []

    async def claim(i: int) -> None:
        run = CronRun("c1", slot, owner=f"p{i}", lease_expires_at=slot + 10 * SECOND)
        if await store.claim_fire("c1", slot, slot + SECOND, run):
            won.append(i)

    async with trio.open_nursery() as nursery:
        for i in range(6):
            nursery.start_soon(claim, i)
    assert len(won) == 1
    (run,) = await store.list_runs("c1")
    assert (run.owner, run.status, run.scheduled_at) == (f"p{won[0]}", "claimed", slot)
    assert (await store.get_cron("c1")).next_run_at == slot + SECOND
    assert not await store.claim_fire("c1", slot, slot + SECOND, CronRun("c1", slot))
    assert not await store.claim_fire("nope", slot, None, None)


async def test_a_disabled_cron_is_not_claimed(store: Store) -> None:
    await store.create_cron(replace(cron(), enabled=False))
    assert not await store.claim_fire("c1", T0 + 10 * SECOND, None, None)


async def test_a_run_is_finished_once_and_kept_with_its_turn(store: Store) -> None:
    slot = T0 + 10 * SECOND
    await store.create_cron(cron())
    await store.claim_fire("c1", slot, slot + SECOND, CronRun("c1", slot, owner="p", missed=4))
    done = CronRun("c1", slot, "started", fired_at=slot + SECOND / 2, session_id="s1", turn_id="t1")
    assert await store.finish_run(done)
    assert not await store.finish_run(replace(done, status="failed"))
    (run,) = await store.list_runs("c1")
    assert (run.status, run.turn_id, run.session_id, run.missed) == ("started", "t1", "s1", 4)
    assert run.fired_at == slot + SECOND / 2
    with pytest.raises(ValueError):
        await store.finish_run(replace(done, status="claimed"))
    with pytest.raises(ValueError):
        await store.finish_run(replace(done, status="bogus"))


async def test_stale_claims_go_to_one_survivor(store: Store) -> None:
    await store.create_cron(cron())
    slots = [T0 + i * SECOND for i in range(10, 13)]
    for slot in slots:
        run = CronRun("c1", slot, owner="dead", lease_expires_at=slot + 5 * SECOND)
        assert await store.claim_fire("c1", slot, slot + SECOND, run)
    await store.finish_run(CronRun("c1", slots[2], "started", turn_id="t"))
    now = T0 + 16 * SECOND  # the first lease (15 s) passed, the second (16 s) not yet
    found: list[list[CronRun]] = []

    async def claim(owner: str) -> None:
        found.append(await store.claim_stale_runs(owner, now + 10 * SECOND, now=now))

    async with trio.open_nursery() as nursery:
        for owner in ("a", "b", "c"):
            nursery.start_soon(claim, owner)
    claimed = [run for runs in found for run in runs]
    assert [run.scheduled_at for run in claimed] == [slots[0]]
    assert claimed[0].lease_expires_at == now + 10 * SECOND
    assert claimed[0].owner in ("a", "b", "c")


async def test_only_the_newest_runs_are_kept(store: Store) -> None:
    await store.create_cron(replace(cron(), next_run_at=T0))
    for i in range(KEEP_RUNS + 5):
        slot = T0 + i * SECOND
        assert await store.claim_fire("c1", slot, slot + SECOND, CronRun("c1", slot))
        await store.finish_run(CronRun("c1", slot, "skipped", reason="busy"))
    runs = await store.list_runs("c1", limit=1000)
    assert len(runs) == KEEP_RUNS
    assert runs[0].scheduled_at == T0 + (KEEP_RUNS + 4) * SECOND
    assert [r.scheduled_at for r in await store.list_runs("c1", limit=2)] == [
        T0 + (KEEP_RUNS + 4) * SECOND,
        T0 + (KEEP_RUNS + 3) * SECOND,
    ]
