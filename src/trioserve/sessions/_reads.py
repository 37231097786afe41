"""The manager's read side: sessions, turns and event logs as a tenant may see them.

``SessionReads`` is the base of ``SessionManager`` (``_manager.py``): what
reads the store and the running turns but changes neither.

Tenants: every call that names a session takes the caller's ``tenant`` (the
owner of its API key; ``None`` when the server runs without keys, which
sees every session).  A session belongs to the tenant that created it; for
any other tenant it does not exist (``NotFound``, the same message as for an
unknown id), and lists leave it out.

Readers of a log wait on ``activity``, which the manager
sets (``_notify``) when a turn of the session starts or ends, the session
ends, or the server drains.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from functools import partial
from typing import NamedTuple

import trio

from trioserve.errors import Draining, InvalidRequest, NotFound, SessionNotFound
from trioserve.protocol import SessionStatus, TurnStatus
from trioserve.sessions._eventlog import check_cursor, follow_turn, read_log, read_stored
from trioserve.sessions._limits import Limits
from trioserve.sessions._queue import QueuedTurn, TurnQueues, queued_events
from trioserve.sessions._remote import follow_remote, read_log_shared
from trioserve.sessions._turns import Turn
from trioserve.stores.base import LoggedEvent, Session, SessionKey, Store, TurnRecord


class SessionPage(NamedTuple):
    """A page of sessions; ``next`` is where the next page starts (``None``: this is the last)."""

    sessions: list[Session]
    next: SessionKey | None


class SessionReads:
    """Reads for ``SessionManager``, which sets these attributes."""

    store: Store
    limits: Limits
    draining: bool
    _turns: dict[str, Turn]  # the running turns, by session id
    _activity: dict[str, trio.Event]  # by session id, for readers waiting on it
    _queues: TurnQueues  # the turns waiting for their session (``_queue``)

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

    async def get_session(self, session_id: str, tenant: str | None = None) -> Session:
        """The session, if ``tenant`` may see it (else ``SessionNotFound``)."""
        session = await self.store.get(session_id)
        if tenant is not None and session.tenant != tenant:
            raise SessionNotFound(f"session {session_id} not found")
        return session

    async def _startable(self, session_id: str, tenant: str | None) -> Session:
        """The session, if a turn may start on it (else ``NotFound``, ``Draining``)."""
        try:
            session = await self.get_session(session_id, tenant)
        except SessionNotFound:
            raise NotFound(f"session {session_id} not found") from None
        if session.status.terminal:
            raise NotFound(f"session {session_id} is {session.status.value}")
        if self.draining:
            raise Draining("server is draining; not accepting new turns")
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

    async def get_turn(
        self, session_id: str, turn_id: str, tenant: str | None = None
    ) -> TurnRecord:
        await self._check_owner(session_id, tenant)
        return await self.store.get_turn(session_id, turn_id)

    async def list_turns(self, session_id: str, tenant: str | None = None) -> list[TurnRecord]:
        await self.get_session(session_id, tenant)  # unknown or not theirs: SessionNotFound
        return await self.store.list_turns(session_id)

    def turn_events(
        self, turn: Turn | QueuedTurn, *, idle: float = math.inf
    ) -> AsyncIterator[list[LoggedEvent]]:
        """Every event of ``turn``, live, in batches (``[]``: idle for ``idle`` seconds); a
        queued turn's stream starts with ``trioserve.queued`` (``_queue.queued_events``)."""
        if isinstance(turn, QueuedTurn):
            return queued_events(turn, partial(self.turn_events, idle=idle), idle=idle)
        return _through_waits(self.store, turn, idle)

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
        once; the client should follow the next server instead).  A turn that
        waits in this process's queue (``turn_id``) is read as its client reads
        it: ``trioserve.queued``, then its events once it starts.
        """
        if follow and self.draining:
            raise Draining("server is draining; not following sessions")
        await self._check_owner(session_id, tenant)
        await check_cursor(self.store, session_id, after, turn_id)
        queued = None if turn_id is None else self._queues.find(session_id, turn_id)
        if queued is not None:  # it waits here: its stream, from trioserve.queued
            return self.turn_events(queued, idle=idle)
        read = read_log_shared if self.limits.shared_store else read_log
        batches = read(self, session_id, after, turn_id=turn_id, follow=follow, idle=idle)
        if turn_id is None:
            return batches
        return _on_through_waits(self.store, session_id, turn_id, batches, after, idle)

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


async def _through_waits(store: Store, turn: Turn, idle: float) -> AsyncIterator[list[LoggedEvent]]:
    """A turn's events live; when it parks for an approval, on from the store (with
    heartbeats) through its continuations, wherever they run, until it has finished."""
    pos = turn.feed.first_seq - 1
    async for batch in follow_turn(store, turn, pos, idle=idle):
        if batch:
            pos = batch[-1].seq
        yield batch
    if turn.end is not None and turn.end.status is TurnStatus.WAITING:
        async for batch in follow_remote(store, turn.record, pos, idle=idle):
            yield batch


async def _on_through_waits(
    store: Store,
    session_id: str,
    turn_id: str,
    batches: AsyncIterator[list[LoggedEvent]],
    after: int,
    idle: float,
) -> AsyncIterator[list[LoggedEvent]]:
    """One turn's log (``batches``), then, while the turn waits for an approval, on from
    the store through its continuations until it has finished."""
    pos = after
    async for batch in batches:
        if batch:
            pos = batch[-1].seq
        yield batch
    record = await store.get_turn(session_id, turn_id)
    if record.status is TurnStatus.WAITING:
        async for batch in follow_remote(store, record, pos, idle=idle):
            yield batch
