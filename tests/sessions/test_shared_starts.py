"""Two managers on one PostgreSQL store (two workers, in one Trio run): a start the store
is still deciding on is nobody's to stop (``sessions._starts``, issue 20).

Worker B's pump tries its queued turn while worker A runs the session's turn;
the store refuses it (``SessionBusy``).  A cancel that reached B in that
moment used to stop B's turn that never ran and answer as if it had cancelled
the running one: A's turn ran on, and the queued turn behind it waited
forever (the hang of ``test_enqueue_order_across_two_workers``).  Here B's
``begin_turn`` is held until the cancel has come, so that interleaving
happens every time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from datetime import datetime
from typing import Any

import pytest
import trio

from tests.helpers import FAKE_ADAPTER, ScriptedLauncher, script, typed_spec
from tests.helpers.pg import fresh_schema
from trioserve.errors import StoreUnavailable
from trioserve.protocol import TurnStatus
from trioserve.sessions import QueuedTurn, SessionManager, Turn
from trioserve.sessions._limits import Limits
from trioserve.sessions._turns import released
from trioserve.stores.base import Session, TurnRecord
from trioserve.stores.postgres import PostgresStore

HANG = script({"event": "message", "data": {"ready": 1}}, {"hang": True})
NEXT = script({"event": "message", "data": {"label": "next"}}, {"end": "completed"})
LIMITS = Limits(warm_adapters=0, shared_store=True, turn_lease=30)


class HeldBegins(PostgresStore):
    """A PostgreSQL store whose first ``begin_turn`` waits for ``release``."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.entered = trio.Event()
        self.release = trio.Event()

    async def _begin_turn(
        self,
        session_id: str,
        turn_id: str,
        owner: str | None,
        lease_expires_at: datetime | None,
        max_running: int | None,
        tenant_cap: int | None,
    ) -> TurnRecord | None:
        if not self.entered.is_set():
            self.entered.set()
            await self.release.wait()
        return await super()._begin_turn(
            session_id, turn_id, owner, lease_expires_at, max_running, tenant_cap
        )


async def opened(stack: AsyncExitStack, store: PostgresStore) -> SessionManager:
    """A manager (``LIMITS``, scripted turns) on ``store``, closed with ``stack``."""
    return await stack.enter_async_context(
        SessionManager.open(store, typed_spec(), FAKE_ADAPTER, LIMITS, launcher=ScriptedLauncher())
    )


@pytest.fixture
async def workers() -> AsyncIterator[tuple[SessionManager, SessionManager, HeldBegins]]:
    """Managers A and B on one fresh schema; B's store holds its first ``begin_turn``."""
    async with fresh_schema() as url, AsyncExitStack() as stack:
        a_store = await PostgresStore.open(url)
        stack.push_async_callback(a_store.close)
        b_store = await HeldBegins.open(url)
        assert isinstance(b_store, HeldBegins)
        stack.push_async_callback(b_store.close)
        a = await opened(stack, a_store)
        b = await opened(stack, b_store)
        try:
            yield a, b, b_store
        finally:
            b_store.release.set()


def parked_on_start(manager: SessionManager, session_id: str) -> bool:
    """Whether a task waits for the start of the session's turn in ``manager`` to settle."""
    done = manager._starts._done.get(session_id)
    return done is not None and done.statistics().tasks_waiting > 0


@pytest.mark.parametrize("act", ["cancel", "end"])
async def test_a_stop_during_a_refused_start_reaches_the_turn_that_runs_elsewhere(
    workers: tuple[SessionManager, SessionManager, HeldBegins], act: str
) -> None:
    a, b, b_store = workers
    session = await a.create_session()
    running = await a.start_turn(session.id, HANG)
    assert isinstance(running, Turn)
    queued = await b.start_turn(session.id, NEXT, multitask="enqueue")
    assert isinstance(queued, QueuedTurn)
    with trio.fail_after(30):
        await b_store.entered.wait()  # B's pump tries the queued turn; A's runs: refused
    stop: Callable[[str], Awaitable[None]] = b.cancel_turn if act == "cancel" else b.end_session
    answered = trio.Event()

    async def ask() -> None:
        await stop(session.id)
        answered.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask)
        with trio.fail_after(30):  # it answers (the bug), or waits for the start to settle
            while not answered.is_set() and not parked_on_start(b, session.id):
                await trio.sleep(0.01)
        b_store.release.set()
    with trio.fail_after(30):
        await released(running)
    assert running.end is not None
    expected = "cancelled" if act == "cancel" else "session_ended"
    assert (running.end.status, running.end.reason) == (TurnStatus.CANCELLED, expected)
    with trio.fail_after(30):
        await queued.wait()
    if act == "cancel":  # the queued turn runs next, on B
        assert queued.turn is not None
        with trio.fail_after(30):
            await released(queued.turn)
        assert queued.end is not None and queued.end.status is TurnStatus.COMPLETED
    else:  # the session ended: its queued turn left the line unstarted
        assert queued.turn is None and queued.end is not None
        assert (queued.end.status, queued.end.reason) == (TurnStatus.CANCELLED, "session_ended")


class UnreadAfterBegin(PostgresStore):
    """A PostgreSQL store that, once armed, refuses the session read right after a
    ``begin_turn`` (the database gone between the two calls)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.armed = False
        self._begun = False

    async def begin_turn(self, *args: Any, **kwargs: Any) -> TurnRecord | None:
        record = await super().begin_turn(*args, **kwargs)
        self._begun = self.armed and record is not None
        return record

    async def get(self, session_id: str) -> Session:
        if self._begun:
            self._begun = self.armed = False
            raise StoreUnavailable("the database went away (the test's)")
        return await super().get(session_id)


async def test_a_queued_turn_begun_but_not_read_ends_store_error_and_frees_its_session() -> None:
    """Its session takes the next turn once its end is written, not after its lease (30 s
    here: the next turn would be a 409 until then)."""
    async with fresh_schema() as url, AsyncExitStack() as stack:
        store = await UnreadAfterBegin.open(url)
        assert isinstance(store, UnreadAfterBegin)
        stack.push_async_callback(store.close)
        manager = await opened(stack, store)
        session = await manager.create_session()
        running = await manager.start_turn(session.id, HANG)
        assert isinstance(running, Turn)
        queued = await manager.start_turn(session.id, NEXT, multitask="enqueue")
        assert isinstance(queued, QueuedTurn)
        store.armed = True
        await manager.cancel_turn(session.id)
        with trio.fail_after(30):
            await queued.wait()
        assert queued.turn is None and queued.end is not None
        assert (queued.end.status, queued.end.reason) == (TurnStatus.FAILED, "store_error")
        with trio.fail_after(20):  # the end is written at the first retry (0.1 s)
            while (await store.get_turn(session.id, queued.id)).status is TurnStatus.RUNNING:
                await trio.sleep(0.05)
        record = await store.get_turn(session.id, queued.id)
        assert (record.status, record.reason) == (TurnStatus.FAILED, "store_error")
        with trio.fail_after(20):
            following = await manager.start_turn(session.id, NEXT)
            assert isinstance(following, Turn)
            await released(following)
        assert following.end is not None and following.end.status is TurnStatus.COMPLETED
