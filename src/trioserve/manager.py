"""The session manager: sessions, turns, limits, single-flight, drain, sweep.

The manager knows nothing of HTTP.  It owns a nursery in which every turn
runs as a task with its own cancel scope; a transport starts a turn with
``start_turn`` and reads the turn's events from ``Turn.events``.  The
channel closes only after the turn has released everything it held (the
adapter is reaped, the turn slot and the session lock are free, the last
activity is stored), so a client that saw the end of a stream can start the
next turn at once.

Limits are ``trio.CapacityLimiter``s used without blocking: the global turn
cap (one token per running turn) and the active-session cap (one token per
active session).  Both are exact because every check-and-take happens
without an ``await`` in between.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import secrets
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final, Literal

import trio

from . import wire
from .adapter import AdapterOutcome, EventSink, ProcessGuard, StopPolicy, run_adapter
from .config import Limits, format_duration
from .errors import (
    Draining,
    InvalidRequest,
    NotFound,
    NoTurn,
    SessionBusy,
    SessionCapReached,
    SessionExpired,
    SessionNotFound,
    StoreError,
    TurnCapReached,
)
from .stores.base import Session, SessionStatus, Store, utcnow

log = logging.getLogger("trioserve.manager")

_INPUT_REF: Final = re.compile(r"\$\{inputs\.([A-Za-z0-9_.-]+)\}")
_CLEANUP_DEADLINE: Final = 10.0  # shielded store writes at the end of a turn
EVENT_BUFFER: Final = 256


#: Why a turn was stopped: a client's cancel, its deadline, the session's
#: end, or the server's shutdown.
StopReason = Literal["cancelled", "turn_timeout", "session_ended", "server_shutdown"]


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


def interpolate(task: str, inputs: Mapping[str, str]) -> str:
    """Replace ``${inputs.k}``; every referenced key without a value is an error."""
    missing = sorted({k for k in _INPUT_REF.findall(task) if k not in inputs})
    if missing:
        keys = ", ".join(missing)
        raise InvalidRequest(f"missing inputs referenced by the spec's task: {keys}")
    return _INPUT_REF.sub(lambda m: inputs[m.group(1)], task)


def sweep_interval(ttl: float) -> float:
    """TTL/4, clamped to 1 s .. 1 h."""
    return min(max(ttl / 4, 1.0), 3600.0)


@dataclass(eq=False)
class Turn:
    """One running turn.  ``events`` ends after the turn has fully finished."""

    id: str
    session_id: str
    input: str
    events: trio.MemoryReceiveChannel[wire.Event]
    _send: trio.MemorySendChannel[wire.Event]
    cancel_scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    policy: StopPolicy = field(default_factory=StopPolicy)
    outcome: AdapterOutcome | None = None
    cancel_reason: str | None = None
    #: Why the turn was stopped while its stream stays open (see ``stop``).
    stop_reason: StopReason | None = None

    def cancel(self, reason: str, *, force: bool = False) -> None:
        """Cancel the turn outright (nobody reads its stream any more)."""
        if self.cancel_reason is None:
            self.cancel_reason = reason
        if force:
            self.policy.grace = 0.0
        self.cancel_scope.cancel()

    def stop(self, reason: StopReason, *, force: bool = False) -> None:
        """Stop the turn, keeping its stream: SIGINT now, SIGKILL after the grace.

        The stream gets the adapter's remaining output, then (for a deadline
        or a shutdown) an ``error`` event with ``data.reason``, then one
        ``session.ended`` ``cancelled``, synthesized if the adapter sends none.
        """
        if self.stop_reason is None:
            self.stop_reason = reason
        if force:
            self.policy.grace = 0.0
        self.policy.interrupt()

    def detach(self) -> None:
        """The consumer is gone: the turn is cancelled (the reference behaviour)."""
        self.events.close()
        self.cancel("client disconnected")


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
        self.spec = dict(spec)
        self.command = list(command)
        self.limits = limits
        self.draining = False
        self._nursery = nursery
        self._guard = guard
        self._turns: dict[str, Turn] = {}
        self._idle = trio.Event()
        self._idle.set()
        self._turn_slots = trio.CapacityLimiter(_tokens(limits.max_concurrent_turns))
        self._session_slots = trio.CapacityLimiter(_tokens(limits.max_sessions))
        self._holders: set[str] = set()  # sessions holding a session slot
        self._overflow: set[str] = set()  # active sessions found over the cap at start
        self._sweep_lock = trio.Lock()
        self._draining = trio.Event()

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
            await manager._load_active()
            if limits.session_ttl > 0:
                nursery.start_soon(manager._sweep_loop)
            try:
                yield manager
            finally:
                manager.draining = True
                manager.cancel_all("server stopped", force=True)
                nursery.cancel_scope.cancel()

    async def _load_active(self) -> None:
        for session in await self.store.list(status=SessionStatus.ACTIVE):
            self._take_session_slot(session.id, at_start=True)

    @property
    def turns_in_flight(self) -> int:
        return len(self._turns)

    @property
    def active_sessions(self) -> int:
        return len(self._holders) + len(self._overflow)

    def start_draining(self) -> None:
        self.draining = True
        self._draining.set()

    async def wait_draining(self) -> None:
        """Return once the server has started to drain."""
        await self._draining.wait()

    async def wait_idle(self) -> None:
        """Return once no turn is running."""
        await self._idle.wait()

    def cancel_all(self, reason: str, *, force: bool = False) -> None:
        for turn in list(self._turns.values()):
            turn.cancel(reason, force=force)

    def stop_all(self, reason: StopReason, *, force: bool = False) -> None:
        """Stop every turn, keeping their streams (see ``Turn.stop``)."""
        for turn in list(self._turns.values()):
            turn.stop(reason, force=force)

    async def cancel_turn(self, session_id: str) -> None:
        """Stop the session's running turn; the session takes the next one."""
        turn = self._turns.get(session_id)
        if turn is None:
            await self.store.get(session_id)  # unknown: SessionNotFound
            raise NoTurn(f"session {session_id} has no turn running")
        turn.stop("cancelled")

    # -- sessions --------------------------------------------------------------

    async def create_session(self, inputs: Mapping[str, str] | None = None) -> Session:
        if self.draining:
            raise Draining("server is draining; not accepting new sessions")
        inputs = dict(inputs or {})
        spec = dict(self.spec)
        spec["task"] = interpolate(str(spec.get("task", "")), inputs)
        session_id = new_session_id()
        self._take_session_slot(session_id)
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
        )
        try:
            await self.store.create(session)
        except BaseException:
            self._release_session_slot(session_id)
            raise
        return session

    async def get_session(self, session_id: str) -> Session:
        return await self.store.get(session_id)

    async def list_sessions(
        self, status: SessionStatus | None = None, limit: int | None = None
    ) -> list[Session]:
        return await self.store.list(status=status, limit=limit)

    async def end_session(self, session_id: str) -> None:
        """Mark the session ``ended`` (a terminal session is left as it is)."""
        session = await self.store.get(session_id)
        if session.status.terminal:
            return
        with contextlib.suppress(SessionExpired):  # expired meanwhile: terminal either way
            await self.store.update(session_id, status=SessionStatus.ENDED)
        self._release_session_slot(session_id)
        turn = self._turns.get(session_id)
        if turn is not None:
            turn.stop("session_ended")

    def _take_session_slot(self, session_id: str, *, at_start: bool = False) -> None:
        try:
            self._session_slots.acquire_on_behalf_of_nowait(session_id)
        except trio.WouldBlock:
            if at_start:
                self._overflow.add(session_id)
                return
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

    # -- turns -----------------------------------------------------------------

    async def start_turn(self, session_id: str, text: str) -> Turn:
        """Admit a turn and start it; raise before anything runs if it is refused.

        Checks, in order: draining, unknown or terminal session, another turn
        of the session in flight, the global turn cap.
        """
        if self.draining:
            raise Draining("server is draining; not accepting new turns")
        async with self._sweep_lock:
            try:
                session = await self.store.get(session_id)
            except SessionNotFound:
                raise NotFound(f"session {session_id} not found") from None
            if session.status.terminal:
                raise NotFound(f"session {session_id} is {session.status.value}")
            if self.draining:
                raise Draining("server is draining; not accepting new turns")
            if session_id in self._turns:
                raise SessionBusy(f"session {session_id} already has a turn in flight")
            send, receive = trio.open_memory_channel[wire.Event](EVENT_BUFFER)
            turn = Turn(new_turn_id(), session_id, text, receive, send)
            try:
                self._turn_slots.acquire_on_behalf_of_nowait(turn)
            except trio.WouldBlock:
                raise TurnCapReached(
                    f"too many concurrent turns (max {self.limits.max_concurrent_turns})"
                ) from None
            turn.policy.grace = self.limits.adapter_stop_grace
            self._turns[session_id] = turn
            self._idle = trio.Event()
        self._nursery.start_soon(self._run_turn, turn, session)
        return turn

    async def _run_turn(self, turn: Turn, session: Session) -> None:
        sink = TurnSink(turn, self.limits.turn_timeout)
        try:
            with turn.cancel_scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._touch, turn.session_id)
                    if self.limits.turn_timeout > 0:
                        nursery.start_soon(_deadline, turn, self.limits.turn_timeout)
                    spec = dict(session.spec)
                    spec["task"] = turn.input or str(spec.get("task", ""))
                    spec["sessionId"] = turn.session_id
                    turn.outcome = await run_adapter(
                        self.command,
                        json.dumps(spec, separators=(",", ":")).encode(),
                        turn.session_id,
                        sink,
                        policy=turn.policy,
                        max_event_bytes=self.limits.max_event_bytes,
                        guard=self._guard,
                    )
                    nursery.cancel_scope.cancel()
                if turn.stop_reason is not None and turn.outcome.end_reason is None:
                    await sink.end_cancelled()
        except Exception:
            log.exception("turn %s of session %s failed", turn.id, turn.session_id)
            with trio.CancelScope(shield=True):
                if sink.sent == 0:
                    await _try_send(sink, wire.error_event(turn.session_id, "internal error"))
        finally:
            with trio.CancelScope(shield=True):
                self._turns.pop(turn.session_id, None)
                self._turn_slots.release_on_behalf_of(turn)
                if not self._turns:
                    self._idle.set()
                with trio.move_on_after(_CLEANUP_DEADLINE):
                    await self._touch(turn.session_id)
                await turn._send.aclose()

    async def _touch(self, session_id: str) -> None:
        try:
            await self.store.update(session_id, last_active_at=utcnow())
        except (StoreError, OSError) as exc:
            log.warning("could not record activity of session %s: %s", session_id, exc)

    # -- TTL sweep ---------------------------------------------------------------

    async def _sweep_loop(self) -> None:
        interval = sweep_interval(self.limits.session_ttl)
        while True:
            await trio.sleep(interval)
            try:
                await self.sweep()
            except (StoreError, OSError) as exc:
                log.warning("TTL sweep failed: %s", exc)

    async def sweep(self) -> list[str]:
        """Expire active sessions idle longer than the TTL, except those in a turn."""
        cutoff = utcnow() - timedelta(seconds=self.limits.session_ttl)
        async with self._sweep_lock:
            expired = await self.store.mark_expired(cutoff, exclude=set(self._turns))
        for session_id in expired:
            self._release_session_slot(session_id)
        if expired:
            log.info("expired %d idle session(s)", len(expired))
        return expired


_NOTICES: Final[dict[str, str]] = {
    "turn_timeout": "turn stopped: it ran longer than the turn timeout ({limit})",
    "server_shutdown": "turn stopped: the server is shutting down",
}


class TurnSink(EventSink):
    """A turn's event sink: puts the stop notice before the turn's last event.

    A turn stopped by its deadline or by a shutdown gets an ``error`` event
    with ``data.reason`` right before its ``session.ended``; any stopped
    turn's ``session.ended`` says ``cancelled`` when the server made it.
    """

    def __init__(self, turn: Turn, turn_timeout: float) -> None:
        super().__init__(turn._send)
        self._turn = turn
        self._limit = format_duration(turn_timeout)

    async def send(self, event: wire.Event) -> bool:
        reason = self._turn.stop_reason
        if event.is_end and reason in _NOTICES:
            message = _NOTICES[reason].format(limit=self._limit)
            await super().send(wire.error_event(self._turn.session_id, message, reason=reason))
        return await super().send(event)

    async def end_cancelled(self) -> None:
        """The ``session.ended`` of a stopped turn whose adapter sent none."""
        data: dict[str, Any] = {"reason": "cancelled"}
        if self._turn.stop_reason not in (None, "cancelled"):
            data["message"] = str(self._turn.stop_reason).replace("_", " ")
        await self.send(wire.synthesize(wire.SESSION_ENDED, self._turn.session_id, data))


async def _deadline(turn: Turn, seconds: float) -> None:
    await trio.sleep(seconds)
    turn.stop("turn_timeout")


async def _try_send(sink: EventSink, event: wire.Event) -> None:
    with trio.move_on_after(1):
        await sink.send(event)


def _tokens(limit: int) -> int | float:
    return math.inf if limit <= 0 else limit
