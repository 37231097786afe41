"""``MemoryStore``: the session store for ``--in-memory``; nothing survives the process.

Guarantees, beyond the ``Store`` contract:

- Every method is atomic: it never awaits between reading and writing the
  table, so concurrent Trio tasks see each call happen all at once.
- Every method is a cancellation point, taken *before* it acts (cancelled,
  it has changed nothing), not a schedule point: it waits for nothing.
- Callers cannot reach the store's state: ``spec`` and ``inputs`` are copied
  on the way in and on the way out; the events of a batch are copied into
  the log (turn records and events themselves are immutable).
- Each session's log is a list in seq order; ``read_events`` finds its
  window by bisection (and a turn's events within the turn's seq range),
  never by scanning the whole log.  ``drop_events`` and ``purge_sessions``
  are each one atomic step.
- It accepts exactly what ``SQLiteStore`` accepts: ``spec`` and ``inputs``
  must be JSON-serialisable (they are stored as their JSON round trip, so a
  tuple comes back as a list), and datetimes must be timezone-aware (they
  come back in UTC).
"""

from __future__ import annotations

import bisect
import builtins
import heapq
import itertools
from dataclasses import replace
from datetime import datetime
from typing import Any

import trio
from pydantic_core import from_json

from trioserve.errors import (
    DuplicateSession,
    DuplicateTurn,
    SessionBusy,
    SessionCapReached,
    SessionExpired,
    SessionNotFound,
    StoreError,
    TurnNotFound,
)
from trioserve.stores.approvals import ApprovalRecord
from trioserve.stores.base import Store
from trioserve.stores.checks import (
    Append,
    EventQuery,
    SessionChange,
    SessionQuery,
    TenantCount,
    check_append,
    check_running,
    check_tenant_sessions,
    copy_json,
    turn_order,
)
from trioserve.stores.memory_approvals import MemoryApprovals
from trioserve.stores.memory_crons import MemoryCrons
from trioserve.stores.memory_outbox import MemoryOutbox
from trioserve.stores.outbox import WebhookDelivery
from trioserve.stores.records import (
    UNSET,
    IdempotencyKeyBound,
    IdempotencyRecord,
    LogBounds,
    LoggedEvent,
    Session,
    SessionKey,
    SessionStatus,
    TurnEnd,
    TurnRecord,
    TurnStatus,
)

__all__ = ["MemoryStore"]


def _copy_out(session: Session) -> Session:
    return replace(session, spec=copy_json(session.spec), inputs=dict(session.inputs))


def _up_to(events: builtins.list[LoggedEvent], max_bytes: int) -> builtins.list[LoggedEvent]:
    """The first of ``events`` up to the one that makes their size reach ``max_bytes``."""
    size = 0
    for i, event in enumerate(events):
        size += len(event.raw)
        if size >= max_bytes:
            return events[: i + 1]
    return events


def _seq(event: LoggedEvent) -> int:
    return event.seq


def _list_order(session: Session) -> SessionKey:
    return session.key


class MemoryStore(MemoryApprovals, MemoryCrons, MemoryOutbox, Store):
    """Dicts of sessions, turns and per-session event lists kept in this process."""

    description = "memory"

    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._turns: dict[str, TurnRecord] = {}  # every turn, by its (unique) id
        self._turns_of: dict[str, set[str]] = {}  # session id -> its turn ids
        self._logs: dict[str, list[LoggedEvent]] = {}  # session id -> its events, seq order
        #: Finished turns whose events ``drop_events`` has not dropped yet.
        self._undropped: set[str] = set()
        #: Session id -> the id of its running turn (at most one: single flight).
        self._running: dict[str, str] = {}
        #: (tenant, key) -> the idempotency key's record.
        self._keys: dict[tuple[str | None, str], IdempotencyRecord] = {}
        self._webhooks: dict[str, WebhookDelivery] = {}  # the outbox, by id (``memory_outbox``)
        self._approvals: dict[str, ApprovalRecord] = {}  # by id (``memory_approvals``)
        self._closed = False
        self._init_crons()

    async def _enter(self) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._closed:
            raise StoreError("store is closed")

    def _row(self, session_id: str) -> Session:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise SessionNotFound(f"session {session_id} not found") from None

    def _turn(self, session_id: str, turn_id: str) -> TurnRecord:
        turn = self._turns.get(turn_id)
        if turn is None or turn.session_id != session_id:
            raise TurnNotFound(f"turn {turn_id} of session {session_id} not found")
        return turn

    async def _create(
        self,
        session: Session,
        spec_json: str,
        inputs_json: str,
        max_active: int | None,
        tenant_cap: int | None = None,
        key: IdempotencyRecord | None = None,
    ) -> None:
        await self._enter()
        self._check_unbound(key)
        if session.id in self._sessions:
            raise DuplicateSession(f"session {session.id!r} already exists")
        if tenant_cap is not None and session.tenant is not None:
            count = sum(
                1
                for s in self._sessions.values()
                if s.status is SessionStatus.ACTIVE and s.tenant == session.tenant
            )
            check_tenant_sessions(TenantCount(session.tenant, count, tenant_cap))
        if max_active is not None:
            active = sum(1 for s in self._sessions.values() if s.status is SessionStatus.ACTIVE)
            if active >= max_active:
                raise SessionCapReached(f"too many active sessions (max {max_active})")
        self._sessions[session.id] = replace(
            session, spec=from_json(spec_json), inputs=from_json(inputs_json)
        )
        self._keep(key)

    async def get(self, session_id: str) -> Session:
        await self._enter()
        return _copy_out(self._row(session_id))

    async def _update(self, session_id: str, change: SessionChange) -> Session:
        status, last_active_at, adapter_state, now = change
        await self._enter()
        current = self._row(session_id)
        new_status = current.status if status is None else status
        if current.status is SessionStatus.EXPIRED and new_status is not SessionStatus.EXPIRED:
            raise SessionExpired(f"session {session_id!r} is expired; it cannot become {status}")
        ended_at = None
        if new_status.terminal:
            ended_at = now if current.ended_at is None else current.ended_at
        updated = replace(
            current,
            status=new_status,
            ended_at=ended_at,
            last_active_at=current.last_active_at if last_active_at is None else last_active_at,
            adapter_state=current.adapter_state if adapter_state is UNSET else adapter_state,
        )
        self._sessions[session_id] = updated
        return _copy_out(updated)

    async def delete(self, session_id: str) -> None:
        await self._enter()
        self._forget(session_id)

    def _forget(self, session_id: str) -> None:
        """Drop the session, its turns and its log."""
        self._sessions.pop(session_id, None)
        self._running.pop(session_id, None)
        for turn_id in self._turns_of.pop(session_id, ()):
            del self._turns[turn_id]
            self._undropped.discard(turn_id)
        self._logs.pop(session_id, None)
        for gone in [a.id for a in self._approvals.values() if a.session_id == session_id]:
            del self._approvals[gone]

    async def _list(self, query: SessionQuery) -> builtins.list[Session]:
        agent_name, status, limit, after, tenant = query
        await self._enter()
        found = (
            s
            for s in self._sessions.values()
            if (agent_name is None or s.agent_name == agent_name)
            and (status is None or s.status == status)
            and (tenant is None or s.tenant == tenant)
            and (after is None or s.key < after)
        )
        if limit is None:
            ordered = sorted(found, key=_list_order, reverse=True)
        else:  # a page: no need to sort them all
            ordered = heapq.nlargest(limit, found, key=_list_order)
        return [_copy_out(s) for s in ordered]

    async def _mark_expired(
        self, cutoff: datetime, exclude: frozenset[str], now: datetime
    ) -> builtins.list[str]:
        await self._enter()
        moved = sorted(
            s.id
            for s in self._sessions.values()
            if s.status is SessionStatus.ACTIVE
            and s.last_active_at < cutoff
            and s.id not in exclude
        )
        for session_id in moved:
            self._sessions[session_id] = replace(
                self._sessions[session_id], status=SessionStatus.EXPIRED, ended_at=now
            )
        return moved

    async def _count(self, status: SessionStatus) -> int:
        await self._enter()
        return sum(1 for s in self._sessions.values() if s.status == status)

    async def _purge_sessions(self, cutoff: datetime) -> int:
        await self._enter()
        busy = {t.session_id for t in self._turns.values() if t.status is TurnStatus.RUNNING}
        doomed = [
            s.id
            for s in self._sessions.values()
            if s.status.terminal
            and s.ended_at is not None
            and s.ended_at < cutoff
            and s.id not in busy
        ]
        for session_id in doomed:
            self._forget(session_id)
        return len(doomed)

    # -- turns and the event log --------------------------------------------

    async def _create_turn(
        self,
        turn: TurnRecord,
        max_running: int | None,
        tenant_cap: int | None = None,
        key: IdempotencyRecord | None = None,
    ) -> None:
        await self._enter()
        self._check_unbound(key)
        session = self._row(turn.session_id)
        if turn.id in self._turns:
            raise DuplicateTurn(f"turn {turn.id!r} already exists")
        if turn.status is TurnStatus.RUNNING:
            self._check_can_run(session, max_running, tenant_cap)
            self._running[session.id] = turn.id
        self._turns[turn.id] = turn
        self._turns_of.setdefault(turn.session_id, set()).add(turn.id)
        if turn.status.finished:
            self._undropped.add(turn.id)
        self._sessions[session.id] = replace(session, last_active_at=turn.created_at)
        self._keep(key)

    async def _renew_leases(self, owner: str, until: datetime) -> int:
        await self._enter()
        renewed = [
            replace(turn, lease_expires_at=until)
            for turn in self._turns.values()
            if turn.owner == owner and not turn.status.finished
        ]
        for turn in renewed:
            self._turns[turn.id] = turn
        return len(renewed)

    async def get_turn(self, session_id: str, turn_id: str) -> TurnRecord:
        await self._enter()
        return self._turn(session_id, turn_id)

    async def _list_turns(
        self, session_id: str, status: TurnStatus | None, limit: int | None
    ) -> builtins.list[TurnRecord]:
        await self._enter()
        self._row(session_id)
        turns = (self._turns[t] for t in self._turns_of.get(session_id, ()))
        found = sorted((t for t in turns if status is None or t.status == status), key=turn_order)
        return found[:limit]

    async def running_turns(self) -> builtins.list[TurnRecord]:
        await self._enter()
        running = (t for t in self._turns.values() if t.status is TurnStatus.RUNNING)
        return sorted(running, key=turn_order)

    async def queued_turns(self) -> builtins.list[TurnRecord]:
        await self._enter()
        queued = (t for t in self._turns.values() if t.status is TurnStatus.QUEUED)
        return sorted(queued, key=turn_order)

    async def _begin_turn(
        self,
        session_id: str,
        turn_id: str,
        owner: str | None,
        lease_expires_at: datetime | None,
        max_running: int | None,
        tenant_cap: int | None,
    ) -> TurnRecord | None:
        await self._enter()
        session = self._row(session_id)
        turn = self._turn(session_id, turn_id)
        if turn.status is not TurnStatus.QUEUED:
            return None
        older = any(
            t.status is TurnStatus.QUEUED and turn_order(t) < turn_order(turn)
            for t in (self._turns[i] for i in self._turns_of.get(session_id, ()))
        )
        if older:
            raise SessionBusy(f"session {session_id}: an earlier turn is queued")
        self._check_can_run(session, max_running, tenant_cap)
        turn = replace(
            turn, status=TurnStatus.RUNNING, owner=owner, lease_expires_at=lease_expires_at
        )
        self._running[session_id] = turn_id
        self._turns[turn_id] = turn
        return turn

    async def _claim_queued(
        self, owner: str, until: datetime, now: datetime
    ) -> builtins.list[TurnRecord]:
        await self._enter()
        claimed = [
            replace(t, owner=owner, lease_expires_at=until)
            for t in self._turns.values()
            if t.status is TurnStatus.QUEUED
            and (t.lease_expires_at is None or t.lease_expires_at < now)
        ]
        for turn in claimed:
            self._turns[turn.id] = turn
        return sorted(claimed, key=turn_order)

    async def _end_queued(self, session_id: str, turn_id: str, end: TurnEnd) -> bool:
        await self._enter()
        self._row(session_id)
        turn = self._turn(session_id, turn_id)
        if turn.status is not TurnStatus.QUEUED:
            return False
        self._turns[turn_id] = replace(
            turn, status=end.status, reason=end.reason, ended_at=end.ended_at
        )
        self._undropped.add(turn_id)
        return True

    def _check_can_run(
        self, session: Session, max_running: int | None, tenant_cap: int | None
    ) -> None:
        """``check_running`` against what runs now (single flight, a turn waiting for an
        approval, the caps)."""
        busy = session.id in self._running or any(
            self._turns[t].status is TurnStatus.WAITING for t in self._turns_of.get(session.id, ())
        )
        tenant = None
        if tenant_cap is not None and session.tenant is not None:
            mine = sum(1 for sid in self._running if self._sessions[sid].tenant == session.tenant)
            tenant = TenantCount(session.tenant, mine, tenant_cap)
        check_running(session.id, busy, len(self._running), max_running, tenant)

    async def _append_events(self, session_id: str, append: Append) -> None:
        turn_id, batch, started, end = append
        await self._enter()
        session = self._row(session_id)
        turn = self._turn(session_id, turn_id)
        check_append(session_id, turn_id, (session_id, turn.status), session.last_seq, batch)
        turn_change: dict[str, Any] = {}  # one replace a record (3 µs each)
        session_change: dict[str, Any] = {}
        if batch:
            self._logs.setdefault(session_id, []).extend(batch)
            session_change["last_seq"] = turn_change["last_seq"] = batch[-1].seq
            if turn.first_seq is None:
                turn_change["first_seq"] = batch[0].seq
        if turn.started_at is None and started is not None:
            turn_change["started_at"] = started
        if end is not None:
            turn_change.update(status=end.status, reason=end.reason, ended_at=end.ended_at)
            session_change["last_active_at"] = end.ended_at
            self._undropped.add(turn_id)
            self._running.pop(session_id, None)
        if turn_change:
            self._turns[turn_id] = replace(turn, **turn_change)
        if session_change:
            self._sessions[session_id] = replace(session, **session_change)

    async def _read_events(self, session_id: str, query: EventQuery) -> builtins.list[LoggedEvent]:
        after, before, turn_id, limit, max_bytes = query
        await self._enter()
        self._row(session_id)
        log = self._logs.get(session_id, [])
        if turn_id is not None:
            turn = self._turns.get(turn_id)
            if turn is None or turn.session_id != session_id or turn.last_seq is None:
                return []
            assert turn.first_seq is not None
            after = max(after, turn.first_seq - 1)  # the turn's events lie in its range
            before = turn.last_seq + 1 if before is None else min(before, turn.last_seq + 1)
        start = bisect.bisect_right(log, after, key=_seq)
        stop = len(log) if before is None else bisect.bisect_left(log, before, lo=start, key=_seq)
        if turn_id is None:
            found = log[start : stop if limit is None else min(stop, start + limit)]
        else:
            window = (log[i] for i in range(start, stop) if log[i].turn_id == turn_id)
            found = builtins.list(itertools.islice(window, limit))
        return found if max_bytes is None else _up_to(found, max_bytes)

    async def log_bounds(self, session_id: str) -> LogBounds:
        await self._enter()
        last = self._row(session_id).last_seq
        log = self._logs.get(session_id)
        return LogBounds(earliest=log[0].seq if log else last + 1, last=last)

    async def _drop_events(self, cutoff: datetime) -> int:
        await self._enter()
        due: dict[str, set[str]] = {}  # session id -> turn ids whose events go
        for turn_id in builtins.list(self._undropped):
            turn = self._turns[turn_id]
            if turn.ended_at is not None and turn.ended_at < cutoff:
                due.setdefault(turn.session_id, set()).add(turn_id)
                self._undropped.discard(turn_id)
        dropped = 0
        for session_id, turn_ids in due.items():
            log = self._logs.get(session_id)
            if not log:
                continue
            kept = [e for e in log if e.turn_id not in turn_ids]
            dropped += len(log) - len(kept)
            self._logs[session_id] = kept
        return dropped

    # -- idempotency keys -----------------------------------------------------

    def _check_unbound(self, record: IdempotencyRecord | None) -> None:
        """``IdempotencyKeyBound`` if ``record``'s key is bound at its claim's time."""
        if record is None:
            return
        claim = record.claim
        found = self._keys.get((claim.tenant, claim.key))
        if found is not None and found.claim.expires_at > claim.created_at:
            raise IdempotencyKeyBound(found)

    def _keep(self, record: IdempotencyRecord | None) -> None:
        if record is not None:
            self._keys[record.claim.tenant, record.claim.key] = record

    async def _find_key(
        self, tenant: str | None, key: str, now: datetime
    ) -> IdempotencyRecord | None:
        await self._enter()
        found = self._keys.get((tenant, key))
        return found if found is not None and found.claim.expires_at > now else None

    async def _bind_key(self, record: IdempotencyRecord) -> None:
        await self._enter()
        self._check_unbound(record)
        self._keep(record)

    async def _purge_keys(self, cutoff: datetime) -> int:
        await self._enter()
        doomed = [name for name, r in self._keys.items() if r.claim.expires_at <= cutoff]
        for name in doomed:
            del self._keys[name]
        return len(doomed)

    async def close(self) -> None:
        """Drop every session.  Idempotent; never raises, even when cancelled."""
        self._closed = True
        self._sessions.clear()
        self._turns.clear()
        self._turns_of.clear()
        self._logs.clear()
        self._undropped.clear()
        self._running.clear()
        self._keys.clear()
