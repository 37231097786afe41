"""Two managers on one PostgreSQL store (two workers, in one Trio run): a turn waiting for
an approval keeps its session busy in the store, not only in the process that knows it.

Each process learns of waiting turns from the store (``poll_approvals``, every second);
until it has, its pump may try a queued turn of the session.  The store refuses that
start (``begin_turn``: ``SessionBusy``), so the queued turn waits for the waiting turn's
end, whichever process looks first.  Here worker B never learns (its store lists no open
approvals), so its pump tries, and the store alone keeps the order.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import datetime

import pytest
import trio

from tests.helpers import FAKE_ADAPTER, ScriptedLauncher, script, typed_spec
from tests.helpers.pg import fresh_schema
from trioserve.errors import SessionBusy
from trioserve.protocol import TurnStatus
from trioserve.sessions import QueuedTurn, SessionManager, Turn
from trioserve.sessions._limits import Limits
from trioserve.sessions._turns import released
from trioserve.stores.approvals import ApprovalRecord
from trioserve.stores.base import TurnRecord
from trioserve.stores.postgres import PostgresStore

ASK = script(
    {
        "event": "approval.requested",
        "data": {"callId": "c1", "tool": "deploy", "arguments": {"target": "prod"}},
    },
    {"end": "waiting"},
)
NEXT = script({"event": "message", "data": {"label": "next"}}, {"end": "completed"})
LIMITS = Limits(warm_adapters=0, shared_store=True, turn_lease=30, require_approval=("deploy",))


class Unaware(PostgresStore):
    """A PostgreSQL store that lists no open approvals (its process never learns of a
    waiting turn) and says when it refused a queued turn's start."""

    refused = trio.Event()

    async def open_approvals(self) -> builtins.list[ApprovalRecord]:
        return []

    async def _begin_turn(
        self,
        session_id: str,
        turn_id: str,
        owner: str | None,
        lease_expires_at: datetime | None,
        max_running: int | None,
        tenant_cap: int | None,
    ) -> TurnRecord | None:
        try:
            return await super()._begin_turn(
                session_id, turn_id, owner, lease_expires_at, max_running, tenant_cap
            )
        except SessionBusy:
            self.refused.set()
            raise


@pytest.fixture
async def workers() -> AsyncIterator[tuple[SessionManager, SessionManager, Unaware]]:
    """Managers A and B on one fresh schema; B's store is ``Unaware``."""
    async with fresh_schema() as url, AsyncExitStack() as stack:
        Unaware.refused = trio.Event()
        managers = []
        for kind in (PostgresStore, Unaware):
            store = await kind.open(url)
            stack.push_async_callback(store.close)
            managers.append(
                await stack.enter_async_context(
                    SessionManager.open(
                        store, typed_spec(), FAKE_ADAPTER, LIMITS, launcher=ScriptedLauncher()
                    )
                )
            )
        b_store = managers[1].store
        assert isinstance(b_store, Unaware)
        yield managers[0], managers[1], b_store


async def status_of(manager: SessionManager, session_id: str, turn_id: str) -> TurnStatus:
    return (await manager.store.get_turn(session_id, turn_id)).status


async def test_a_queued_turn_does_not_start_while_the_sessions_turn_waits_elsewhere(
    workers: tuple[SessionManager, SessionManager, Unaware],
) -> None:
    a, b, b_store = workers
    session = await a.create_session()
    asked = await a.start_turn(session.id, ASK)
    assert isinstance(asked, Turn)
    with trio.fail_after(30):
        await released(asked)
    assert await status_of(a, session.id, asked.id) is TurnStatus.WAITING
    queued = await b.start_turn(session.id, NEXT, multitask="enqueue")
    assert isinstance(queued, QueuedTurn)
    with trio.fail_after(30):  # B's pump tries it (B does not know the session waits) ...
        await b_store.refused.wait()
    assert await status_of(b, session.id, queued.id) is TurnStatus.QUEUED  # ... the store: no
    assert session.id not in b._turns
    await a.cancel_turn(session.id)  # the waiting turn ends (denied, cancelled) ...
    assert await status_of(a, session.id, asked.id) is TurnStatus.CANCELLED
    with trio.fail_after(60):  # ... and the queued one runs then, in B
        while await status_of(b, session.id, queued.id) is not TurnStatus.COMPLETED:
            await trio.sleep(0.05)
