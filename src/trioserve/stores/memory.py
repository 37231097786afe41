"""``MemoryStore``: the session store for ``--in-memory``; nothing survives the process.

Guarantees, beyond the ``Store`` contract:

- Every method is atomic: it never awaits between reading and writing the
  table, so concurrent Trio tasks see each call happen all at once.
- Every method is a checkpoint, taken *before* it acts: a cancelled call
  raises ``trio.Cancelled`` and has changed nothing.
- Callers cannot reach the store's state: ``spec`` and ``inputs`` are copied
  on the way in and on the way out.
- It accepts exactly what ``SQLiteStore`` accepts: ``spec`` and ``inputs``
  must be JSON-serialisable (they are stored as their JSON round trip, so a
  tuple comes back as a list), and datetimes must be timezone-aware (they
  come back in UTC).
"""

from __future__ import annotations

import builtins
import copy
import json
from collections.abc import Collection
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import trio

from trioserve.errors import DuplicateSession, SessionExpired, SessionNotFound, StoreError
from trioserve.stores.base import UNSET, Session, SessionStatus, Store, _Unset

__all__ = ["MemoryStore"]


def _utc(value: datetime, what: str) -> datetime:
    """``value`` in UTC; a naive datetime is a programming error."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be a timezone-aware datetime, got {value!r}")
    return value.astimezone(UTC)


def _json_copy(value: Any, what: str) -> Any:
    """A private copy of ``value`` as its strict JSON round trip."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} is not JSON-serialisable: {exc}") from exc


def _copy_out(session: Session) -> Session:
    return replace(session, spec=copy.deepcopy(session.spec), inputs=dict(session.inputs))


class MemoryStore(Store):
    """A dict of sessions kept in this process."""

    description = "memory"

    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._closed = False

    async def _enter(self) -> None:
        await trio.lowlevel.checkpoint()
        if self._closed:
            raise StoreError("store is closed")

    def _row(self, session_id: str) -> Session:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise SessionNotFound(f"no session {session_id!r}") from None

    async def create(self, session: Session) -> None:
        await self._enter()
        if session.id in self._sessions:
            raise DuplicateSession(f"session {session.id!r} already exists")
        self._sessions[session.id] = replace(
            session,
            status=SessionStatus(session.status),
            created_at=_utc(session.created_at, "created_at"),
            last_active_at=_utc(session.last_active_at, "last_active_at"),
            spec=_json_copy(session.spec, f"session {session.id!r}: spec"),
            inputs=_json_copy(session.inputs, f"session {session.id!r}: inputs"),
        )

    async def get(self, session_id: str) -> Session:
        await self._enter()
        return _copy_out(self._row(session_id))

    async def update(
        self,
        session_id: str,
        *,
        status: SessionStatus | None = None,
        last_active_at: datetime | None = None,
        adapter_state: str | _Unset | None = UNSET,
    ) -> Session:
        await self._enter()
        current = self._row(session_id)
        new_status = current.status if status is None else SessionStatus(status)
        if current.status is SessionStatus.EXPIRED and new_status is not SessionStatus.EXPIRED:
            raise SessionExpired(f"session {session_id!r} is expired; it cannot become {status}")
        updated = replace(
            current,
            status=new_status,
            last_active_at=(
                current.last_active_at
                if last_active_at is None
                else _utc(last_active_at, "last_active_at")
            ),
            adapter_state=current.adapter_state if adapter_state is UNSET else adapter_state,
        )
        self._sessions[session_id] = updated
        return _copy_out(updated)

    async def delete(self, session_id: str) -> None:
        await self._enter()
        self._sessions.pop(session_id, None)

    async def list(
        self,
        *,
        agent_name: str | None = None,
        status: SessionStatus | None = None,
        limit: int | None = None,
    ) -> list[Session]:
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        await self._enter()
        found = [
            s
            for s in self._sessions.values()
            if (agent_name is None or s.agent_name == agent_name)
            and (status is None or s.status == status)
        ]
        found.sort(key=lambda s: (s.last_active_at, s.created_at, s.id), reverse=True)
        return [_copy_out(s) for s in found[:limit]]

    async def mark_expired(
        self, cutoff: datetime, *, exclude: Collection[str] = ()
    ) -> builtins.list[str]:
        if isinstance(exclude, str):
            raise TypeError("exclude must be a collection of ids, not one str")
        cutoff = _utc(cutoff, "cutoff")
        await self._enter()
        keep = frozenset(exclude)
        moved = sorted(
            s.id
            for s in self._sessions.values()
            if s.status is SessionStatus.ACTIVE and s.last_active_at < cutoff and s.id not in keep
        )
        for session_id in moved:
            self._sessions[session_id] = replace(
                self._sessions[session_id], status=SessionStatus.EXPIRED
            )
        return moved

    async def count(self, *, status: SessionStatus) -> int:
        await self._enter()
        return sum(1 for s in self._sessions.values() if s.status == status)

    async def close(self) -> None:
        """Drop every session.  Idempotent; never raises, even when cancelled."""
        self._closed = True
        self._sessions.clear()
