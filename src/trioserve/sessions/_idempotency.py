"""Idempotency keys: a repeated create or turn answers what the first one did, once.

A client that sent ``POST /v1/sessions`` or a turn and never saw the answer
(the connection broke) cannot tell whether it ran.  With an idempotency key
(HTTP ``Idempotency-Key``, the WebSocket turn's ``idempotencyKey``) it can
send it again: ``KeyedRequests`` runs the request the first time and,
for every repeat by the same tenant within the window, answers what the
first did without running anything: the same session, the same turn (the
transport re-attaches to its stream from its first event), or the same
refusal (``errors.REMEMBERED_REFUSALS``: single flight, the caps).  A
repeat whose request differs (another body, session or route) is
``IdempotencyKeyReused``.  Other refusals (a bad body, an unknown session,
a draining server) bind nothing: nothing ran, and a repeat is judged anew.

Where it holds: the key is kept in the store (``stores.idempotency``) in
the same atomic step as the session or turn it made, so across restarts,
``--workers`` and replicas, and twins (the same request twice at once, on
two replicas) make one: whichever binds the key first wins, and the other
answers what it bound.  In this process twins are served one after the
other (``KeyLocks``): else a twin refused because of the other (the
session cap its session took, counted here with the memory and SQLite
stores) could bind that refusal before the other's create is stored, and
both would be refused.  With a shared store the store checks the key
before its caps and single flight.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from trioserve.errors import (
    REMEMBERED_REFUSALS,
    IdempotencyKeyReused,
    TrioserveError,
)
from trioserve.protocol import Multitask, OnDisconnect
from trioserve.stores.base import Session, Store, utcnow
from trioserve.stores.records import IdempotencyClaim, IdempotencyKeyBound, IdempotencyRecord

if TYPE_CHECKING:
    from trioserve.sessions._queue import QueuedTurn
    from trioserve.sessions._turns import Turn

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TurnReplay:
    """A repeated turn request: the turn its key started (it may have ended since, or run
    in another process); read its events from the store."""

    session_id: str
    turn_id: str


def fingerprint(request: Mapping[str, Any]) -> str:
    """A digest of what a request asks (its route's name, its arguments): equal for equal
    requests, whatever their transport or the order of their fields."""
    text = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


class KeyLocks:
    """One ``trio.Lock`` per key in use, dropped once nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[tuple[str | None, str], tuple[trio.Lock, int]] = {}

    @asynccontextmanager
    async def hold(self, name: tuple[str | None, str]) -> AsyncIterator[None]:
        lock, users = self._locks.get(name, (trio.Lock(), 0))
        self._locks[name] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks.pop(name)
            if users > 1:
                self._locks[name] = (lock, users - 1)


#: ``SessionManager._create_session(inputs, tenant, claim)``.
CreateSession = Callable[
    [Mapping[str, str] | None, str | None, IdempotencyClaim | None], Awaitable[Session]
]
#: ``SessionManager._start_turn(session_id, text, on_disconnect, env, tenant, claim,
#: multitask, webhook)``.
StartTurn = Callable[
    [
        str,
        str,
        OnDisconnect | None,
        Mapping[str, str] | None,
        str | None,
        IdempotencyClaim | None,
        Multitask | None,
        str | None,
    ],
    Awaitable["Turn | QueuedTurn"],
]
#: ``SessionManager.get_session(session_id, tenant)``.
GetSession = Callable[[str, str | None], Awaitable[Session]]


class KeyedRequests:
    """Creates and turns under an idempotency key (``SessionManager.keyed``); see the
    module doc.  ``window``: the seconds a key lasts (0: keys are ignored)."""

    def __init__(
        self,
        store: Store,
        window: float,
        *,
        create: CreateSession,
        start: StartTurn,
        get_session: GetSession,
    ) -> None:
        self.store = store
        self.window = window
        self._create = create
        self._start = start
        self._get_session = get_session
        self._locks = KeyLocks()

    async def create_session(
        self, key: str, inputs: Mapping[str, str] | None = None, *, tenant: str | None = None
    ) -> tuple[Session, bool]:
        """``SessionManager.create_session`` under ``key``: the session, and whether it is a
        repeat's (the session the key's first request created, as it is now)."""

        async def first(claim: IdempotencyClaim | None) -> tuple[Session, bool]:
            return await self._create(inputs, tenant, claim), False

        async def again(record: IdempotencyRecord) -> tuple[Session, bool]:
            assert record.session_id is not None
            return await self._get_session(record.session_id, tenant), True

        request = {"create": "session", "inputs": dict(inputs or {})}
        return await self._once(tenant, key, request, first, again)

    async def bound_session(self, key: str, *, tenant: str | None = None) -> Session:
        """The session ``key`` names: created (with no inputs) the first time, the same
        session for every later call of ``tenant`` within the window.

        For a face whose protocol names its own threads (AG-UI's ``threadId``).
        Unlike ``create_session`` a refusal is not remembered: a thread refused
        once (a cap) is created by a later call that is admitted.
        """
        if self.window <= 0:
            return await self._create(None, tenant, None)
        now = utcnow()
        request = {"create": "session", "inputs": {}}
        claim = IdempotencyClaim(
            tenant, key, fingerprint(request), now, now + timedelta(seconds=self.window)
        )

        async def again(record: IdempotencyRecord) -> Session:
            assert record.session_id is not None
            return await self._get_session(record.session_id, tenant)

        async with self._locks.hold((tenant, key)):
            found = await self.store.find_key(tenant, key)
            if found is None:
                try:
                    return await self._create(None, tenant, claim)
                except IdempotencyKeyBound as exc:  # bound meanwhile, by a twin elsewhere
                    found = exc.record
            return await _answer(found, claim, again)

    async def start_turn(
        self,
        key: str,
        session_id: str,
        text: str,
        *,
        detach: bool = False,
        on_disconnect: OnDisconnect | None = None,
        env: Mapping[str, str] | None = None,
        tenant: str | None = None,
        multitask: Multitask | None = None,
        webhook: str | None = None,
    ) -> Turn | QueuedTurn | TurnReplay:
        """``SessionManager.start_turn`` under ``key``: the turn started, or for a repeat the
        turn the key's first request started.  ``detach`` (answered without a stream, by
        the transport) is part of the request."""

        async def first(claim: IdempotencyClaim | None) -> Turn | QueuedTurn | TurnReplay:
            args = (on_disconnect, env, tenant, claim, multitask, webhook)
            return await self._start(session_id, text, *args)

        async def again(record: IdempotencyRecord) -> Turn | QueuedTurn | TurnReplay:
            assert record.session_id is not None and record.turn_id is not None
            return TurnReplay(record.session_id, record.turn_id)

        request = {"turn": session_id, "input": text, "onDisconnect": on_disconnect}
        if multitask is not None:
            request["multitask"] = multitask
        if webhook is not None:
            request["webhook"] = webhook
        return await self._once(tenant, key, request | {"detach": detach}, first, again)

    async def _once(
        self,
        tenant: str | None,
        key: str,
        request: Mapping[str, Any],
        first: Callable[[IdempotencyClaim | None], Awaitable[T]],
        again: Callable[[IdempotencyRecord], Awaitable[T]],
    ) -> T:
        """``first(claim)`` the first time (it binds the key, as ``Store.create`` does), else
        ``again(record)``: the answer of the request that bound the key.

        Raises ``IdempotencyKeyReused`` for a repeat of another request, and
        a remembered refusal again (``replayed`` set).  Without a window,
        ``first(None)``: the key is ignored.
        """
        if self.window <= 0:
            return await first(None)
        now = utcnow()
        claim = IdempotencyClaim(
            tenant, key, fingerprint(request), now, now + timedelta(seconds=self.window)
        )
        async with self._locks.hold((tenant, key)):
            found = await self.store.find_key(tenant, key)
            if found is None:
                try:
                    return await first(claim)
                except IdempotencyKeyBound as exc:  # bound meanwhile, by a twin elsewhere
                    found = exc.record
                except TrioserveError as exc:
                    if type(exc) is not REMEMBERED_REFUSALS.get(exc.reason):
                        raise
                    try:
                        await self.store.remember_refusal(claim, exc.reason, exc.message)
                    except IdempotencyKeyBound as bound:  # a twin bound it first: its answer
                        found = bound.record
                    else:
                        raise
            return await _answer(found, claim, again)


async def _answer(
    found: IdempotencyRecord,
    claim: IdempotencyClaim,
    again: Callable[[IdempotencyRecord], Awaitable[T]],
) -> T:
    """What a repeat gets: ``again(found)``, or the refusal the key remembers."""
    if found.claim.fingerprint != claim.fingerprint:
        raise IdempotencyKeyReused(
            f"Idempotency-Key {claim.key!r} was sent with a different request within the"
            " idempotency window (another body, session or route); send a new key"
        )
    if found.refusal is not None:
        refusal = REMEMBERED_REFUSALS.get(found.refusal, TrioserveError)
        error = refusal(found.message or found.refusal)
        error.replayed = True
        raise error
    return await again(found)
