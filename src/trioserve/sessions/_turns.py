"""A running turn: its record, how it is stopped, its event log and its live feed.

Every event of a turn, whether the adapter printed it or the server made it,
gets the session's next sequence number and goes through the ``TurnLog``:
it is appended to the store (in batches, by a writer task) and only then
published to the turn's ``Feed``, which any number of readers follow (the
client that started the turn, clients that re-attached, none at all for a
detached turn).  So a reader never sees an event the store does not have:
a reader that reconnects with the last seq it saw gets exactly what came
after, whichever way it reads it.

A turn's last event (``session.ended``, or the ``error`` of a crash) is held
back until the turn has released its session and turn slot (see
``SessionManager``): a client that has seen it can start the next turn at
once.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from itertools import repeat
from operator import attrgetter, itemgetter, mod
from typing import TYPE_CHECKING, Final

import trio

from trioserve.observe import log_fields
from trioserve.protocol import ERROR, SESSION_ENDED, OnDisconnect, TurnProtocol
from trioserve.runtime import (
    Action,
    AdapterOutcome,
    ProcessHandle,
    StopReason,
    TurnState,
    exit_label,
    wire,
)
from trioserve.sessions._feed import Feed
from trioserve.sessions._limits import Limits
from trioserve.spec import Resume
from trioserve.stores.base import LoggedEvent, Store, TurnEnd, TurnRecord, utcnow
from trioserve.stores.records import TurnBatch

if TYPE_CHECKING:
    from trioserve.observe import Metrics

log = logging.getLogger("trioserve.turns")

#: Events a turn's feed holds back while they are the newest (see the module doc).
_HELD: Final = frozenset({SESSION_ENDED, ERROR})
#: The log writer takes no more events while this many wait to be written.
_MAX_PENDING: Final = 8192
_MAX_PENDING_BYTES: Final = 16 * 1024 * 1024
#: How often ``released`` looks again for a turn that runs in another process.
REMOTE_POLL_SECONDS: Final = 0.1


def _no_op() -> None:
    pass


_PROTOCOL: ContextVar[TurnProtocol] = ContextVar("trioserve_turn_protocol", default="api")


@contextmanager
def turn_protocol(name: TurnProtocol) -> Iterator[None]:
    """Turns started inside the block are ``name``'s (a face wraps its ``start_turn``);
    elsewhere a turn is the v0.8 API's (``api``).  A label, not a behaviour: the
    metrics and the turn's log line name it."""
    token = _PROTOCOL.set(name)
    try:
        yield
    finally:
        _PROTOCOL.reset(token)


def current_protocol() -> TurnProtocol:
    """The face that starts turns here (``turn_protocol``)."""
    return _PROTOCOL.get()


@dataclass(eq=False)
class Turn:
    """One running turn.  Its record is the store's; the rest lives here.

    How it goes and ends is decided by its ``state`` (``runtime._lifecycle``):
    the stop methods tell it, and do to the adapter what it answers.
    """

    record: TurnRecord
    feed: Feed
    state: TurnState
    #: The adapter's process (it may not run yet): how it is stopped.
    process: ProcessHandle = field(default_factory=ProcessHandle)
    #: What its adapter needs beyond the server's environment (then not a warm one).
    env: dict[str, str] | None = None
    #: Who started it (``None`` without keys): it counts in ``--max-turns-per-tenant``.
    tenant: str | None = None
    #: Set as its adapter starts (or before a longer wait, or its end): its start waits for it.
    launched: trio.Event = field(default_factory=trio.Event)
    cancel_scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    outcome: AdapterOutcome | None = None
    #: How it ended, once it has (set before its feed finishes).
    end: TurnEnd | None = None
    #: Whether its adapter came from the warm pool.
    warm: bool = False
    #: How its adapter was started: ``fork`` (the fork server), ``warm`` (the pool), ``cold``.
    adapter: str = "cold"
    #: When it was admitted (``time.monotonic``), for its duration.
    admitted_at: float = field(default_factory=time.monotonic)
    #: The face that started it (``turn_protocol``); a queued turn's is its request's.
    protocol: TurnProtocol = field(default_factory=current_protocol)
    #: A continuation after an approval (``_approvals``): the decision its adapter is
    #: given (``trioserve.resume``), and the events logged before the adapter's.
    resume: Resume | None = None
    preface: list[wire.Event] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def session_id(self) -> str:
        return self.record.session_id

    @property
    def on_disconnect(self) -> OnDisconnect:
        return self.state.on_disconnect

    @property
    def stop_reason(self) -> StopReason | None:
        """Why the server stopped the turn, if it did (the first reason wins)."""
        return self.state.stop_reason

    def stop(self, reason: StopReason, *, force: bool = False) -> None:
        """Stop the turn, keeping its stream: SIGINT now, SIGKILL after the grace.

        The stream gets the adapter's remaining output, then (for a deadline
        or a shutdown) an ``error`` event with ``data.reason``, then one
        ``session.ended`` ``cancelled``, made by the server if the adapter
        sends none.  ``force`` skips the grace: SIGKILL at once.
        """
        self._act(self.state.stop(reason, force=force))

    def interrupt(self, by: str) -> None:
        """Stop the turn for turn ``by`` (``multitask: interrupt``): as ``stop``, its
        ``session.ended`` saying which turn interrupted it."""
        self._act(self.state.stop("interrupted", message=f"interrupted by turn {by}"))

    def deadline_passed(self) -> None:
        self._act(self.state.deadline_passed())

    def cancel(self, reason: StopReason) -> None:
        """Cancel the turn's task outright (the server is stopping): SIGKILL, no more output.

        The log still gets the notice and a ``session.ended`` ``cancelled``.
        """
        self._act(self.state.cancel(reason))

    def client_left(self) -> None:
        """The client that started the turn is gone: stop it, unless it should continue."""
        self._act(self.state.client_disconnected())

    def _act(self, action: Action) -> None:
        if action is Action.INTERRUPT:
            self.process.interrupt()
        elif action is Action.FORCE:
            self.process.force()
        elif action is Action.CANCEL:
            self.process.drop_grace()
            self.cancel_scope.cancel()


async def released(turn: Turn | None) -> None:
    """Return once ``turn`` has released its session and slot (its feed is finished); for
    ``None`` (a turn running in another process) after ``REMOTE_POLL_SECONDS``, for the
    caller to look again."""
    if turn is None:
        await trio.sleep(REMOTE_POLL_SECONDS)
        return
    await turn.feed.until_finished()


def new_turn(
    record: TurnRecord, first_seq: int, limits: Limits, on_disconnect: OnDisconnect | None
) -> Turn:
    """A turn about to run under ``limits``, its first event numbered ``first_seq``."""
    state = TurnState(
        record.session_id,
        turn_timeout=limits.turn_timeout,
        on_disconnect=on_disconnect or limits.on_disconnect,
        stderr_to_client=limits.adapter_stderr == "client",
    )
    return Turn(record, Feed(first_seq), state, ProcessHandle(limits.adapter_stop_grace))


class TurnLog:
    """The sink a turn's adapter writes to (an ``EventSink``): numbers, logs and
    publishes each event.

    ``send_many`` gives each event the next seq and queues it; ``run`` (a task in
    the turn's nursery) appends what is queued to the store in one call and
    then publishes it to the feed, so batches grow by themselves under load.
    ``end_turn`` queues the last events the turn's state asks for, ``close``
    writes the rest together with how the turn ended.
    """

    def __init__(self, store: Store, turn: Turn, metrics: Metrics | None = None) -> None:
        self._store = store
        self._metrics = metrics
        self._turn = turn
        self._next = turn.feed.first_seq
        self._pending: list[LoggedEvent] = TurnBatch(turn.id)  # numbered here: see TurnBatch
        self._pending_bytes = 0
        self._held: list[LoggedEvent] = []
        self._queued = trio.Event()
        self._drained = trio.Event()
        self._started_at = utcnow()
        self._start_written = False
        self._adopted = False  # the store's events replaced the unlogged ones
        self._stopping = False  # ``stop`` was called: ``run`` returns
        self.sent = 0
        #: When its first event was stored (``time.monotonic``), once it has been.
        self.first_event_at: float | None = None

    # -- the adapter's side ------------------------------------------------------

    async def send(self, event: wire.Event) -> bool:
        return await self.send_many([event])

    async def send_many(self, events: Sequence[wire.Event]) -> bool:
        """Queue ``events``; True: the log always listens."""
        self.add_many(events)
        if len(self._pending) >= _MAX_PENDING or self._pending_bytes >= _MAX_PENDING_BYTES:
            await self._drained.wait()  # backpressure: the store is behind
        return True

    def add(self, event: wire.Event) -> None:
        self.add_many([event])

    def add_many(self, events: Sequence[wire.Event]) -> None:
        """Number and queue ``events`` (``logged`` for a batch: in C, but for the rare
        event with a ``seq`` of its own)."""
        if not events:
            return
        first, turn_id = self._next, self._turn.id
        entries, size = logged_batch(events, first, turn_id)
        self._pending.extend(entries)
        self.sent += len(entries)
        self._next = first + len(entries)
        self._pending_bytes += size
        if self._drained.is_set():
            self._drained = trio.Event()
        self._queued.set()

    def end_turn(self) -> TurnEnd:
        """The turn is over: queue its last events (its state says which); how it ended."""
        state = self._turn.state
        self.add_many(state.finish())
        assert state.verdict is not None
        self._turn.end = TurnEnd(state.verdict.status, state.verdict.reason, utcnow())
        return self._turn.end

    # -- the store's side ----------------------------------------------------------

    async def run(
        self, deadline: float = math.inf, at_deadline: Callable[[], object] = _no_op
    ) -> None:
        """Write what is queued, batch after batch, until ``stop`` (after the write under
        way) or cancelled.

        The turn's timeout rides on this task (one task fewer a turn): at ``deadline``
        (trio's clock) ``at_deadline`` is called, once, unless the turn has stopped.  Only
        the wait for events has the deadline, never a write (it waits for the write)."""
        while True:
            if deadline == math.inf:
                await self._queued.wait()
            else:
                with trio.move_on_at(deadline):
                    await self._queued.wait()
            if self._stopping:  # the turn has ended: no deadline applies to it now
                return
            if trio.current_time() >= deadline:
                deadline = math.inf
                at_deadline()
                continue
            await self._write(None)

    def stop(self) -> None:
        """Let ``run`` return (``close`` writes the rest): no ``Cancelled`` raised and caught."""
        self._stopping = True
        self._queued.set()

    async def close(self, end: TurnEnd | None) -> None:
        """Write the rest of the log with ``end`` (``None``: the turn goes on, parked);
        the caller shields this."""
        await self._write(end)

    async def adopt_stored(self) -> None:
        """The store refused the turn's events as out of turn (``LogConflict``): another
        process closed the turn (its lease had passed, ``_leases``).  Drop what could
        not be logged; what the turn's readers get next is what the store has after
        the last event they could get (the other process's ``error`` and
        ``session.ended``), so no reader sees an event the store does not have.
        """
        last = max([self._turn.feed.published, *(e.seq for e in self._held)])
        stored = await self._store.read_events(
            self._turn.session_id, after=last, turn_id=self._turn.id
        )
        log.warning(
            "turn %s: closed by another process; %d event(s) not logged are dropped",
            self._turn.id,
            len(self._pending),
        )
        self._pending = stored
        self._pending_bytes = sum(len(e.raw) for e in stored)
        self._adopted = True

    def unwritten(self) -> tuple[list[LoggedEvent], datetime | None]:
        """After a ``close`` that failed: the events the store never took, and the turn's
        start unless it was written (what ``EndRetries`` writes again; before ``finish``)."""
        started = None if self._start_written else self._started_at
        return list(self._pending), started

    def finish(self) -> None:
        """Publish what was held back and finish the feed (after the turn let go).

        Events still queued here could not be stored (``close`` failed): the
        turn's readers get them anyway, so they see how it ended (unless they
        were replaced by the store's, ``adopt_stored``).
        """
        if self._pending and not self._adopted:
            log.error(
                "turn %s: %d event(s) sent without being logged", self._turn.id, len(self._pending)
            )
        self._turn.feed.publish(self._held + self._pending)
        self._held, self._pending = [], []
        self._turn.feed.finish()

    async def _write(self, end: TurnEnd | None) -> None:
        batch, size = self._pending, self._pending_bytes
        self._pending, self._pending_bytes = TurnBatch(self._turn.id), 0
        self._queued = trio.Event()
        started = None if self._start_written else self._started_at
        try:
            await self._store.append_events(
                self._turn.session_id, self._turn.id, batch, started_at=started, end=end
            )
        except BaseException:
            # Nothing was written (stores act all at once): keep the batch.
            self._pending[:0] = batch
            self._pending_bytes += sum(len(e.raw) for e in batch)
            if self._pending:
                self._queued.set()
            raise
        self._start_written = True
        if batch:
            if self.first_event_at is None:
                self.first_event_at = time.monotonic()
            if self._metrics is not None:
                self._metrics.events.inc(len(batch))
                self._metrics.event_bytes.inc(size)
        self._publish(batch, size)
        if not self._pending:
            self._drained.set()

    def _publish(self, batch: list[LoggedEvent], size: int) -> None:
        held = self._held
        ready = held + batch if held else batch
        size += sum(len(e.raw) for e in held)
        self._held = [ready.pop()] if ready and ready[-1].type in _HELD else []
        size -= sum(len(e.raw) for e in self._held)
        self._turn.feed.publish(ready, size)


def logged(event: wire.Event, seq: int, turn_id: str) -> LoggedEvent:
    """``event`` as the log holds it: numbered, its JSON carrying ``seq``."""
    return LoggedEvent(seq, turn_id, event.type, wire.with_seq(event.raw, seq))


def logged_batch(
    events: Sequence[wire.Event], first: int, turn_id: str
) -> tuple[list[LoggedEvent], int]:
    """``logged`` for each of ``events``, numbered from ``first``, and their bytes: built
    by ``map`` (in C) unless an event has a ``"seq"`` of its own to replace
    (``wire.with_seq``).  A pipe read's batch (``wire.EventBatch``) is read by its
    columns: no ``Event`` is made of it."""
    if type(events) is wire.EventBatch:
        types, raws, own_seq = events.types, events.raws, events.own_seq
    else:
        types = list(map(_EVENT_TYPE, events))
        raws = list(map(_EVENT_RAW, events))
        joined = b"".join(raws)  # one search, not one a line (200 ns an event)
        own_seq = b'"seq"' in joined or b"\\u" in joined  # (or a key with escapes)
    seqs = range(first, first + len(raws))
    if own_seq:
        numbered = list(map(wire.with_seq, raws, seqs))
    else:  # b'{"seq":N,' + raw[1:], as wire.with_seq does
        rests = zip(seqs, map(_AFTER_BRACE, raws), strict=True)
        numbered = list(map(mod, repeat(_SEQ_FIRST), rests))  # ``mod``: no argument tuple a call
    logged = list(map(LoggedEvent, seqs, repeat(turn_id), types, numbered))
    return logged, sum(map(len, numbered))


_EVENT_RAW = attrgetter("raw")
_EVENT_TYPE = attrgetter("type")
_SEQ_FIRST: Final = b'{"seq":%d,%b'
_AFTER_BRACE: Final = itemgetter(slice(1, None))


def log_end(turn: Turn, events: int) -> None:
    """One info line for a finished turn, ``key=value`` (see docs/operations.md, Logs)."""
    end, outcome = turn.end, turn.outcome
    fields: dict[str, object] = {
        "session": turn.session_id,
        "turn": turn.id,
        "status": None if end is None else end.status.value,
        "reason": None if end is None else end.reason,
        "duration_ms": round((time.monotonic() - turn.admitted_at) * 1000),
        "events": events,
        "exit": None if outcome is None else exit_label(outcome.exit_code),
        "adapter": turn.adapter,
        "protocol": turn.protocol,
    }
    log_fields(log, "turn ended", fields)
