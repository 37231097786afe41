"""The session manager: sessions, turns, limits, single-flight, drain, sweep.

The manager knows nothing of HTTP.  It owns a nursery in which every turn
runs as a task with its own cancel scope (``turns.py`` has the turn, its
log and its feed); a transport starts a turn with ``start_turn`` and reads
its events with ``turn_events``, or any session's log with ``events``.  A
turn's feed finishes only after the turn has released everything it held
(the adapter is reaped, the log and the turn record are written, the turn
slot and the session lock are free), so a client that saw the end of a
stream can start the next turn at once.

Limits are ``trio.CapacityLimiter``s used without blocking: the global turn
cap (one token per running turn) and the active-session cap (one token per
active session); per tenant, counters of active sessions and running turns.
All are exact because every check-and-take happens without an ``await`` in
between.

Tenants: every call that names a session takes the caller's ``tenant`` (the
owner of its API key; ``None`` when the server runs without keys, which
sees every session).  A session belongs to the tenant that created it; for
any other tenant it does not exist (``NotFound``, the same message as for an
unknown id), and lists leave it out.

On start the manager closes what an earlier process left ``running`` (a
crash, ``kill -9``): each such turn becomes ``interrupted`` and its log gets
an ``error`` (``data.reason: "server_restart"``) and a ``session.ended``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from functools import partial
from typing import Any, Final, NamedTuple

import trio

from trioserve.errors import (
    Draining,
    InvalidRequest,
    NotFound,
    NoTurn,
    SessionBusy,
    SessionCapReached,
    SessionExpired,
    SessionNotFound,
    StoreError,
    TenantSessionCapReached,
    TenantTurnCapReached,
    TurnCapReached,
)
from trioserve.observe._metrics import Metrics
from trioserve.observe._tracing import TurnTrace
from trioserve.protocol import SESSION_ENDED, OnDisconnect, SessionStatus, TurnStatus
from trioserve.runtime import _wire as wire
from trioserve.runtime._pool import WarmPool
from trioserve.runtime._process import ProcessGuard, crash_summary, run_adapter, stderr_text
from trioserve.sessions._eventlog import check_cursor, follow_turn, read_log, read_stored
from trioserve.sessions._limits import Limits
from trioserve.sessions._turns import Feed, StopReason, Turn, TurnLog, end_of, log_end, logged
from trioserve.stores.base import (
    LoggedEvent,
    Session,
    SessionKey,
    Store,
    TurnEnd,
    TurnRecord,
    utcnow,
)
from trioserve.units import format_duration

log = logging.getLogger("trioserve.manager")

#: ``${inputs.<key>}``; as in the reference, a key is any text (but braces, ``$``
#: and control characters).
_INPUT_REF: Final = re.compile(r"\$\{inputs\.([^${}\x00-\x1f]+)\}")
_CLEANUP_DEADLINE: Final = 10.0  # shielded store writes at the end of a turn


def new_session_id() -> str:
    """``s_<base36 millis><8 hex>``; clients treat it as opaque."""
    return "s_" + _base36(int(time.time() * 1000)) + secrets.token_hex(4)


def new_turn_id() -> str:
    return "t_" + _base36(int(time.time() * 1000)) + secrets.token_hex(4)


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


def missing_inputs(task: str, inputs: Mapping[str, str]) -> list[str]:
    """The keys ``${inputs.<key>}`` of ``task`` has no value for, sorted, each once."""
    return sorted({k for k in _INPUT_REF.findall(task) if k not in inputs})


def interpolate(task: str, inputs: Mapping[str, str]) -> str:
    """Replace ``${inputs.<key>}`` by the given values; one without a value stays as written."""
    return _INPUT_REF.sub(lambda m: inputs.get(m.group(1), m.group(0)), task)


def sweep_interval(ttl: float) -> float:
    """TTL/4, clamped to 1 s .. 1 h."""
    return min(max(ttl / 4, 1.0), 3600.0)


class Swept(NamedTuple):
    """What one pass of the sweep did."""

    expired: list[str]  # the ids of the sessions it expired, sorted
    events_dropped: int
    sessions_purged: int


class SessionPage(NamedTuple):
    """A page of sessions; ``next`` is where the next page starts (``None``: this is the last)."""

    sessions: list[Session]
    next: SessionKey | None


class SessionManager:
    """Owns all server-side session state; see the module doc."""

    def __init__(
        self,
        store: Store,
        spec: Mapping[str, Any],
        command: Sequence[str],
        limits: Limits,
        nursery: trio.Nursery,
        guard: ProcessGuard | None = None,
    ) -> None:
        self.store = store
        self.metrics = Metrics()
        self.spec = dict(spec)
        self.command = list(command)
        self.limits = limits
        self.draining = False
        self._nursery = nursery
        self._guard = guard
        self._turns: dict[str, Turn] = {}  # by session id
        self._idle = trio.Event()
        self._idle.set()
        self._turn_slots = trio.CapacityLimiter(_tokens(limits.max_concurrent_turns))
        self._session_slots = trio.CapacityLimiter(_tokens(limits.max_sessions))
        self._holders: set[str] = set()  # sessions holding a session slot
        self._overflow: set[str] = set()  # active sessions found over the cap at start
        self._tenant_of: dict[str, str] = {}  # active session id -> its tenant, if it has one
        self._tenant_sessions: Counter[str] = Counter()  # tenant -> its active sessions
        self._tenant_turns: Counter[str] = Counter()  # tenant -> its running turns
        self._sweep_lock = trio.Lock()
        self._draining = trio.Event()
        self._activity: dict[str, trio.Event] = {}
        self.pool: WarmPool | None = None
        if limits.warm_adapters > 0:
            self.pool = WarmPool(
                command,
                limits.warm_adapters,
                max_size=limits.warm_adapters_max,
                max_idle=limits.warm_max_idle,
                stop_grace=limits.adapter_stop_grace,
                guard=guard,
                turns=lambda: len(self._turns),
            )
        self.metrics.watch(self)

    # -- lifecycle -------------------------------------------------------------

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        store: Store,
        spec: Mapping[str, Any],
        command: Sequence[str],
        limits: Limits,
        guard: ProcessGuard | None = None,
    ) -> AsyncIterator[SessionManager]:
        """Run a manager; on exit every turn is cancelled and its adapter reaped."""
        async with trio.open_nursery() as nursery:
            manager = cls(store, spec, command, limits, nursery, guard)
            await manager.recover()
            await manager._load_active()
            if manager.pool is not None:
                nursery.start_soon(manager.pool.run)
            if manager._sweep_periods():
                nursery.start_soon(manager._sweep_loop)
            try:
                yield manager
            finally:
                manager.start_draining()
                manager.cancel_all("server_shutdown")
                nursery.cancel_scope.cancel()

    async def _load_active(self) -> None:
        for session in await self.store.list(status=SessionStatus.ACTIVE):
            self._take_session_slot(session.id, session.tenant, at_start=True)

    async def recover(self) -> list[TurnRecord]:
        """Close the turns an earlier process left ``running``; return them."""
        interrupted = await self.store.running_turns()
        for record in interrupted:
            session = await self.store.get(record.session_id)
            message = "turn interrupted: the server stopped while it ran"
            events = [
                wire.error_event(session.id, message, reason="server_restart"),
                wire.synthesize(SESSION_ENDED, session.id, {"reason": "error", "message": message}),
            ]
            first = session.last_seq + 1
            await self.store.append_events(
                session.id,
                record.id,
                [logged(event, first + i, record.id) for i, event in enumerate(events)],
                end=TurnEnd(TurnStatus.INTERRUPTED, "server_restart", utcnow()),
            )
            log.warning("turn %s of session %s was interrupted by a restart", record.id, session.id)
        return interrupted

    @property
    def turns_in_flight(self) -> int:
        return len(self._turns)

    @property
    def active_sessions(self) -> int:
        return len(self._holders) + len(self._overflow)

    def start_draining(self) -> None:
        """New sessions and turns are refused from now on; warm adapters are stopped."""
        self.draining = True
        self._draining.set()
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

    def running_turn(self, session_id: str) -> Turn | None:
        return self._turns.get(session_id)

    def activity(self, session_id: str) -> trio.Event:
        """An event set when a turn of the session starts, it ends, or the server drains."""
        event = self._activity.get(session_id)
        if event is None:
            event = self._activity[session_id] = trio.Event()
            if self.draining:
                event.set()
        return event

    def _notify(self, session_id: str) -> None:
        event = self._activity.pop(session_id, None)
        if event is not None:
            event.set()

    # -- sessions --------------------------------------------------------------

    async def create_session(
        self, inputs: Mapping[str, str] | None = None, *, tenant: str | None = None
    ) -> Session:
        """A new active session of ``tenant``; refused over the global or the tenant's cap."""
        if self.draining:
            raise Draining("server is draining; not accepting new sessions")
        inputs = dict(inputs or {})
        spec = dict(self.spec)
        task = str(spec.get("task", ""))
        missing = missing_inputs(task, inputs)
        if missing and self.limits.require_inputs:
            keys = ", ".join(missing)
            raise InvalidRequest(f"missing inputs referenced by the spec's task: {keys}")
        spec["task"] = interpolate(task, inputs)
        session_id = new_session_id()
        self._take_session_slot(session_id, tenant)
        now = utcnow()
        session = Session(
            id=session_id,
            agent_name=str(spec["metadata"]["name"]),
            runtime_type=str(spec["runtime"]["type"]),
            status=SessionStatus.ACTIVE,
            created_at=now,
            last_active_at=now,
            spec=spec,
            inputs=inputs,
            tenant=tenant,
        )
        try:
            await self.store.create(session)
        except BaseException:
            self._release_session_slot(session_id)
            raise
        if missing:
            log.warning(
                "session %s: no value for inputs referenced by the spec's task: %s"
                " (left as written)",
                session_id,
                ", ".join(missing),
            )
        return session

    async def get_session(self, session_id: str, tenant: str | None = None) -> Session:
        """The session, if ``tenant`` may see it (else ``SessionNotFound``)."""
        session = await self.store.get(session_id)
        if tenant is not None and session.tenant != tenant:
            raise SessionNotFound(f"session {session_id} not found")
        return session

    async def _check_owner(self, session_id: str, tenant: str | None) -> None:
        if tenant is not None:
            await self.get_session(session_id, tenant)

    async def list_sessions(
        self,
        status: SessionStatus | None = None,
        limit: int | None = None,
        before: SessionKey | str | None = None,
        *,
        tenant: str | None = None,
    ) -> SessionPage:
        """The sessions ``tenant`` owns (every session for ``None``), most recently
        active first, ``limit`` of them after ``before``.

        ``before`` is a ``SessionKey`` (where an earlier page ended) or a
        session id, which stands for that session's key as it is now
        (``InvalidRequest`` if there is no such session, or it is another
        tenant's).
        """
        if isinstance(before, str):
            try:
                before = (await self.get_session(before, tenant)).key
            except SessionNotFound:
                raise InvalidRequest(
                    f"before: {before!r} is neither a page token nor the id of a session"
                ) from None
        wanted = None if limit is None else limit + 1  # one more: is there a next page?
        found = await self.store.list(status=status, limit=wanted, before=before, tenant=tenant)
        if limit is not None and len(found) > limit:
            return SessionPage(found[:limit], found[limit - 1].key)
        return SessionPage(found, None)

    async def end_session(self, session_id: str, tenant: str | None = None) -> None:
        """Mark the session ``ended`` (a terminal session is left as it is)."""
        session = await self.get_session(session_id, tenant)
        if session.status.terminal:
            return
        with contextlib.suppress(SessionExpired):  # expired meanwhile: terminal either way
            await self.store.update(session_id, status=SessionStatus.ENDED)
        self._release_session_slot(session_id)
        turn = self._turns.get(session_id)
        if turn is not None:
            turn.stop("session_ended")
        self._notify(session_id)

    def _take_session_slot(
        self, session_id: str, tenant: str | None, *, at_start: bool = False
    ) -> None:
        cap = self.limits.max_sessions_per_tenant
        if tenant is not None and cap > 0 and not at_start and self._tenant_sessions[tenant] >= cap:
            raise TenantSessionCapReached(
                f"tenant {tenant} has too many active sessions (max {cap})"
            )
        if tenant is not None:
            self._tenant_of[session_id] = tenant
            self._tenant_sessions[tenant] += 1
        try:
            self._session_slots.acquire_on_behalf_of_nowait(session_id)
        except trio.WouldBlock:
            if at_start:
                self._overflow.add(session_id)
                return
            self._release_tenant_session(session_id)
            raise SessionCapReached(
                f"too many active sessions (max {self.limits.max_sessions})"
            ) from None
        self._holders.add(session_id)

    def _release_session_slot(self, session_id: str) -> None:
        if session_id in self._holders:
            self._holders.discard(session_id)
            self._session_slots.release_on_behalf_of(session_id)
            if self._overflow:
                # Sessions found over the cap at start take freed slots first.
                heir = self._overflow.pop()
                self._session_slots.acquire_on_behalf_of_nowait(heir)
                self._holders.add(heir)
        self._overflow.discard(session_id)
        self._release_tenant_session(session_id)

    def _release_tenant_session(self, session_id: str) -> None:
        tenant = self._tenant_of.pop(session_id, None)
        if tenant is not None:
            self._tenant_sessions[tenant] -= 1
            if not self._tenant_sessions[tenant]:
                del self._tenant_sessions[tenant]

    # -- turns -----------------------------------------------------------------

    async def start_turn(
        self,
        session_id: str,
        text: str,
        *,
        on_disconnect: OnDisconnect | None = None,
        env: Mapping[str, str] | None = None,
        tenant: str | None = None,
    ) -> Turn:
        """Admit a turn and start it; raise before anything runs if it is refused.

        Checks, in order: draining, unknown or terminal session (or one of
        another tenant), another turn of the session in flight, the tenant's
        turn cap, the global turn cap.  Then the turn's record
        is stored (``running``) and its task started.  ``env`` adds to the
        adapter's environment (and makes the turn start its own adapter).
        """
        if self.draining:
            raise Draining("server is draining; not accepting new turns")
        async with self._sweep_lock:
            try:
                session = await self.get_session(session_id, tenant)
            except SessionNotFound:
                raise NotFound(f"session {session_id} not found") from None
            if session.status.terminal:
                raise NotFound(f"session {session_id} is {session.status.value}")
            if self.draining:
                raise Draining("server is draining; not accepting new turns")
            if session_id in self._turns:
                raise SessionBusy(f"session {session_id} already has a turn in flight")
            record = TurnRecord(new_turn_id(), session_id, text, TurnStatus.RUNNING, utcnow())
            turn = Turn(record, Feed(session.last_seq + 1))
            turn.on_disconnect = on_disconnect or self.limits.on_disconnect
            turn.env = dict(env) if env else None
            turn.tenant = tenant
            cap = self.limits.max_turns_per_tenant
            if tenant is not None and cap > 0 and self._tenant_turns[tenant] >= cap:
                raise TenantTurnCapReached(
                    f"tenant {tenant} has too many concurrent turns (max {cap})"
                )
            try:
                self._turn_slots.acquire_on_behalf_of_nowait(turn)
            except trio.WouldBlock:
                raise TurnCapReached(
                    f"too many concurrent turns (max {self.limits.max_concurrent_turns})"
                ) from None
            if tenant is not None:
                self._tenant_turns[tenant] += 1
            turn.policy.grace = self.limits.adapter_stop_grace
            self._turns[session_id] = turn
            self._idle = trio.Event()
            trace = TurnTrace(session_id, record.id)
            turn.env = trace.adapter_env(turn.env)
            try:
                await self.store.create_turn(record)
            except BaseException:
                self._release_turn(turn)
                turn.feed.finish()
                trace.finish("failed", "internal")
                raise
        self._notify(session_id)
        self._nursery.start_soon(self._run_turn, turn, session, trace)
        self.metrics.turns_started.inc()
        return turn

    def _release_turn(self, turn: Turn) -> None:
        self._turns.pop(turn.session_id, None)
        self._turn_slots.release_on_behalf_of(turn)
        if turn.tenant is not None:
            self._tenant_turns[turn.tenant] -= 1
            if not self._tenant_turns[turn.tenant]:
                del self._tenant_turns[turn.tenant]
        if not self._turns:
            self._idle.set()

    async def _run_turn(self, turn: Turn, session: Session, trace: TurnTrace) -> None:
        turn_log = TurnLog(self.store, turn, self.limits.turn_timeout, self.metrics)
        failed = False
        try:
            with turn.cancel_scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(turn_log.run)
                    nursery.start_soon(_first_event, turn, trace)
                    if self.limits.turn_timeout > 0:
                        nursery.start_soon(_deadline, turn, self.limits.turn_timeout)
                    spec = dict(session.spec)
                    spec["task"] = turn.record.input or str(spec.get("task", ""))
                    spec["sessionId"] = turn.session_id
                    started = None
                    if self.pool is not None and turn.env is None:
                        first = partial(turn.feed.wait, turn.feed.first_seq - 1)
                        started = await self.pool.take(first)
                    turn.warm = started is not None
                    if turn.warm:
                        trace.adapter_started(warm=True)
                    turn.outcome = await run_adapter(
                        self.command,
                        json.dumps(spec, separators=(",", ":")).encode(),
                        turn.session_id,
                        turn_log,
                        policy=turn.policy,
                        max_event_bytes=self.limits.max_event_bytes,
                        env=None if turn.env is None else {**os.environ, **turn.env},
                        guard=trace.guard(self._guard),
                        started=started,
                        stderr_to_client=self.limits.adapter_stderr == "client",
                    )
                    if self.limits.adapter_stderr == "log":
                        _log_crash(turn)
                    nursery.cancel_scope.cancel()
        except Exception:
            failed = True
            log.exception("turn %s of session %s failed", turn.id, turn.session_id)
        finally:
            trace.ending()
            with trio.CancelScope(shield=True):
                if failed and turn_log.sent == 0:
                    turn_log.add(wire.error_event(turn.session_id, "internal error"))
                elif turn.stop_reason is not None and not turn_log.ended:
                    turn_log.end_cancelled()
                turn.end = end_of(turn, failed=failed)
                with trio.move_on_after(_CLEANUP_DEADLINE):
                    try:
                        await turn_log.close(turn.end)
                    except (StoreError, OSError) as exc:
                        log.error("turn %s: could not write its log: %s", turn.id, exc)
                self._release_turn(turn)
                turn_log.finish()
                log_end(turn, turn_log.sent)
                trace.finish(turn.end.status.value, turn.end.reason)
                self.metrics.turn_ended(turn, turn_log.first_event_at)

    async def cancel_turn(self, session_id: str, tenant: str | None = None) -> None:
        """Stop the session's running turn; the session takes the next one."""
        await self._check_owner(session_id, tenant)
        turn = self._turns.get(session_id)
        if turn is None:
            await self.store.get(session_id)  # unknown: SessionNotFound
            raise NoTurn(f"session {session_id} has no turn running")
        turn.stop("cancelled")

    async def get_turn(
        self, session_id: str, turn_id: str, tenant: str | None = None
    ) -> TurnRecord:
        await self._check_owner(session_id, tenant)
        return await self.store.get_turn(session_id, turn_id)

    async def list_turns(self, session_id: str, tenant: str | None = None) -> list[TurnRecord]:
        await self.get_session(session_id, tenant)  # unknown or not theirs: SessionNotFound
        return await self.store.list_turns(session_id)

    # -- events ------------------------------------------------------------------

    def turn_events(
        self, turn: Turn, *, idle: float = math.inf
    ) -> AsyncIterator[list[LoggedEvent]]:
        """Every event of ``turn``, live, in batches (``[]``: idle for ``idle`` seconds)."""
        return follow_turn(self.store, turn, turn.feed.first_seq - 1, idle=idle)

    async def events(
        self,
        session_id: str,
        after: int = 0,
        *,
        turn_id: str | None = None,
        follow: bool = False,
        idle: float = math.inf,
        tenant: str | None = None,
    ) -> AsyncIterator[list[LoggedEvent]]:
        """The session's log after seq ``after``, then live (see ``eventlog.read_log``).

        Raises before anything is read: ``NotFound`` (session, also one of
        another tenant, or turn),
        ``InvalidRequest`` (a cursor past the end), ``CursorExpired``, and
        ``Draining`` for ``follow`` once the server drains (it would end at
        once; the client should follow the next server instead).
        """
        if follow and self.draining:
            raise Draining("server is draining; not following sessions")
        await self._check_owner(session_id, tenant)
        await check_cursor(self.store, session_id, after, turn_id)
        return read_log(self, session_id, after, turn_id=turn_id, follow=follow, idle=idle)

    async def export(
        self,
        session_id: str,
        after: int = 0,
        *,
        turn_id: str | None = None,
        tenant: str | None = None,
    ) -> AsyncIterator[list[LoggedEvent]]:
        """The logged events after seq ``after`` as the store has them now (no live part)."""
        await self._check_owner(session_id, tenant)
        await check_cursor(self.store, session_id, after, turn_id)
        return read_stored(self.store, session_id, after, turn_id=turn_id)

    # -- TTL sweep and retention -------------------------------------------------

    def _sweep_periods(self) -> list[float]:
        """The TTL and retentions that are on (each sets how often the sweep runs)."""
        limits = self.limits
        periods = (limits.session_ttl, limits.event_retention, limits.session_retention)
        return [seconds for seconds in periods if seconds > 0]

    async def _sweep_loop(self) -> None:
        interval = min(sweep_interval(seconds) for seconds in self._sweep_periods())
        while True:
            await trio.sleep(interval)
            try:
                await self.sweep()
            except (StoreError, OSError) as exc:
                log.warning("sweep failed: %s", exc)

    async def sweep(self) -> Swept:
        """One pass: expire idle sessions, drop old logged events, purge old ended sessions.

        Each part runs only when its limit is on (``session_ttl``,
        ``event_retention``, ``session_retention``).
        """
        limits = self.limits
        expired = await self.expire_idle() if limits.session_ttl > 0 else []
        dropped = await self.drop_old_events() if limits.event_retention > 0 else 0
        purged = await self.purge_ended() if limits.session_retention > 0 else 0
        return Swept(expired, dropped, purged)

    async def expire_idle(self) -> list[str]:
        """Expire active sessions idle longer than the TTL, except those in a turn."""
        cutoff = utcnow() - timedelta(seconds=self.limits.session_ttl)
        async with self._sweep_lock:
            expired = await self.store.mark_expired(cutoff, exclude=set(self._turns))
        for session_id in expired:
            self._release_session_slot(session_id)
            self._notify(session_id)
        if expired:
            log.info("expired %d idle session(s)", len(expired))
        return expired

    async def drop_old_events(self) -> int:
        """Drop the logged events of turns that ended longer ago than the retention."""
        cutoff = utcnow() - timedelta(seconds=self.limits.event_retention)
        dropped = await self.store.drop_events(cutoff)
        self.metrics.events_dropped.inc(dropped)
        if dropped:
            log.info("dropped %d logged event(s) older than the retention", dropped)
        return dropped

    async def purge_ended(self) -> int:
        """Delete the sessions that ended longer ago than the retention, turns and logs too.

        Ended, expired and failed sessions go once they have been terminal for
        ``session_retention``; a session whose turn still runs stays.
        """
        retention = self.limits.session_retention
        purged = await self.store.purge_sessions(utcnow() - timedelta(seconds=retention))
        self.metrics.sessions_purged.inc(purged)
        if purged:
            log.info(
                "purged %d session(s) ended more than %s ago", purged, format_duration(retention)
            )
        return purged


def _log_crash(turn: Turn) -> None:
    """With ``--adapter-stderr log``: a crashed adapter's stderr tail, for the operator only."""
    outcome = turn.outcome
    if outcome is None or outcome.error_reason != "adapter_exit":
        return
    log.warning(
        "turn %s of session %s: %s; stderr: %s",
        turn.id,
        turn.session_id,
        crash_summary(outcome),
        stderr_text(outcome) or "(none)",
    )


async def _deadline(turn: Turn, seconds: float) -> None:
    await trio.sleep(seconds)
    turn.stop("turn_timeout")


def _tokens(limit: int) -> int | float:
    return math.inf if limit <= 0 else limit


async def _first_event(turn: Turn, trace: TurnTrace) -> None:
    """Ends the turn's ``first_event`` span once its first event is logged."""
    await turn.feed.wait(turn.feed.first_seq - 1)
    if turn.feed.published >= turn.feed.first_seq:
        trace.first_event()
