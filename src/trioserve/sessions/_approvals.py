"""The manager's part in approvals: a turn parked on a tool call, decided, continued.

A turn whose adapter asks for an approval (``approval.requested`` then
``session.ended`` ``waiting``, docs/wire-protocol.md) is *parked* by its
runner (``park``): the server logs its own ``approval.requested``
(``data.approvalId``, ``tool``, ``arguments``, ``expiresAt``), and the store
makes the turn ``waiting`` and keeps the approval with the adapter's state
(``Store.park_turn``).  The adapter has exited and the turn slot is free:
nothing of the turn lives in any process.  ``ApprovalDesk`` (a base of
``SessionManager``) then:

- lists and decides approvals (``list_approvals``, ``decide``: once, in the
  store; the key id of who decided, never the key);
- continues a decided turn (``continue_turn``): the store makes it
  ``running`` again for this process (``Store.resume_turn``, once across
  processes) and a new adapter run starts with ``trioserve.resume``; its log
  starts with ``approval.resolved``;
- every ``POLL_SECONDS`` (``run_approvals``) denies the approvals past
  ``expiresAt`` (reason ``expired``) and continues the decided turns nobody
  continued (a process died in between, no free slot), whichever process
  parked or decided them;
- ends a waiting turn without running it (``stop_waiting``: an interrupting
  turn, a cancel, the session's end): denied, then ``session.ended``
  ``cancelled``.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Final

import trio

from trioserve.errors import (
    ApprovalDecided,
    ApprovalNotFound,
    InvalidRequest,
    StoreError,
    TurnCapReached,
)
from trioserve.observe import Metrics, TurnTrace
from trioserve.protocol import APPROVAL_REQUESTED, SESSION_ENDED, TurnStatus
from trioserve.runtime import wire
from trioserve.sessions._admission import Admission
from trioserve.sessions._approval_events import public, resolved_event, resume_of
from trioserve.sessions._feed import Feed
from trioserve.sessions._leases import Leases
from trioserve.sessions._limits import Limits
from trioserve.sessions._queue import TurnQueues
from trioserve.sessions._runner import TurnRunner
from trioserve.sessions._starts import Starts
from trioserve.sessions._turns import Turn, logged, new_turn
from trioserve.sessions._webhooks import Webhooks
from trioserve.stores.approvals import ApprovalRecord, ApprovalStatus, Decision
from trioserve.stores.base import Store, TurnEnd, TurnRecord, utcnow

log = logging.getLogger("trioserve.approvals")

#: How often each process looks for expired approvals and decided turns nobody continued.
POLL_SECONDS: Final = 1.0
#: How long a decision waits for an approval its session's log already asks for (the
#: turn logs ``approval.requested``, then the store keeps the approval as it parks).
PARK_WAIT: Final = 10.0
#: How far back in the log a decision looks for that ``approval.requested``.
_RECENT_EVENTS: Final = 32


class ApprovalDesk:
    """Approvals for ``SessionManager``, which sets these attributes."""

    store: Store
    limits: Limits
    metrics: Metrics
    draining: bool
    leases: Leases | None
    _turns: dict[str, Turn]
    _starts: Starts
    _admission: Admission
    _queues: TurnQueues
    _nursery: trio.Nursery
    _runner: TurnRunner
    _idle: trio.Event
    #: Sessions whose turn waits (this process's view; the store has the truth).
    _parked: set[str]
    _approval_wake: trio.Event
    webhooks: Webhooks

    def _notify(self, session_id: str) -> None:
        raise NotImplementedError  # SessionReads'

    async def _check_owner(self, session_id: str, tenant: str | None) -> None:
        raise NotImplementedError  # SessionReads'

    def _release_turn(self, turn: Turn, *, wake: bool = True) -> None:
        raise NotImplementedError  # SessionManager's

    # -- the runner's side -------------------------------------------------------------

    async def park(self, turn: Turn, approval: ApprovalRecord) -> None:
        """Park the runner's ``turn`` on ``approval`` in the store, with its ``turn.waiting``
        webhooks (``_webhooks``) in the same atomic step, so a crash between the two loses
        none; then the session is busy (the runner releases the turn's slot).  Raises what
        the store raises (the turn then fails with ``store_error``)."""
        webhooks = await self.webhooks.waiting(turn.session_id, turn.id, public(approval))
        await self.store.park_turn(turn.session_id, turn.id, approval, webhooks)
        self._parked.add(turn.session_id)
        self._notify(turn.session_id)
        if webhooks:
            self.webhooks.wake()

    async def waiting_turn(self, session_id: str) -> TurnRecord | None:
        """The session's waiting turn, as the store has it."""
        found = await self.store.list_turns(session_id, status=TurnStatus.WAITING, limit=1)
        return found[0] if found else None

    async def parked_turn(self, session_id: str) -> TurnRecord | None:
        """``waiting_turn``, without asking the store when the answer is known: a store only
        this process writes (not PostgreSQL: shared) holds no waiting turn it did not park
        or load (``_parked`` is loaded before the first turn).  Every turn start asks."""
        if self.leases is None and session_id not in self._parked:
            return None
        return await self.waiting_turn(session_id)

    # -- reads and decisions -----------------------------------------------------------

    async def list_approvals(self, session_id: str, tenant: str | None = None) -> list[Any]:
        """The session's approvals, oldest first, as clients see them (``public``)."""
        await self._check_owner(session_id, tenant)
        return [public(a) for a in await self.store.list_approvals(session_id)]

    async def decide(
        self,
        session_id: str,
        approval_id: str,
        *,
        approve: bool,
        arguments: dict[str, Any] | None = None,
        message: str | None = None,
        decided_by: str | None = None,
        tenant: str | None = None,
    ) -> dict[str, Any]:
        """Decide a pending approval and continue its turn; the approval as decided.

        ``NotFound`` (unknown, another session's or tenant's), ``ApprovalDecided``
        (decided already, here or anywhere), ``InvalidRequest`` for arguments
        with a denial.
        """
        await self._check_owner(session_id, tenant)
        if arguments is not None and not approve:
            raise InvalidRequest("arguments: only with decision 'approve'")
        found = await self._get_approval(session_id, approval_id)
        if found.status is not ApprovalStatus.PENDING:
            raise ApprovalDecided(f"approval {approval_id} was {found.status} already")
        status = ApprovalStatus.APPROVED if approve else ApprovalStatus.DENIED
        decision = Decision(status, utcnow(), None, message, arguments, decided_by)
        decided = await self.store.decide_approval(session_id, approval_id, decision)
        log.info(
            "approval %s of turn %s %s by %s",
            approval_id,
            decided.turn_id,
            status.value,
            decided_by or "(no key)",
        )
        await self.continue_turn(decided)
        return public(decided)

    async def _get_approval(self, session_id: str, approval_id: str) -> ApprovalRecord:
        """The approval; one the log already asks for but the store does not keep yet (its
        turn is parking, here or in another process) is waited for, up to ``PARK_WAIT``:
        a client that answers as soon as it sees ``approval.requested`` is not told 404."""
        try:
            return await self.store.get_approval(session_id, approval_id)
        except ApprovalNotFound:
            if not await self._requested(session_id, approval_id):
                raise
        with trio.move_on_after(PARK_WAIT):
            while True:
                await trio.sleep(0.02)
                try:
                    return await self.store.get_approval(session_id, approval_id)
                except ApprovalNotFound:
                    pass
        return await self.store.get_approval(session_id, approval_id)  # still not: 404

    async def _requested(self, session_id: str, approval_id: str) -> bool:
        """Whether the session's recent log holds ``approval_id``'s ``approval.requested``."""
        last = (await self.store.get(session_id)).last_seq
        recent = await self.store.read_events(session_id, after=max(0, last - _RECENT_EVENTS))
        wanted = f'"approvalId":"{approval_id}"'.encode()
        return any(e.type == APPROVAL_REQUESTED and wanted in e.raw for e in recent)

    # -- continuing ----------------------------------------------------------------------

    async def continue_turn(self, approval: ApprovalRecord) -> bool:
        """Run the continuation of ``approval``'s decided turn here; ``False`` when it cannot
        start now (draining, no free slot, another process took it): the poll tries again."""
        session_id = approval.session_id
        if self.draining or session_id in self._turns or session_id in self._starts:
            return False
        session = await self.store.get(session_id)
        record = await self.store.get_turn(session_id, approval.turn_id)
        if record.status is not TurnStatus.WAITING:
            return False
        if session.status.terminal:
            await self.stop_waiting(session_id, record.id, "session_ended")
            return False
        running = replace(record, status=TurnStatus.RUNNING)
        turn = new_turn(running, session.last_seq + 1, self.limits, "continue")
        turn.tenant = session.tenant
        turn.resume = resume_of(approval)
        turn.preface = [resolved_event(approval)]
        if session_id in self._turns or session_id in self._starts:  # meanwhile: no await
            return False  # from here to the start (``_starts``)
        try:
            self._admission.take_turn(turn)
        except TurnCapReached:
            return False  # it waits for a slot: the poll tries again
        self._idle = trio.Event()
        try:
            with self._starts.start(session_id):  # nobody's to stop until the store took it
                claimed = running if self.leases is None else self.leases.claim(running)
                resumed = await self.store.resume_turn(
                    session_id,
                    record.id,
                    owner=claimed.owner,
                    lease_expires_at=claimed.lease_expires_at,
                )
                if resumed is not None:
                    turn.record = resumed
                    turn.feed = Feed((await self.store.get(session_id)).last_seq + 1)
                    self._turns[session_id] = turn
        except BaseException:
            self._release_turn(turn, wake=False)
            turn.feed.finish()
            raise
        if resumed is None:  # another process continued it
            self._release_turn(turn, wake=False)
            turn.feed.finish()
            return False
        self._parked.discard(session_id)
        trace = TurnTrace(session_id, record.id, turn.protocol)
        turn.env = trace.adapter_env(None)
        self._notify(session_id)
        self._nursery.start_soon(self._runner.run, turn, session, trace)
        self.metrics.turns_started.labels(turn.protocol).inc()
        log.info(
            "turn %s of session %s continues after approval %s", record.id, session_id, approval.id
        )
        return True

    async def stop_waiting(self, session_id: str, turn_id: str, reason: str) -> bool:
        """End the waiting turn unrun: its pending approval denied (``reason``), then
        ``session.ended`` ``cancelled``; ``False`` if it was not waiting any more."""
        events: list[wire.Event] = []
        for approval in await self.store.list_approvals(session_id):
            if approval.turn_id != turn_id or approval.resumed:
                continue
            if approval.status is ApprovalStatus.PENDING:
                decision = Decision(ApprovalStatus.DENIED, utcnow(), reason)
                try:
                    approval = await self.store.decide_approval(session_id, approval.id, decision)
                except ApprovalDecided:
                    approval = await self.store.get_approval(session_id, approval.id)
            events.append(resolved_event(approval))
        owner = None if self.leases is None else self.leases.owner
        resumed = await self.store.resume_turn(session_id, turn_id, owner=owner)
        if resumed is None:
            return False
        message = reason.replace("_", " ")
        data = {"reason": "cancelled", "message": message}
        events.append(wire.synthesize(SESSION_ENDED, session_id, data))
        first = (await self.store.get(session_id)).last_seq + 1
        await self.store.append_events(
            session_id,
            turn_id,
            [logged(event, first + i, turn_id) for i, event in enumerate(events)],
            end=TurnEnd(TurnStatus.CANCELLED, reason, utcnow()),
        )
        self._parked.discard(session_id)
        self._notify(session_id)
        self._queues.wake()
        log.info("waiting turn %s of session %s ended: %s", turn_id, session_id, reason)
        return True

    async def end_waiting(self, session_id: str, reason: str) -> bool:
        """End the session's waiting turn unrun, if it has one (``stop_waiting``); ``False``:
        none waits (``SessionNotFound`` for an unknown session)."""
        parked = await self.waiting_turn(session_id)
        return parked is not None and await self.stop_waiting(session_id, parked.id, reason)

    async def interrupt_waiting(self, session_id: str, turn_id: str, held: bool) -> bool:
        """A turn with ``multitask: interrupt`` ends the waiting one (``stop_waiting``),
        holding the session's line first (``held``: already) so that no queued turn starts
        ahead of it; ``True``: the line is held."""
        if not held:
            self._queues.hold(session_id)
        await self.stop_waiting(session_id, turn_id, "interrupted")
        return True

    async def run_approvals(self) -> None:
        """Every ``POLL_SECONDS`` (or when woken): expire, and continue what nobody did."""
        while True:
            try:
                await self.poll_approvals()
            except (StoreError, OSError) as exc:
                log.warning("approvals: could not read the store: %s", exc)
            with trio.move_on_after(POLL_SECONDS):
                await self._approval_wake.wait()
            self._approval_wake = trio.Event()

    async def poll_approvals(self) -> None:
        """One pass of ``run_approvals``."""
        before = set(self._parked)
        found = await self.store.open_approvals()
        waiting = {a.session_id for a in found}
        self._parked -= before - waiting
        self._parked |= waiting
        now = utcnow()
        for approval in found:
            if self.draining:
                return
            if approval.status is ApprovalStatus.PENDING:
                if approval.expires_at > now:
                    continue
                decision = Decision(ApprovalStatus.DENIED, now, "expired")
                try:
                    approval = await self.store.decide_approval(
                        approval.session_id, approval.id, decision
                    )
                except ApprovalDecided:
                    continue  # decided meanwhile: its decider continues it
                log.info("approval %s of turn %s expired", approval.id, approval.turn_id)
            await self.continue_turn(approval)
        self._queues.wake()
