"""The sweep: TTL expiry of idle sessions, retention of logged events and ended sessions,
and expired idempotency keys.

A ``Sweeper`` runs one pass on demand (``sweep``) or every so often
(``run``, a quarter of the shortest period that is on, clamped to 1 s .. 1 h).
Each part runs only when its limit is on (``session_ttl``,
``event_retention``, ``session_retention``, ``idempotency_window``).  Expiry holds the manager's
admission lock, so a session cannot be expired between a turn's admission
and its start; a session whose turn runs is never expired.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from datetime import timedelta
from typing import NamedTuple

import trio

from trioserve.errors import StoreError
from trioserve.locks import Mutex
from trioserve.observe import Metrics
from trioserve.sessions._limits import Limits
from trioserve.stores.base import Store, utcnow
from trioserve.units import format_duration

log = logging.getLogger("trioserve.manager")


def sweep_interval(ttl: float) -> float:
    """TTL/4, clamped to 1 s .. 1 h."""
    return min(max(ttl / 4, 1.0), 3600.0)


class Swept(NamedTuple):
    """What one pass of the sweep did."""

    expired: list[str]  # the ids of the sessions it expired, sorted
    events_dropped: int
    sessions_purged: int
    keys_purged: int = 0  # expired idempotency keys deleted


class Sweeper:
    """One pass or a loop of them over ``store``; see the module doc.

    ``running()`` names the sessions in a turn (never expired), and
    ``expired(session_id)`` is called for each session a pass expired.
    """

    def __init__(
        self,
        store: Store,
        limits: Limits,
        metrics: Metrics,
        *,
        lock: Mutex,
        running: Callable[[], Collection[str]],
        expired: Callable[[str], None],
    ) -> None:
        self.store = store
        self.limits = limits
        self.metrics = metrics
        self._lock = lock
        self._running = running
        self._expired = expired

    def periods(self) -> list[float]:
        """The TTL and retentions that are on (each sets how often the sweep runs)."""
        limits = self.limits
        periods = (
            limits.session_ttl,
            limits.event_retention,
            limits.session_retention,
            limits.idempotency_window,
        )
        return [seconds for seconds in periods if seconds > 0]

    async def run(self) -> None:
        """Sweep forever (a failed pass is logged, the next one comes as usual)."""
        interval = min(sweep_interval(seconds) for seconds in self.periods())
        while True:
            await trio.sleep(interval)
            try:
                await self.sweep()
            except (StoreError, OSError) as exc:
                log.warning("sweep failed: %s", exc)

    async def sweep(self) -> Swept:
        """One pass: expire idle sessions, drop old logged events, purge old ended sessions."""
        limits = self.limits
        expired = await self.expire_idle() if limits.session_ttl > 0 else []
        dropped = await self.drop_old_events() if limits.event_retention > 0 else 0
        purged = await self.purge_ended() if limits.session_retention > 0 else 0
        keys = await self.purge_keys() if limits.idempotency_window > 0 else 0
        return Swept(expired, dropped, purged, keys)

    async def expire_idle(self) -> list[str]:
        """Expire active sessions idle longer than the TTL, except those in a turn."""
        cutoff = utcnow() - timedelta(seconds=self.limits.session_ttl)
        async with self._lock:
            busy = set(self._running())
            if self.limits.shared_store:  # and those whose turn runs in another process
                busy.update(turn.session_id for turn in await self.store.running_turns())
            expired = await self.store.mark_expired(cutoff, exclude=busy)
        for session_id in expired:
            self._expired(session_id)
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

    async def purge_keys(self) -> int:
        """Delete the idempotency keys whose window has passed."""
        purged = await self.store.purge_keys(utcnow())
        if purged:
            log.info("purged %d expired idempotency key(s)", purged)
        return purged


class Sweeps:
    """The manager's calls of its sweep (a base of ``SessionManager``, which sets
    ``_sweeper``)."""

    _sweeper: Sweeper

    async def sweep(self) -> Swept:
        """One pass: expire idle sessions, drop old logged events, purge old ended sessions."""
        return await self._sweeper.sweep()

    async def expire_idle(self) -> list[str]:
        """Expire active sessions idle longer than the TTL, except those in a turn."""
        return await self._sweeper.expire_idle()

    async def drop_old_events(self) -> int:
        """Drop the logged events of turns that ended longer ago than the retention."""
        return await self._sweeper.drop_old_events()

    async def purge_ended(self) -> int:
        """Delete the sessions that ended longer ago than the retention, turns and logs too."""
        return await self._sweeper.purge_ended()
