"""Turns whose end the store refused: written again, with backoff, until the store takes it.

A turn's last write (its remaining events with how it ended, ``TurnLog.close``)
can fail: the database is down or refuses the server's role, the disk is
full, the file went read-only.  The turn is over in this process all the
same (its adapter is reaped, its readers got its last events, its slot is
free), but the store still holds it ``running``, and the store's single
flight would keep its session busy (``409``) until a restart or the end of
its lease.  So the runner hands such a turn to ``EndRetries``, which keeps
its unwritten events and, from one task per turn in the manager's nursery,
writes them again with backoff (``FIRST_DELAY`` doubling up to
``MAX_DELAY``) for as long as the server runs.  The first write the store
takes ends the turn ``failed`` with reason ``store_error``.  A new turn on
the session does not wait for the next round: ``settle`` tries the write at
once, so the session takes its next turn as soon as the store is back.  A
waiting (queued) turn starts once the end is written (``on_written``).

Every attempt is one store call under its own deadline; a stopping server
cancels the retries (the next start closes the turn, ``server_restart``).
Each failed attempt is logged and counted
(``trioserve_turn_end_write_failures_total``); the turns waiting are the
``trioserve_turns_unwritten`` gauge.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Final

import trio

from trioserve.errors import LogConflict, StoreError, StoreUnavailable
from trioserve.protocol import TurnStatus
from trioserve.stores.base import LoggedEvent, Store, TurnEnd, utcnow

if TYPE_CHECKING:
    from trioserve.observe import Metrics

log = logging.getLogger("trioserve.turns")

#: Seconds before the first retry; each next one waits twice as long, up to ``MAX_DELAY``.
FIRST_DELAY: Final = 0.1
MAX_DELAY: Final = 5.0
#: Seconds one attempt may take (a database that hangs is a failed attempt).
ATTEMPT_DEADLINE: Final = 10.0
#: The reason of a turn whose end the store refused when it ended.
STORE_ERROR: Final = "store_error"


@dataclass(eq=False)
class _Unwritten:
    """One turn's end, not yet in the store."""

    session_id: str
    turn_id: str
    events: list[LoggedEvent]
    started_at: datetime | None
    attempts: int = 0
    lock: trio.Lock = field(default_factory=trio.Lock)
    written: trio.Event = field(default_factory=trio.Event)


class EndRetries:
    """The turns whose end is being written again; see the module doc."""

    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        nursery: trio.Nursery,
        on_written: Callable[[], None] = lambda: None,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._nursery = nursery
        self._on_written = on_written  # a turn's end is written: its session may go on
        self._pending: dict[str, _Unwritten] = {}  # by session id

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._pending

    def add(
        self,
        session_id: str,
        turn_id: str,
        events: Sequence[LoggedEvent],
        started_at: datetime | None,
    ) -> None:
        """Write ``turn_id``'s end again until the store takes it (``events``: what the
        turn logged but the store never took; ``started_at`` unless already written)."""
        self._metrics.end_write_failures.inc()
        unwritten = _Unwritten(session_id, turn_id, list(events), started_at)
        self._pending[session_id] = unwritten
        self._metrics.turns_unwritten.set(len(self._pending))
        self._nursery.start_soon(self._retry, unwritten, name=f"end of turn {turn_id}")

    async def settle(self, session_id: str) -> None:
        """Before a new turn of ``session_id``: if its last turn's end is not written yet,
        try now (a ``StoreError`` if the store still refuses it)."""
        unwritten = self._pending.get(session_id)
        if unwritten is not None and not await self._attempt(unwritten):
            raise StoreUnavailable(
                f"session {session_id}: its last turn's end is not written yet (the session "
                "store refuses it); try again later"
            )

    async def _retry(self, unwritten: _Unwritten) -> None:
        delay = FIRST_DELAY
        while True:
            with trio.move_on_after(delay):
                await unwritten.written.wait()
            if unwritten.written.is_set() or await self._attempt(unwritten):
                return
            delay = min(delay * 2, MAX_DELAY)

    async def _attempt(self, unwritten: _Unwritten) -> bool:
        """One write of the turn's end; whether it is in the store now."""
        async with unwritten.lock:
            if unwritten.written.is_set():
                return True
            unwritten.attempts += 1
            end = TurnEnd(TurnStatus.FAILED, STORE_ERROR, utcnow())
            try:
                with trio.fail_after(ATTEMPT_DEADLINE):
                    await self._store.append_events(
                        unwritten.session_id,
                        unwritten.turn_id,
                        unwritten.events,
                        started_at=unwritten.started_at,
                        end=end,
                    )
            except LogConflict:
                # Ended meanwhile: another process closed it (its lease passed), or an
                # earlier attempt that seemed to fail had been written after all.
                log.warning(
                    "turn %s: its end was written elsewhere; %d event(s) not logged are dropped",
                    unwritten.turn_id,
                    len(unwritten.events),
                )
            except ValueError as exc:  # what the store can never take: the end alone
                log.error(
                    "turn %s: the store refuses its last %d event(s) (%s); writing its end "
                    "without them",
                    unwritten.turn_id,
                    len(unwritten.events),
                    exc,
                )
                unwritten.events = []
                return False
            except (StoreError, OSError, trio.TooSlowError) as exc:
                self._metrics.end_write_failures.inc()
                why = str(exc) or "no answer in time"
                log.warning(
                    "turn %s of session %s: its end is still not written (attempt %d): %s",
                    unwritten.turn_id,
                    unwritten.session_id,
                    unwritten.attempts,
                    why,
                )
                return False
            else:
                log.warning(
                    "turn %s of session %s: its end is written at attempt %d: failed, store_error",
                    unwritten.turn_id,
                    unwritten.session_id,
                    unwritten.attempts,
                )
            unwritten.written.set()
            if self._pending.get(unwritten.session_id) is unwritten:
                del self._pending[unwritten.session_id]
            self._metrics.turns_unwritten.set(len(self._pending))
            self._on_written()
            return True
