"""The store contract's webhook outbox (``stores.outbox``), run against every backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
import trio

from trioserve.errors import LogConflict
from trioserve.protocol import SessionStatus, TurnStatus
from trioserve.stores import Session, Store, TurnEnd, TurnRecord, open_store
from trioserve.stores.approvals import ApprovalRecord
from trioserve.stores.outbox import TURN_ENDED, TURN_WAITING, WebhookDelivery

T0 = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
LATER = T0 + timedelta(minutes=5)


@pytest.fixture
async def store(backend_url: str) -> AsyncIterator[Store]:
    opened = await open_store(backend_url)
    try:
        yield opened
    finally:
        await opened.close()


async def running_turn(store: Store) -> None:
    await store.create(Session("s1", "agent", "pi", SessionStatus.ACTIVE, T0, T0))
    await store.create_turn(TurnRecord("t1", "s1", "hi", TurnStatus.RUNNING, T0))


def delivery(
    did: str, turn_id: str | None = "t1", payload: str | None = None, second: int = 0
) -> WebhookDelivery:
    at = T0 + timedelta(seconds=second)
    return WebhookDelivery(did, TURN_ENDED, "https://hooks.test/x", "s1", turn_id, payload, at, at)


async def test_a_turns_delivery_is_due_only_once_the_turn_is_finished(store: Store) -> None:
    await store.enqueue_webhooks([delivery("m1")])  # before its turn, as the manager does
    assert await store.claim_webhooks("w1", LATER, now=LATER) == []  # no turn yet
    await running_turn(store)
    assert await store.claim_webhooks("w1", LATER, now=LATER) == []  # running
    await store.append_events("s1", "t1", [], end=TurnEnd(TurnStatus.FAILED, "x", T0))
    (claimed,) = await store.claim_webhooks("w1", LATER + timedelta(seconds=30), now=LATER)
    assert (claimed.id, claimed.owner, claimed.attempts) == ("m1", "w1", 0)
    assert claimed.first_attempt_at == LATER and claimed.payload is None
    assert claimed.lease_expires_at == LATER + timedelta(seconds=30)
    # Held by w1 until the lease passes: nobody else gets it meanwhile.
    assert await store.claim_webhooks("w2", LATER, now=LATER + timedelta(seconds=1)) == []
    (again,) = await store.claim_webhooks("w2", LATER, now=LATER + timedelta(seconds=31))
    assert again.owner == "w2" and again.first_attempt_at == LATER  # the first attempt's


async def test_a_failed_attempt_keeps_the_body_and_waits_for_its_retry(store: Store) -> None:
    await running_turn(store)
    await store.append_events("s1", "t1", [], end=TurnEnd(TurnStatus.COMPLETED, "done", T0))
    await store.enqueue_webhooks([delivery("m1")])
    await store.claim_webhooks("w1", LATER, now=T0)
    retry = T0 + timedelta(seconds=10)
    assert not await store.webhook_failed("m1", "w2", retry_at=retry, error="e", payload="{}")
    assert await store.webhook_failed("m1", "w1", retry_at=retry, error="503", payload='{"a":1}')
    assert await store.claim_webhooks("w1", LATER, now=T0 + timedelta(seconds=9)) == []
    (claimed,) = await store.claim_webhooks("w1", LATER, now=retry)
    assert (claimed.attempts, claimed.last_error, claimed.payload) == (1, "503", '{"a":1}')
    # A kept payload is never replaced: every attempt sends the same bytes.
    await store.webhook_failed("m1", "w1", retry_at=retry, error="500", payload='{"b":2}')
    (claimed,) = await store.claim_webhooks("w1", LATER, now=retry)
    assert (claimed.attempts, claimed.payload) == (2, '{"a":1}')
    assert await store.pending_webhooks() == 1
    assert await store.finish_webhook("m1")
    assert not await store.finish_webhook("m1")
    assert await store.pending_webhooks() == 0


async def test_enqueue_is_idempotent_and_other_events_are_due_at_once(store: Store) -> None:
    await store.enqueue_webhooks([delivery("m1", turn_id=None, payload='{"e":1}')])
    await store.enqueue_webhooks([delivery("m1", turn_id=None, payload='{"e":2}')])  # a repeat
    assert await store.pending_webhooks() == 1
    (claimed,) = await store.claim_webhooks("w1", LATER, now=T0)
    assert claimed.payload == '{"e":1}' and claimed.turn_id is None
    with pytest.raises(ValueError, match="payload"):
        await store.enqueue_webhooks([delivery("m2", turn_id=None)])
    with pytest.raises(ValueError, match="NUL"):
        await store.enqueue_webhooks([delivery("m\x00")])


async def test_claims_are_ordered_limited_and_exclusive(store: Store) -> None:
    await running_turn(store)
    await store.append_events("s1", "t1", [], end=TurnEnd(TurnStatus.COMPLETED, "done", T0))
    await store.enqueue_webhooks([delivery(f"m{i}", second=10 - i) for i in range(10)])
    first = await store.claim_webhooks("w1", LATER, now=LATER, limit=3)
    assert [d.id for d in first] == ["m9", "m8", "m7"]  # the earliest due first
    claimed: dict[str, list[str]] = {}

    async def claim(owner: str) -> None:
        got = await store.claim_webhooks(owner, LATER, now=LATER, limit=10)
        claimed[owner] = [d.id for d in got]

    async with trio.open_nursery() as nursery:
        for owner in ("a", "b", "c"):
            nursery.start_soon(claim, owner)
    every = sorted(i for ids in claimed.values() for i in ids)
    assert every == sorted(f"m{i}" for i in range(7))  # each once, none of w1's


async def test_unborn_and_orphaned_deliveries_are_dropped(store: Store) -> None:
    await running_turn(store)
    await store.enqueue_webhooks([delivery("born"), delivery("unborn", turn_id="never")])
    assert await store.drop_unborn_webhooks("t1") == 0  # its turn is stored: kept
    assert await store.drop_unborn_webhooks("never") == 1
    await store.enqueue_webhooks([delivery("late", turn_id="gone")])
    assert await store.purge_webhooks(T0) == 0  # not older than the cutoff
    assert await store.purge_webhooks(LATER) == 1  # "gone": no turn, no payload
    assert await store.pending_webhooks() == 1  # "born" waits for its turn's end


async def test_a_waiting_turns_end_is_not_due_and_its_urls_are_listed(store: Store) -> None:
    """A turn parked for an approval (``waiting``) has not ended: its ``turn.ended`` waits;
    ``turn_webhook_urls`` names where its end goes (for its ``turn.waiting``)."""
    other = WebhookDelivery("m2", TURN_ENDED, "https://b.test/y", "s1", "t1", None, T0, T0)
    await store.enqueue_webhooks([delivery("m1"), other])
    await running_turn(store)
    approval = ApprovalRecord("ap_1", "s1", "t1", {"tool": "add"}, T0, LATER)
    await store.park_turn("s1", "t1", approval)
    assert (await store.get_turn("s1", "t1")).status is TurnStatus.WAITING
    assert await store.claim_webhooks("w1", LATER, now=LATER) == []  # not ended: not due
    assert await store.turn_webhook_urls("t1") == ["https://b.test/y", "https://hooks.test/x"]
    assert await store.turn_webhook_urls("t9") == []
    waiting = WebhookDelivery("m3", TURN_WAITING, "https://b.test/y", "s1", "t1", "{}", T0, T0)
    await store.enqueue_webhooks([waiting])  # rendered when it parked: due at once
    (claimed,) = await store.claim_webhooks("w1", LATER, now=LATER)
    assert (claimed.id, claimed.event) == ("m3", TURN_WAITING)


def waiting_delivery(did: str, payload: str = '{"type":"turn.waiting"}') -> WebhookDelivery:
    return WebhookDelivery(did, TURN_WAITING, "https://b.test/y", "s1", "t1", payload, T0, T0)


async def test_a_park_stores_its_turn_waiting_deliveries_in_the_same_step(store: Store) -> None:
    """``park_turn`` with the turn's ``turn.waiting`` deliveries: parked and due together,
    and a park refused stores none of them (a crash between the two would have lost them)."""
    await running_turn(store)
    first = ApprovalRecord("ap_1", "s1", "t1", {"tool": "add"}, T0, LATER)
    await store.park_turn("s1", "t1", first, [waiting_delivery("w_a"), waiting_delivery("w_b")])
    assert (await store.get_turn("s1", "t1")).status is TurnStatus.WAITING
    assert await store.pending_webhooks() == 2
    claimed = await store.claim_webhooks("w1", LATER, now=LATER)
    assert sorted((d.id, d.event, d.payload) for d in claimed) == [
        ("w_a", TURN_WAITING, '{"type":"turn.waiting"}'),
        ("w_b", TURN_WAITING, '{"type":"turn.waiting"}'),
    ]
    second = ApprovalRecord("ap_2", "s1", "t1", {"tool": "add"}, T0, LATER)
    with pytest.raises(LogConflict):  # waiting, not running: nothing changes
        await store.park_turn("s1", "t1", second, [waiting_delivery("w_c")])
    assert await store.pending_webhooks() == 2
    assert [a.id for a in await store.list_approvals("s1")] == ["ap_1"]


async def test_a_park_refuses_a_delivery_with_no_payload_and_changes_nothing(
    store: Store,
) -> None:
    await running_turn(store)
    approval = ApprovalRecord("ap_1", "s1", "t1", {"tool": "add"}, T0, LATER)
    bare = WebhookDelivery("w_x", TURN_WAITING, "https://b.test/y", "s1", None, None, T0, T0)
    with pytest.raises(ValueError, match=r"w_x.*needs its payload"):
        await store.park_turn("s1", "t1", approval, [bare])
    assert (await store.get_turn("s1", "t1")).status is TurnStatus.RUNNING
    assert await store.pending_webhooks() == 0
