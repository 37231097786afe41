"""Admission: the caps on active sessions and running turns, global and per tenant.

The global caps are ``trio.CapacityLimiter``s used without blocking: the turn
cap (one token per running turn) and the active-session cap (one token per
active session); per tenant, counters of active sessions and running turns.
All are exact because every check-and-take is synchronous (no ``await`` in
between).  Sessions already active when the server starts are counted even
over the cap (they are not refused); they take freed slots first.
"""

from __future__ import annotations

import math
from collections import Counter

import trio

from trioserve.errors import (
    SessionCapReached,
    TenantSessionCapReached,
    TenantTurnCapReached,
    TurnCapReached,
)
from trioserve.sessions._limits import Limits
from trioserve.sessions._turns import Turn


class Admission:
    """Takes and releases the slots of sessions and turns; refusals raise."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        # With a shared store the store counts (exactly, across processes), also per
        # tenant; not here.
        shared = limits.shared_store
        self._turn_slots = trio.CapacityLimiter(
            _tokens(0 if shared else limits.max_concurrent_turns)
        )
        self._session_slots = trio.CapacityLimiter(_tokens(0 if shared else limits.max_sessions))
        self._holders: set[str] = set()  # sessions holding a session slot
        self._overflow: set[str] = set()  # active sessions found over the cap at start
        self._tenant_of: dict[str, str] = {}  # active session id -> its tenant, if it has one
        self._tenant_sessions: Counter[str] = Counter()  # tenant -> its active sessions
        self._tenant_turns: Counter[str] = Counter()  # tenant -> its running turns

    @property
    def active_sessions(self) -> int:
        return len(self._holders) + len(self._overflow)

    def take_session(self, session_id: str, tenant: str | None, *, at_start: bool = False) -> None:
        """Count an active session; over a cap raise, unless it was active at start."""
        cap = 0 if self.limits.shared_store else self.limits.max_sessions_per_tenant
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

    def release_session(self, session_id: str) -> None:
        """The session is no longer active (a session never taken is ignored)."""
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

    def take_turn(self, turn: Turn) -> None:
        """Count a running turn: its tenant's cap first, then the global one."""
        tenant = turn.tenant
        cap = 0 if self.limits.shared_store else self.limits.max_turns_per_tenant
        if tenant is not None and cap > 0 and self._tenant_turns[tenant] >= cap:
            raise TenantTurnCapReached(f"tenant {tenant} has too many concurrent turns (max {cap})")
        try:
            self._turn_slots.acquire_on_behalf_of_nowait(turn)
        except trio.WouldBlock:
            raise TurnCapReached(
                f"too many concurrent turns (max {self.limits.max_concurrent_turns})"
            ) from None
        if tenant is not None:
            self._tenant_turns[tenant] += 1

    def release_turn(self, turn: Turn) -> None:
        self._turn_slots.release_on_behalf_of(turn)
        if turn.tenant is not None:
            self._tenant_turns[turn.tenant] -= 1
            if not self._tenant_turns[turn.tenant]:
                del self._tenant_turns[turn.tenant]


def _tokens(limit: int) -> int | float:
    return math.inf if limit <= 0 else limit
