"""The manager's part in double texting: queuing, starting and removing waiting turns.

``Multitasking`` is a base of ``SessionManager`` (``_manager.py``), which
decides per turn what a busy session does (``multitask``): ``reject`` (409),
``enqueue`` (``enqueue`` here: stored ``queued``, put in the session's line
of ``_queue.TurnQueues``) or ``interrupt`` (the manager stops the running
turn for it).  The pump of ``TurnQueues`` calls ``start_queued`` for the
first waiting turn of each idle session; ``cancel_queued`` (``DELETE
.../turns/{turnId}``), a client leaving with ``onDisconnect: cancel`` and
the end of the session take turns out of the line (``drop``).  A restart
finds the turns still ``queued`` in the store and runs them, in order
(``restore_queue``).
"""

from __future__ import annotations

import logging
from dataclasses import replace

import trio

from trioserve.errors import (
    QueueFull,
    SessionBusy,
    SessionNotFound,
    StoreError,
    TurnCapReached,
    TurnEnded,
)
from trioserve.observe import Metrics, TurnTrace
from trioserve.protocol import OnDisconnect, TurnStatus
from trioserve.sessions._admission import Admission
from trioserve.sessions._end_retry import STORE_ERROR, EndRetries
from trioserve.sessions._feed import Feed
from trioserve.sessions._leases import Leases, cancel_elsewhere
from trioserve.sessions._limits import Limits
from trioserve.sessions._queue import QueuedTurn, TurnQueues
from trioserve.sessions._runner import TurnRunner
from trioserve.sessions._starts import Starts
from trioserve.sessions._turns import Turn, new_turn
from trioserve.stores.base import Session, Store, TurnEnd, TurnRecord, utcnow
from trioserve.stores.records import IdempotencyClaim

log = logging.getLogger("trioserve.manager")

#: The stores' refusals that leave a waiting turn first in its line, to try again.
_NOT_YET = (SessionBusy, TurnCapReached)


class Multitasking:
    """Queued turns for ``SessionManager``, which sets these attributes."""

    store: Store
    limits: Limits
    metrics: Metrics
    draining: bool
    leases: Leases | None
    end_retries: EndRetries
    _turns: dict[str, Turn]
    _starts: Starts
    _admission: Admission
    _queues: TurnQueues
    _nursery: trio.Nursery
    _runner: TurnRunner
    _idle: trio.Event

    def _notify(self, session_id: str) -> None:
        raise NotImplementedError  # SessionReads'

    async def _check_owner(self, session_id: str, tenant: str | None) -> None:
        raise NotImplementedError  # SessionReads'

    def _release_turn(self, turn: Turn, *, wake: bool = True) -> None:
        raise NotImplementedError  # SessionManager's

    def _busy(self, session_id: str) -> bool:
        raise NotImplementedError  # SessionManager's

    def _shared_cap(self, limit: int) -> int | None:
        raise NotImplementedError  # SessionManager's

    async def _enqueue(
        self,
        session: Session,
        record: TurnRecord,
        on_disconnect: OnDisconnect | None,
        env: dict[str, str] | None,
        tenant: str | None,
        claim: IdempotencyClaim | None,
    ) -> QueuedTurn:
        """Store ``record`` ``queued`` and put it last in its session's line."""
        waiting = self._queues.waiting(session.id)
        if self.leases is not None:  # other processes' waiting turns count too
            waiting = len(await self.store.list_turns(session.id, status=TurnStatus.QUEUED))
        cap = self.limits.max_queued_turns
        if waiting >= cap:
            raise QueueFull(f"session {session.id} has {waiting} turns queued (max {cap})")
        record = replace(record, status=TurnStatus.QUEUED)
        if self.leases is not None:
            record = self.leases.claim(record)
        queued = QueuedTurn(
            record, on_disconnect or self.limits.on_disconnect, env, tenant, waiting + 1
        )
        queued.on_left = self._left_queue
        await self.store.create_turn(record, idempotency=claim)
        self._queues.add(queued)
        self._notify(session.id)
        log.info("turn %s of session %s queued (position %d)", record.id, session.id, waiting + 1)
        return queued

    def _begun_unread(self, queued: QueuedTurn, record: TurnRecord, exc: Exception) -> None:
        """The store began ``queued`` (it is ``running`` there, ours) but its session could not
        be read again: it cannot be numbered, so it ends ``failed``/``store_error`` unstarted.
        Its end is written by ``EndRetries`` as soon as the store takes it, so the session
        takes its next turn then, not once the turn's lease has passed."""
        log.warning(
            "turn %s of session %s: begun, but its session could not be read (%s): it ends"
            " failed, store_error",
            record.id,
            record.session_id,
            exc,
        )
        self._queues.remove(queued)
        self.end_retries.add(record.session_id, record.id, [], None)
        queued.ended_unstarted(TurnEnd(TurnStatus.FAILED, STORE_ERROR, utcnow()))

    async def start_queued(self, queued: QueuedTurn) -> None:
        """Start ``queued`` if it is first in its line and its session runs nothing (the
        pump's call); otherwise, or without a free turn slot, it stays where it is."""
        session_id = queued.session_id
        try:
            session = await self.store.get(session_id)
        except SessionNotFound:
            self._queues.remove(queued)
            queued.ended_unstarted(TurnEnd(TurnStatus.CANCELLED, "session_ended", utcnow()))
            return
        if session.status.terminal:
            await self.drop(queued, "session_ended")
            return
        if self.draining or self._busy(session_id) or queued.dropped is not None:
            return  # checked again after the await
        turn = new_turn(
            replace(queued.record, status=TurnStatus.RUNNING),
            session.last_seq + 1,
            self.limits,
            queued.on_disconnect,
        )
        turn.env, turn.tenant, turn.protocol = queued.env, session.tenant, queued.protocol
        try:
            self._admission.take_turn(turn)
        except TurnCapReached:
            return  # it waits for a slot
        self._idle = trio.Event()
        record: TurnRecord | None = None
        try:
            with self._starts.start(session_id):  # nobody's to stop until the store took it
                claimed = queued.record if self.leases is None else self.leases.claim(queued.record)
                record = await self.store.begin_turn(
                    session_id,
                    queued.id,
                    owner=claimed.owner,
                    lease_expires_at=claimed.lease_expires_at,
                    max_running=self._shared_cap(self.limits.max_concurrent_turns),
                    max_running_per_tenant=self._shared_cap(self.limits.max_turns_per_tenant),
                )
                if record is not None and self.leases is not None:
                    # Another process may have run a turn of the session since the read.
                    turn.feed = Feed((await self.store.get(session_id)).last_seq + 1)
                if record is not None:
                    self._turns[session_id] = turn
        except BaseException as exc:
            # Refused, nothing changed: no wake-up (the pump would only try again at once,
            # and again); it looks again after its poll, or when a turn here ends.
            self._release_turn(turn, wake=False)
            turn.feed.finish()
            if record is not None and isinstance(exc, StoreError | OSError):
                self._begun_unread(queued, record, exc)
                return
            if isinstance(exc, _NOT_YET):
                return
            if isinstance(exc, StoreError | OSError):
                log.warning("turn %s: could not start it: %s", queued.id, exc)
                return
            raise
        self._queues.remove(queued)
        if record is None:  # ended or started elsewhere meanwhile
            self._release_turn(turn)
            turn.feed.finish()
            if queued.dropped is None:  # not already taken out of the line here
                queued.ended_unstarted(TurnEnd(TurnStatus.CANCELLED, "cancelled", utcnow()))
            return
        turn.record = record
        trace = TurnTrace(session_id, record.id, turn.protocol)
        turn.env = trace.adapter_env(turn.env)
        self._notify(session_id)
        self._nursery.start_soon(self._runner.run, turn, session, trace)
        self.metrics.turns_started.labels(turn.protocol).inc()
        log.info("turn %s of session %s started from the queue", record.id, session_id)
        queued.started(turn)

    def _left_queue(self, queued: QueuedTurn) -> None:
        """Its client left while it waited (``onDisconnect: cancel``): it leaves the line."""
        if self._queues.find(queued.session_id, queued.id) is not None:
            self._nursery.start_soon(self.drop, queued, "client_disconnected")

    async def drop(self, queued: QueuedTurn, reason: str) -> bool:
        """Take ``queued`` out of its line, ``cancelled`` with ``reason``; ``False``: it was
        not waiting any more."""
        if not self._queues.remove(queued):
            return False
        end = TurnEnd(TurnStatus.CANCELLED, reason, utcnow())
        try:
            await self.store.end_queued(queued.session_id, queued.id, end)
        except (StoreError, OSError) as exc:
            log.error("turn %s: could not end it in the store: %s", queued.id, exc)
        queued.ended_unstarted(end)
        log.info("turn %s of session %s left the queue (%s)", queued.id, queued.session_id, reason)
        self._notify(queued.session_id)
        return True

    async def drop_all(self, session_id: str, reason: str) -> None:
        """Take every waiting turn of the session out of its line (the session ended)."""
        for queued in [q for q in self._queues if q.session_id == session_id]:
            await self.drop(queued, reason)

    async def cancel_queued(self, session_id: str, turn_id: str, tenant: str | None = None) -> None:
        """``DELETE .../turns/{turnId}``: a waiting turn leaves the line (its stream ends
        ``cancelled``); the running turn is stopped, as ``cancel_turn`` does.

        ``TurnNotFound`` for an unknown turn, ``TurnEnded`` for one that has ended.
        """
        await self._check_owner(session_id, tenant)
        record = await self.store.get_turn(session_id, turn_id)
        running = await self._starts.settled(session_id, self._turns)
        if running is not None and running.id == turn_id:
            running.stop("cancelled")
            return
        queued = self._queues.find(session_id, turn_id)
        if queued is not None and await self.drop(queued, "cancelled"):
            return
        if record.status is TurnStatus.QUEUED:  # another process's, or left by a restart
            end = TurnEnd(TurnStatus.CANCELLED, "cancelled", utcnow())
            if await self.store.end_queued(session_id, turn_id, end):
                return
        elif (
            record.status is TurnStatus.RUNNING
            and self.leases is not None
            and await cancel_elsewhere(self.store, session_id)
        ):
            return
        current = await self.store.get_turn(session_id, turn_id)
        raise TurnEnded(f"turn {turn_id} of session {session_id} is {current.status.value}")

    def adopt_queued(self, records: list[TurnRecord]) -> None:
        """Put queued turns this process claimed in their lines, in order (``_leases``)."""
        for record in records:
            if self._queues.find(record.session_id, record.id) is None:
                position = self._queues.waiting(record.session_id) + 1
                self._queues.add(QueuedTurn(record, "continue", None, None, position))

    async def refresh_queue(self) -> None:
        """With a shared store: drop from the lines the waiting turns that are not queued
        any more (another process removed or started them); their streams end."""
        try:
            still = {record.id for record in await self.store.queued_turns()}
        except (StoreError, OSError) as exc:
            log.warning("could not read the queued turns: %s", exc)
            return
        for queued in [q for q in self._queues if q.id not in still]:
            try:
                record = await self.store.get_turn(queued.session_id, queued.id)
            except (StoreError, OSError):
                continue
            if record.status is TurnStatus.QUEUED or not self._queues.remove(queued):
                continue
            if record.ended_at is not None and record.reason is not None:
                queued.ended_unstarted(TurnEnd(record.status, record.reason, record.ended_at))
            else:  # started by another process: this stream ends; the log has it
                queued.stop_waiting()
            self._notify(queued.session_id)

    async def restore_queue(self) -> int:
        """Put the turns a stopped server left ``queued`` back in their lines, in the order
        they were accepted (no client waits on them: they run as with ``continue``)."""
        records = await self.store.queued_turns()
        self.adopt_queued(records)
        if records:
            log.info("%d queued turn(s) restored", len(records))
        return len(records)
