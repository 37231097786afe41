"""The session store contract (CONTRACT §4) shared by every backend.

A store is the durable truth about sessions.  All methods are async and
safe to call from many Trio tasks at once; blocking backends run their
calls in a worker thread through ``trio.to_thread.run_sync`` with a
limiter.  Times are timezone-aware UTC ``datetime`` objects.
"""

from __future__ import annotations

import abc
import builtins
import enum
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final


class SessionStatus(enum.StrEnum):
    ACTIVE = "active"
    ENDED = "ended"
    PAUSED = "paused"
    EXPIRED = "expired"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES: Final = frozenset(
    {SessionStatus.ENDED, SessionStatus.EXPIRED, SessionStatus.FAILED}
)


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class Session:
    """One stored session.

    ``spec`` is the CompiledSpec (as JSON-able dict) the session was created
    with, its task already interpolated with ``inputs``; it is kept whole so
    a session survives a change of the spec file.  ``adapter_state`` is an
    opaque string an adapter may use to resume its own state.
    """

    id: str
    agent_name: str
    runtime_type: str
    status: SessionStatus
    created_at: datetime
    last_active_at: datetime
    spec: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)
    adapter_state: str | None = None


class _Unset(enum.Enum):
    UNSET = enum.auto()


UNSET: Final = _Unset.UNSET


class Store(abc.ABC):
    """The contract every session store keeps.

    - ``create`` raises ``DuplicateSession`` for an id that exists.
    - ``get`` and ``update`` raise ``SessionNotFound`` for an unknown id.
    - ``update`` changes only the mutable fields (status, last activity,
      adapter state); ``None`` (or ``UNSET`` for ``adapter_state``) keeps a
      field, ``adapter_state=None`` clears it.  Identity fields are kept.  It
      returns the updated session.  It raises ``SessionExpired`` when asked
      to move an ``expired`` session to any other status, and then changes
      nothing (the other fields of an expired row may still change).
    - ``delete`` is idempotent; deleting an unknown id is fine.
    - ``list`` filters by agent name and status, newest ``last_active_at``
      first (ties: newest ``created_at``, then id descending), up to ``limit``
      (``None``: all; a negative limit is a ``ValueError``).
    - ``mark_expired`` moves every ``active`` session whose ``last_active_at``
      is strictly before ``cutoff`` (and whose id is not in ``exclude``) to
      ``expired`` in one step, leaving ``last_active_at`` as it was, and
      returns the ids it moved, sorted.  Idempotent.
    - ``count`` counts sessions with a status.
    - ``close`` is idempotent and finishes even when cancelled; other calls
      after it raise ``StoreError("store is closed")``.

    Values: ``Session`` objects handed out are the caller's own (changing
    their ``spec`` or ``inputs`` dicts never changes the store).  Datetimes
    must be timezone-aware (a naive one is a ``ValueError``) and come back in
    UTC, exact to the microsecond.  ``spec`` and ``inputs`` must be
    JSON-serialisable (else ``ValueError``) and come back as their JSON round
    trip.  Each call is atomic with respect to the others.
    """

    #: A short description for the startup line, e.g. ``sqlite:/path/db``.
    description: str = "store"

    @abc.abstractmethod
    async def create(self, session: Session) -> None: ...

    @abc.abstractmethod
    async def get(self, session_id: str) -> Session: ...

    @abc.abstractmethod
    async def update(
        self,
        session_id: str,
        *,
        status: SessionStatus | None = None,
        last_active_at: datetime | None = None,
        adapter_state: str | _Unset | None = UNSET,
    ) -> Session: ...

    @abc.abstractmethod
    async def delete(self, session_id: str) -> None: ...

    @abc.abstractmethod
    async def list(
        self,
        *,
        agent_name: str | None = None,
        status: SessionStatus | None = None,
        limit: int | None = None,
    ) -> list[Session]: ...

    @abc.abstractmethod
    async def mark_expired(
        self, cutoff: datetime, *, exclude: Collection[str] = ()
    ) -> builtins.list[str]: ...  # `list` here is the method above

    @abc.abstractmethod
    async def count(self, *, status: SessionStatus) -> int: ...

    @abc.abstractmethod
    async def close(self) -> None: ...
