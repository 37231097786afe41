"""The session manager: sessions, turns, single-flight, drain.

The manager knows nothing of HTTP.  It owns a nursery in which every turn
runs as a task with its own cancel scope (``_turns.py``); a transport starts
a turn with ``start_turn`` and reads its events with ``turn_events``, or any
session's log with ``events``.  A turn's feed finishes only after the turn
has released all it held (adapter, log, record, slot, session lock), so a
client that saw the end of a stream can start the next turn at once.

Beside it: each turn's task (``_runner.py``), creates (``_creates.py``), reads
and tenants' views (``_reads.py``), queued turns (``_multitask.py``), approvals
(``_approvals.py``): the base classes; caps (``_admission.py``), the TTL and
retention sweep (``_sweep.py``), ids (``_ids.py``), ``${inputs.<key>}``
(``_inputs.py``).

On start the manager closes what an earlier process left ``running`` (a
crash, ``kill -9``): each such turn becomes ``interrupted`` and its log gets
an ``error`` (``data.reason: "server_restart"``) and a ``session.ended``.
A turn left ``waiting`` for an approval is not closed: it continues once
decided.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager

import trio

from trioserve.errors import Draining, NoTurn, SessionBusy, SessionExpired
from trioserve.locks import Mutex
from trioserve.observe import Metrics, TurnTrace
from trioserve.protocol import Multitask, OnDisconnect, SessionStatus, TurnStatus
from trioserve.runtime import (
    AdapterLauncher,
    ForkServer,
    ProcessGuard,
    StopReason,
    WarmPool,
    run_adapter,
)
from trioserve.sessions._admission import Admission
from trioserve.sessions._approvals import ApprovalDesk
from trioserve.sessions._creates import SessionCreates
from trioserve.sessions._end_retry import EndRetries
from trioserve.sessions._idempotency import KeyedRequests
from trioserve.sessions._ids import new_turn_id
from trioserve.sessions._leases import Leases, cancel_elsewhere, recover
from trioserve.sessions._limits import Limits
from trioserve.sessions._multitask import Multitasking
from trioserve.sessions._queue import QueuedTurn, TurnQueues
from trioserve.sessions._reads import SessionReads
from trioserve.sessions._runner import TurnRunner
from trioserve.sessions._specs import SessionSpecs
from trioserve.sessions._starts import Starts
from trioserve.sessions._sweep import Sweeper, Sweeps
from trioserve.sessions._turns import Turn, new_turn, released
from trioserve.sessions._webhooks import Webhooks
from trioserve.spec import CompiledSpec
from trioserve.stores.base import Session, Store, TurnRecord, utcnow
from trioserve.stores.records import IdempotencyClaim

log = logging.getLogger("trioserve.manager")


class SessionManager(SessionCreates, SessionReads, Multitasking, ApprovalDesk, Sweeps):
    """Owns all server-side session state; see the module doc (creates: ``SessionCreates``;
    reads: ``SessionReads``; queued turns: ``Multitasking``; approvals: ``ApprovalDesk``; the
    sweep: ``Sweeps``; creates and turns under an idempotency key: ``keyed``)."""

    def __init__(
        self,
        store: Store,
        spec: CompiledSpec,
        command: Sequence[str],
        limits: Limits,
        nursery: trio.Nursery,
        guard: ProcessGuard | None = None,
        launcher: AdapterLauncher = run_adapter,
        forker: ForkServer | None = None,
    ) -> None:
        self.store = store
        self.metrics = Metrics()
        self.webhooks = Webhooks(store, limits.webhooks, self.metrics)  # ends POSTed
        self.spec = spec
        self.command = list(command)
        self.limits = limits
        self.draining = False
        self._nursery = nursery
        self._turns: dict[str, Turn] = {}  # by session id, once the store took them
        self._starts = Starts()  # the sessions whose turn the store is being asked to take
        self._idle = trio.Event()
        self._idle.set()
        self._queues = TurnQueues(limits.max_queued_turns)
        self._parked: set[str] = set()  # sessions whose turn waits for an approval
        self._approval_wake = trio.Event()
        self._admission = Admission(limits)
        self._specs = SessionSpecs()
        #: Creates and turns under an idempotency key (``_idempotency``).
        self.keyed = KeyedRequests(
            store,
            limits.idempotency_window,
            create=self._create_session,
            start=self._start_turn,
            get_session=self.get_session,
        )
        #: With a shared store: this process's leases (``_leases.py``); else ``None``.
        self.leases: Leases | None = None
        if limits.shared_store:
            self.leases = Leases(
                store,
                limits.turn_lease,
                turns=lambda: self._turns,
                closed=self._notify,
                queued=self._queues.__bool__,
                adopted=self.adopt_queued,
            )
        self._sweep_lock = Mutex()
        self._sweeper = Sweeper(
            store,
            limits,
            self.metrics,
            lock=self._sweep_lock,
            running=lambda: [*self._turns, *self._starts, *self._parked],
            expired=self._expired,
        )
        self._draining = trio.Event()
        self._activity: dict[str, trio.Event] = {}
        #: The fork server of a built-in Python adapter (``--fork-server auto``); then no pool.
        self.forker = forker
        self.pool: WarmPool | None = None
        if limits.warm_adapters > 0 and forker is None:
            self.pool = WarmPool(
                command,
                limits.warm_adapters,
                max_size=limits.warm_ceiling,
                max_idle=limits.warm_max_idle,
                stop_grace=limits.adapter_stop_grace,
                guard=guard,
                turns=lambda: len(self._turns),
            )
        self.end_retries = EndRetries(store, self.metrics, nursery, self._queues.wake)
        self._runner = TurnRunner(
            store,
            limits,
            self.metrics,
            self._specs,
            command,
            pool=self.pool,
            forker=forker,
            guard=guard,
            launcher=launcher,
            release=self._release_turn,
            retries=self.end_retries,
            park=self.park,
        )
        self.metrics.watch(self)

    # -- lifecycle -------------------------------------------------------------

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        store: Store,
        spec: CompiledSpec,
        command: Sequence[str],
        limits: Limits,
        guard: ProcessGuard | None = None,
        launcher: AdapterLauncher = run_adapter,
        forker: ForkServer | None = None,
    ) -> AsyncIterator[SessionManager]:
        """Run a manager; on exit every turn is cancelled and its adapter reaped.

        ``forker``: started here (``ForkServerError`` if its adapter does not import).
        """
        async with trio.open_nursery() as nursery:
            manager = cls(store, spec, command, limits, nursery, guard, launcher, forker)
            if forker is not None:
                await nursery.start(forker.run)
            if manager.leases is None:
                await recover(store)
                await manager._load_active()
                await manager.restore_queue()
            else:  # shared: only turns whose process stopped renewing are closed
                await manager.leases.expire()
                await manager.leases.adopt()
                nursery.start_soon(manager.leases.run)
            if manager.pool is not None:
                nursery.start_soon(manager.pool.run)
            await manager.poll_approvals()  # the waiting turns are busy before the pump runs
            refresh = None if manager.leases is None else manager.refresh_queue
            nursery.start_soon(manager._queues.run, manager._busy, manager.start_queued, refresh)
            nursery.start_soon(manager.run_approvals)
            nursery.start_soon(manager.webhooks.run)
            if manager._sweeper.periods():
                nursery.start_soon(manager._sweeper.run)
            try:
                yield manager
            finally:
                manager.start_draining()
                manager.cancel_all("server_shutdown")
                nursery.cancel_scope.cancel()

    async def _load_active(self) -> None:
        for session in await self.store.list(status=SessionStatus.ACTIVE):
            self._admission.take_session(session.id, session.tenant, at_start=True)

    @property
    def turns_in_flight(self) -> int:
        return len(self._turns)

    @property
    def queued_turns(self) -> int:
        """The turns waiting in this process's lines (``multitask: enqueue``)."""
        return len(self._queues)

    @property
    def active_sessions(self) -> int:
        return self._admission.active_sessions

    def start_draining(self) -> None:
        """New sessions and turns are refused from now on; warm adapters are stopped."""
        self.draining = True
        self._draining.set()
        self._queues.close()
        if self.pool is not None:
            self.pool.close()
        for event in self._activity.values():
            event.set()
        self._activity.clear()

    async def wait_draining(self) -> None:
        """Return once the server has started to drain."""
        await self._draining.wait()

    async def wait_idle(self) -> None:
        """Return once no turn is running."""
        await self._idle.wait()

    def cancel_all(self, reason: StopReason) -> None:
        """Cancel every turn outright (SIGKILL); their logs still end properly."""
        for turn in list(self._turns.values()):
            turn.cancel(reason)

    def stop_all(self, reason: StopReason, *, force: bool = False) -> None:
        """Stop every turn, keeping their streams (see ``Turn.stop``)."""
        for turn in list(self._turns.values()):
            turn.stop(reason, force=force)

    # -- sessions --------------------------------------------------------------

    async def end_session(self, session_id: str, tenant: str | None = None) -> None:
        """Mark the session ``ended`` (a terminal session is left as it is)."""
        session = await self.get_session(session_id, tenant)
        if session.status.terminal:
            return
        with contextlib.suppress(SessionExpired):  # expired meanwhile: terminal either way
            await self.store.update(session_id, status=SessionStatus.ENDED)
        self._admission.release_session(session_id)
        await self.drop_all(session_id, "session_ended")
        turn = await self._starts.settled(session_id, self._turns)
        if turn is not None:
            turn.stop("session_ended")
        elif not await self.end_waiting(session_id, "session_ended") and self.leases is not None:
            await cancel_elsewhere(self.store, session_id)  # its turn may run in another process
        self._notify(session_id)

    # -- turns -----------------------------------------------------------------

    async def start_turn(
        self,
        session_id: str,
        text: str,
        *,
        on_disconnect: OnDisconnect | None = None,
        env: Mapping[str, str] | None = None,
        tenant: str | None = None,
        multitask: Multitask | None = None,
        webhook: str | None = None,
    ) -> Turn | QueuedTurn:
        """Admit a turn and start it (or queue it); raise before anything runs if it is refused.

        Checks, in order: ``webhook`` (a URL the turn's end is POSTed to: ``_webhooks``),
        draining, unknown or terminal session (or one of another tenant), a busy session
        (another turn running or waiting): ``multitask`` (default ``Limits.multitask``) says
        what then: ``reject`` raises ``SessionBusy``, ``enqueue`` stores the turn ``queued``
        and returns its ``QueuedTurn`` (``QueueFull`` over ``max_queued_turns``),
        ``interrupt`` stops the running turn and starts this one once it has ended, ahead of
        the waiting ones.  Then the tenant's turn cap, the global turn cap.  Then the turn's
        record is stored (``running``) and its task started.  ``env`` adds to the adapter's
        environment (and makes the turn start its own adapter)."""
        args = (on_disconnect, env, tenant, None, multitask, webhook)
        return await self._start_turn(session_id, text, *args)

    async def _start_turn(
        self,
        session_id: str,
        text: str,
        on_disconnect: OnDisconnect | None,
        env: Mapping[str, str] | None,
        tenant: str | None,
        claim: IdempotencyClaim | None,
        multitask: Multitask | None = None,
        webhook: str | None = None,
    ) -> Turn | QueuedTurn:
        mode = multitask or self.limits.multitask
        record = TurnRecord(new_turn_id(), session_id, text, TurnStatus.RUNNING, utcnow())
        hooks = await self.webhooks.expect(record, webhook)  # stored before the turn is
        held = False  # an interrupting turn holds the session's line until it starts
        try:
            while True:
                if self.draining:
                    raise Draining("server is draining; not accepting new turns")
                async with self._sweep_lock:
                    # The session is read after the running turn is known: one that ends
                    # meanwhile has written its whole log, so last_seq is not stale.
                    parked = await self.parked_turn(session_id)
                    running = await self._starts.settled(session_id, self._turns)
                    parked = None if running else parked
                    # Its last turn's end unwritten (before the read too: a retry may write it)
                    unwritten = session_id in self.end_retries
                    session = await self._startable(session_id, tenant)
                    if unwritten or session_id in self.end_retries:
                        await self.end_retries.settle(session_id)
                        session = await self._startable(session_id, tenant)  # last_seq moved
                    waiting = not held and self._queues.waiting(session_id) > 0
                    if parked is not None and mode == "interrupt":  # denied, then cancelled
                        held = await self.interrupt_waiting(session_id, parked.id, held)
                        continue
                    busy = running is not None or parked is not None
                    if (busy or waiting) and mode != "interrupt":
                        if mode == "reject":
                            raise SessionBusy(f"session {session_id} already has a turn in flight")
                        return await self._enqueue(
                            session, record, on_disconnect, dict(env or {}) or None, tenant, claim
                        )
                    if running is None:
                        try:
                            return await self._launch(
                                session, record, on_disconnect, env, tenant, claim
                            )
                        except SessionBusy:  # another process runs the session's turn
                            if mode == "reject" or self.leases is None:
                                raise
                        if mode == "enqueue":
                            return await self._enqueue(
                                session,
                                record,
                                on_disconnect,
                                dict(env or {}) or None,
                                tenant,
                                claim,
                            )
                    if not held:
                        self._queues.hold(session_id)
                        held = True
                    if running is not None:
                        running.interrupt(record.id)
                    else:
                        await cancel_elsewhere(self.store, session_id)
                await released(running)
        except BaseException:
            await self.webhooks.unborn(record.id, hooks)  # refused: its turn was never stored
            raise
        finally:
            if held:
                self._queues.unhold(session_id)

    async def _launch(
        self,
        session: Session,
        record: TurnRecord,
        on_disconnect: OnDisconnect | None,
        env: Mapping[str, str] | None,
        tenant: str | None,
        claim: IdempotencyClaim | None,
    ) -> Turn:
        """Take the turn's slot, store its record ``running``, start its task and wait until
        it has started its adapter (``Turn.launched``)."""
        session_id = session.id
        turn = new_turn(record, session.last_seq + 1, self.limits, on_disconnect)
        turn.env = dict(env) if env else None
        turn.tenant = tenant
        self._admission.take_turn(turn)
        self._idle = trio.Event()
        trace = TurnTrace(session_id, record.id, turn.protocol)
        turn.env = trace.adapter_env(turn.env)
        try:
            with self._starts.start(session_id):  # the turn is nobody's until it is stored
                if self.leases is None:
                    await self.store.create_turn(record, idempotency=claim)
                else:  # the store's single flight and cap hold across processes
                    await self.store.create_turn(
                        self.leases.claim(record),
                        max_running=self._shared_cap(self.limits.max_concurrent_turns),
                        max_running_per_tenant=self._shared_cap(self.limits.max_turns_per_tenant),
                        idempotency=claim,
                    )
                self._turns[session_id] = turn
        except BaseException:
            self._release_turn(turn)
            turn.feed.finish()
            trace.finish("failed", "internal")
            raise
        self._notify(session_id)
        self._nursery.start_soon(self._runner.run, turn, session, trace)
        self.metrics.turns_started.labels(turn.protocol).inc()
        # Its adapter starts before the caller answers (the response's head): it loads
        # on another core meanwhile.  Shielded: the turn is running already.
        with trio.CancelScope(shield=True):
            await turn.launched.wait()
        return turn

    def _release_turn(self, turn: Turn, *, wake: bool = True) -> None:
        """``turn`` gives back its session and slot (``wake``: it ran, a waiting turn may
        start now; not for a start the store refused, which changed nothing)."""
        if self._turns.get(turn.session_id) is turn:
            del self._turns[turn.session_id]
        self._admission.release_turn(turn)
        if not self._turns and not self._starts:
            self._idle.set()
        self.webhooks.wake()  # its end is in the store: its webhooks are due
        if wake:
            self._queues.wake()

    def _busy(self, session_id: str) -> bool:
        """Whether a turn of the session runs or starts here, or its last turn's end is not
        written yet (a waiting turn starts once it is: ``_end_retry``), or it waits for an
        approval (as far as this process knows: ``_approvals``)."""
        held = (self._turns, self._starts, self.end_retries, self._parked)
        return any(session_id in found for found in held)

    async def cancel_turn(self, session_id: str, tenant: str | None = None) -> None:
        """Stop the session's running turn; the session takes the next one."""
        await self._check_owner(session_id, tenant)
        turn = await self._starts.settled(session_id, self._turns)
        if turn is None:
            if await self.end_waiting(session_id, "cancelled"):  # unknown: SessionNotFound
                return
            if self.leases is not None and await cancel_elsewhere(self.store, session_id):
                return
            raise NoTurn(f"session {session_id} has no turn running")
        turn.stop("cancelled")

    def _shared_cap(self, limit: int) -> int | None:
        """A cap the store enforces across processes (shared store only; 0 = none)."""
        return limit if self.leases is not None and limit > 0 else None

    # -- TTL sweep and retention (``_sweep.py``; its calls: ``Sweeps``) ---------------

    def _expired(self, session_id: str) -> None:
        self._queues.wake()  # its waiting turns leave the line
        self._admission.release_session(session_id)
        self._notify(session_id)
