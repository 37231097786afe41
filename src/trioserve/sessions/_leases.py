"""Turn leases: who runs a turn, and closing the turns of a process that died.

With a shared store (``--workers``, replicas on PostgreSQL) each manager is an
``owner`` (host, pid and a random part).  A turn it starts is stored with
that owner and a lease (``lease_expires_at``, ``Limits.turn_lease`` ahead);
``Leases.run`` renews the leases of all its running turns every third of
the lease (``Store.renew_leases``), and every half lease looks for running
turns of any owner whose lease has passed: their process stopped renewing
(``kill -9``, a crash, a partition).  Each such turn is closed as crash
recovery closes a turn at startup: an ``error`` (``data.reason:
"lease_expired"``) and a ``session.ended`` ``error`` are appended with the
end (``interrupted``, ``lease_expired``) in one store step.  That step's seq
check makes it safe against the owner writing at the same moment and
against other survivors doing the same: one of them wins, the others get a
``LogConflict`` and leave it.  Nothing a client saw is lost: the events it
saw were stored before it saw them, and the closing events come after.

Cancel: a process asked to cancel a turn another process runs records the
request in the store (``Store.request_cancel``); the owner reads the
requests for its running turns every ``CANCEL_POLL_SECONDS`` while it runs
any (``Store.cancel_requests``) and stops them as a local cancel does (as
a local ``DELETE`` of the session does, when the session has ended: ending
a session elsewhere requests the cancel of its turn).

A process whose own lease lapsed (it could not reach the store for a whole
lease) finds its turn closed by another: its next append is refused, and
the turn ends there.

Queued turns (``multitask: enqueue``) are owned and leased the same way by
the process that accepted them, and renewed with its running turns; every
half lease a process also claims the queued turns whose lease passed
(``Store.claim_queued``: each goes to one survivor) and puts them in its own
lines (``adopted``), where they keep their order of acceptance.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import timedelta
from typing import Final

import trio

from trioserve.errors import LogConflict, SessionNotFound, StoreError, TurnNotFound
from trioserve.protocol import SESSION_ENDED, TurnStatus
from trioserve.runtime import wire
from trioserve.sessions._turns import Turn, logged
from trioserve.stores.base import Store, TurnEnd, TurnRecord, utcnow

log = logging.getLogger("trioserve.leases")

#: How often a process running turns reads the cancel requests for them.
CANCEL_POLL_SECONDS: Final = 0.25
#: ``data.reason`` of the ``error`` event, and the turn's end reason.
LEASE_EXPIRED: Final = "lease_expired"
MESSAGE: Final = "turn interrupted: the server process running it stopped (its lease expired)"


def new_owner() -> str:
    """This process's name on its leases: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Leases:
    """Renews this process's leases and closes the turns whose lease expired."""

    def __init__(
        self,
        store: Store,
        seconds: float,
        *,
        turns: Callable[[], Mapping[str, Turn]],
        closed: Callable[[str], None],
        queued: Callable[[], bool] = lambda: False,
        adopted: Callable[[list[TurnRecord]], None] = lambda records: None,
    ) -> None:
        self.store = store
        self.seconds = seconds
        self.owner = new_owner()
        self._turns = turns  # this process's running turns, by session id
        self._closed = closed  # told the session id of each turn it closed
        self._queued = queued  # whether this process holds queued turns
        self._adopted = adopted  # told the queued turns it claimed

    def claim(self, record: TurnRecord) -> TurnRecord:
        """``record`` owned by this process, its lease running from now."""
        until = utcnow() + timedelta(seconds=self.seconds)
        return replace(record, owner=self.owner, lease_expires_at=until)

    async def run(self) -> None:
        """Renew and expire, forever (cancel to stop); store failures are logged and retried."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._renew_loop)
            nursery.start_soon(self._expire_loop)
            nursery.start_soon(self._cancel_loop)

    async def _renew_loop(self) -> None:
        while True:
            await trio.sleep(self.seconds / 3)
            if not self._turns() and not self._queued():
                continue
            try:
                await self.renew()
            except (StoreError, OSError) as exc:
                log.warning("could not renew the leases of this process's turns: %s", exc)

    async def renew(self) -> int:
        until = utcnow() + timedelta(seconds=self.seconds)
        return await self.store.renew_leases(self.owner, until)

    async def _cancel_loop(self) -> None:
        while True:
            await trio.sleep(CANCEL_POLL_SECONDS)
            if not self._turns():
                continue
            try:
                await self.take_cancels()
            except (StoreError, OSError) as exc:
                log.warning("could not read the cancel requests of this process's turns: %s", exc)

    async def take_cancels(self) -> None:
        """Stop this process's turns whose cancel another process requested."""
        for session_id, turn_id in await self.store.cancel_requests(self.owner):
            turn = self._turns().get(session_id)
            if turn is None or turn.id != turn_id or turn.stop_reason is not None:
                continue
            # The session ended elsewhere (a DELETE there), or a cancel: as it would be here.
            try:
                ended = (await self.store.get(session_id)).status.terminal
            except SessionNotFound:
                ended = True
            log.info("turn %s of session %s: stop requested elsewhere", turn_id, session_id)
            turn.stop("session_ended" if ended else "cancelled")

    async def _expire_loop(self) -> None:
        while True:
            await trio.sleep(self.seconds / 2)
            try:
                await self.expire()
                await self.adopt()
            except (StoreError, OSError) as exc:
                log.warning("could not look for turns whose lease expired: %s", exc)

    async def expire(self) -> list[TurnRecord]:
        """Close every other process's running turn whose lease has passed; return them."""
        now = utcnow()
        closed = []
        for record in await self.store.running_turns():
            lease = record.lease_expires_at
            if lease is None or lease >= now or record.owner == self.owner:
                continue
            if await self._close(record):
                closed.append(record)
        return closed

    async def adopt(self) -> list[TurnRecord]:
        """Claim the queued turns whose owner stopped renewing; hand them to ``adopted``."""
        until = utcnow() + timedelta(seconds=self.seconds)
        claimed = await self.store.claim_queued(self.owner, until)
        if claimed:
            log.warning("%d queued turn(s) adopted from processes that stopped", len(claimed))
            self._adopted(claimed)
        return claimed

    async def _close(self, record: TurnRecord) -> bool:
        try:
            await interrupt(self.store, record, LEASE_EXPIRED, MESSAGE)
        except (LogConflict, SessionNotFound, TurnNotFound):
            return False  # its owner wrote meanwhile, another process closed it, or it is gone
        log.warning(
            "turn %s of session %s interrupted: its lease (owner %s) expired",
            record.id,
            record.session_id,
            record.owner,
        )
        self._closed(record.session_id)
        return True


async def cancel_elsewhere(store: Store, session_id: str) -> bool:
    """Ask the process running the session's turn to cancel it; ``False``: none runs."""
    running = await store.list_turns(session_id, status=TurnStatus.RUNNING, limit=1)
    return bool(running) and await store.request_cancel(session_id, running[0].id)


async def recover(store: Store) -> list[TurnRecord]:
    """Close the turns an earlier process left ``running`` (one process: at startup); return
    them.  A turn left ``waiting`` for an approval is not closed: it holds nothing of a
    process, and continues once decided (``_approvals``)."""
    interrupted = await store.running_turns()
    for record in interrupted:
        await interrupt(store, record)  # as server_restart
        log.warning("turn %s of session %s was interrupted by a restart", *record_ids(record))
    return interrupted


def record_ids(record: TurnRecord) -> tuple[str, str]:
    return record.id, record.session_id


async def interrupt(
    store: Store,
    record: TurnRecord,
    reason: str = "server_restart",
    message: str = "turn interrupted: the server stopped while it ran",
) -> None:
    """End a turn its process left ``running`` as ``interrupted``: its log gets an ``error``
    (``data.reason``: ``reason``) and a ``session.ended``.  Raises what ``append_events`` does
    (``LogConflict``: its owner wrote meanwhile)."""
    session = await store.get(record.session_id)
    events = [
        wire.error_event(session.id, message, reason=reason),
        wire.synthesize(SESSION_ENDED, session.id, {"reason": "error", "message": message}),
    ]
    first = session.last_seq + 1
    await store.append_events(
        session.id,
        record.id,
        [logged(event, first + i, record.id) for i, event in enumerate(events)],
        end=TurnEnd(TurnStatus.INTERRUPTED, reason, utcnow()),
    )
