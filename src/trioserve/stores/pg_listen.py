"""``LISTEN`` for a PostgreSQL store: one connection in a thread of its own, waking Trio waiters.

``PostgresStore.append_events`` ``NOTIFY``s the store's channel with
``"<session id> <last seq>"`` when it commits.  The listener keeps one
connection (not from the pool) ``LISTEN``ing on that channel in a daemon
thread, and hands each notification to the Trio run through its token;
waiters registered for that session with a lower seq are woken.  If the
connection drops it reconnects (every ``RETRY_SECONDS``) and then wakes
every waiter, since notifications may have been lost meanwhile: a waiter
always re-reads the log, so a spurious wake-up costs one query.  ``stop``
ends the thread within ``POLL_SECONDS``.
"""

from __future__ import annotations

import threading
from typing import Final

import psycopg
import trio
from psycopg import sql

__all__ = ["Listener"]

#: How long one wait for notifications lasts before the thread looks at its stop flag.
POLL_SECONDS: Final = 0.25
#: How long the thread waits before reconnecting after a failure.
RETRY_SECONDS: Final = 1.0


class Listener:
    """Wakes ``wait``ers when another connection appends to a session's log."""

    def __init__(self, conninfo: str, channel: str) -> None:
        self._conninfo = conninfo
        self._channel = channel
        self._waiters: dict[str, dict[trio.Event, int]] = {}  # session -> event -> after seq
        self._ready = trio.Event()  # LISTEN is in effect
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def waiting(self, session_id: str) -> int:
        """How many waiters wait on ``session_id`` (for tests)."""
        return len(self._waiters.get(session_id, ()))

    async def ready(self) -> None:
        """Start the thread if needed; return once its ``LISTEN`` is in effect."""
        if self._thread is None:
            if self._stop.is_set():
                raise RuntimeError("listener stopped")
            token = trio.lowlevel.current_trio_token()
            self._thread = threading.Thread(
                target=self._run, args=(token,), name="trioserve-pg-listen", daemon=True
            )
            self._thread.start()
        await self._ready.wait()

    def register(self, session_id: str, after_seq: int) -> trio.Event:
        """An event set when ``session_id``'s log is said to go past ``after_seq``."""
        event = trio.Event()
        self._waiters.setdefault(session_id, {})[event] = after_seq
        return event

    def unregister(self, session_id: str, event: trio.Event) -> None:
        waiters = self._waiters.get(session_id)
        if waiters is not None:
            waiters.pop(event, None)
            if not waiters:
                del self._waiters[session_id]

    async def stop(self) -> None:
        """End the thread (within ``POLL_SECONDS``), and wake every waiter.  Idempotent."""
        self._stop.set()
        self._wake_all()
        thread = self._thread
        if thread is not None:
            await trio.to_thread.run_sync(thread.join, 5 * POLL_SECONDS)

    # -- on the Trio side, called from the thread ----------------------------

    def _wake(self, session_id: str, seq: int) -> None:
        for event, after in self._waiters.get(session_id, {}).items():
            if seq > after:
                event.set()

    def _wake_all(self) -> None:
        for waiters in self._waiters.values():
            for event in waiters:
                event.set()

    def _connected(self) -> None:
        if self._ready.is_set():
            self._wake_all()  # reconnected: what was missed is unknown
        self._ready.set()

    # -- in the thread ---------------------------------------------------------

    def _run(self, token: trio.lowlevel.TrioToken) -> None:
        listen = sql.SQL("LISTEN {}").format(sql.Identifier(self._channel))
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True) as conn:
                    conn.execute(listen)
                    trio.from_thread.run_sync(self._connected, trio_token=token)
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=POLL_SECONDS):
                            session_id, _, seq = note.payload.rpartition(" ")
                            if seq.isdigit():
                                trio.from_thread.run_sync(
                                    self._wake, session_id, int(seq), trio_token=token
                                )
            except psycopg.Error:
                self._stop.wait(RETRY_SECONDS)
            except trio.RunFinishedError:
                return
