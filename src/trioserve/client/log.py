"""Reading a session's event log: ``LogStream``, which re-opens a cut stream.

``Client.events`` yields a ``LogStream``: the logged events after a cursor,
then the running turn live (docs/api.md, "The event log").  Every event
carries its ``seq``; the stream keeps the seq of the last event it
delivered (``last_seq``).  When the connection is cut before the stream's
end -- the server restarted, a proxy dropped it, the network blipped -- the
stream opens a new one that resumes after ``last_seq`` (SSE:
``Last-Event-ID``; WebSocket: ``{"type":"resume","after":N}``), so the
caller sees every event once, in order, with no gap.  How often and how
patiently is a ``Reconnect`` policy.

How the end of the stream is told from a cut:

- SSE: the server ends a chunked response with its terminating chunk; a
  connection closed before it (or any other broken read) is a cut.  A
  ``follow`` stream also ends cleanly when the server drains: then the
  session is looked up, and the stream is re-opened unless the session has
  ended.
- WebSocket: the stream ends with ``trioserve.resume.end``; a close before
  it is a cut (its code says why).

Which errors are worth another attempt (``retryable``): a cut
(``StreamInterrupted``), a refused or timed-out connection, any other
transport failure except ``ProtocolError``, and a 502, 503 or 504 (after
``Retry-After`` if the answer has one).  Anything else -- 404, 400, a 410
``CursorExpiredError`` -- ends the iteration at once.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from trioserve.client.effects import Flow, Now, SleepUntil
from trioserve.client.errors import (
    APIError,
    ProtocolError,
    StreamInterrupted,
    TransportError,
    TrioserveClientError,
)
from trioserve.client.http import RETRY_STATUSES
from trioserve.client.models import Event
from trioserve.client.turns import D, EventStream, Transport, WSChannel
from trioserve.protocol import RESUME_END


@dataclass(frozen=True, slots=True)
class Reconnect:
    """How ``events()`` re-opens a cut stream.

    After a cut, attempt ``n`` (1, 2, …) waits ``initial_delay * 2**(n-1)``
    seconds, at most ``max_delay``, minus up to ``jitter`` of it at random
    (so clients cut together do not come back together), or longer if a
    503 said ``Retry-After``.  After ``attempts`` attempts in a row that
    delivered no event, the stream raises ``StreamInterrupted`` (its
    ``__cause__`` is the last attempt's error).  An event delivered resets
    the count.  The defaults ride out about 40 s without an event (a
    restart, a drain of up to the server's default 25 s grace): 0.1, 0.2,
    0.4, … 6.4, then 10 s between attempts.

    ``read_timeout`` (SSE only, seconds; ``None`` for none) treats a stream
    silent for that long as cut.  The server's heartbeat comments count as
    traffic, so set it above the server's ``--heartbeat`` (say three times)
    to find a connection that died without a word.
    """

    attempts: int = 10
    initial_delay: float = 0.1
    max_delay: float = 10.0
    jitter: float = 0.2
    read_timeout: float | None = None

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {self.attempts}")
        if not 0 <= self.initial_delay <= self.max_delay:
            raise ValueError("need 0 <= initial_delay <= max_delay")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter must be between 0 and 1, got {self.jitter}")
        if self.read_timeout is not None and not self.read_timeout > 0:
            raise ValueError(f"read_timeout must be positive, got {self.read_timeout}")

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait before attempt ``attempt`` (from 1)."""
        exponent = min(attempt - 1, 64)
        base = min(self.max_delay, self.initial_delay * 2.0**exponent)
        base *= 1 - self.jitter * random.random()
        if retry_after is not None:
            base = max(base, retry_after)
        return base


def retryable(exc: TrioserveClientError) -> bool:
    """True for an error a new connection may get past (see the module doc)."""
    if isinstance(exc, ProtocolError):
        return False
    if isinstance(exc, TransportError):
        return True
    return isinstance(exc, APIError) and exc.code in RETRY_STATUSES


class LogConnection(Protocol):
    """One connection of a ``LogReader``: its events, then ``None`` at its clean end."""

    #: A read was cancelled and the connection cannot be read on.
    @property
    def cancelled(self) -> bool: ...

    def next(self) -> Flow[Event | None]: ...

    def close(self) -> Flow[None]: ...


#: Opens a connection resuming after seq ``cursor``; ``reconnecting`` is
#: False for the first one.  Raises the client's exceptions.
Opener = Callable[[int, bool], Flow[LogConnection]]


class LogReader(EventStream[D]):
    """The events of a session's log after a cursor: what ``events()`` yields.

    ``last_seq`` starts at the ``after`` cursor and is the seq of the last
    event delivered, the cursor to resume from later (``after=last_seq``).
    ``reconnects`` counts the connections opened after a cut.

    Iteration ends where the server ends the stream: after the replay and
    the running turn, or with ``follow`` when the session ends.  It raises
    ``CursorExpiredError`` (410) if retention dropped events after the
    cursor, the ``APIError`` of any other refusal, ``ProtocolError`` for
    something that is no event, and ``StreamInterrupted`` for a cut it was
    not allowed to (``reconnect=False``) or could not (attempts used up)
    re-open.

    Cancellation: each step is a plain cancellable wait (reading, a backoff
    sleep, a re-open) and loses nothing: an event is delivered only once
    the step returns it, so a cancelled step's event comes with the next
    one (over SSE a cancelled read closes the connection, and the next step
    re-opens it at once after ``last_seq``, without counting an attempt).
    """

    def __init__(
        self,
        driver: D,
        session_id: str,
        transport: Transport,
        *,
        after: int,
        turn: str | None,
        follow: bool,
        reconnect: Reconnect | None,
        opener: Opener,
        session_ended: Callable[[], Flow[bool]],
    ) -> None:
        super().__init__(driver, session_id, transport)
        self.last_seq: int = after
        #: The turn the stream is limited to, if any.
        self.turn_id = turn
        self.follow = follow
        self.reconnect = reconnect
        self.reconnects = 0
        self._open = opener
        self._session_ended = session_ended
        self._conn: LogConnection | None = None
        self._closed = False
        self._failures = 0  # attempts in a row that delivered no event
        self._cause: TrioserveClientError | None = None  # why the last connection went
        self._at_once = False  # re-open without waiting (after a cancelled read)
        self._next: tuple[int, float] | None = None  # the pending attempt: its number, its time

    def open(self) -> Flow[None]:
        """Open the first connection; refusals raise here, no attempt is repeated."""
        self._conn = yield from self._open(self.last_seq, False)

    def leave(self, exc: BaseException | None = None) -> Flow[None]:
        """Close the current connection; the iteration is over.  Idempotent.

        Leaving never cancels a turn, whatever ``exc`` (why the block was left).
        """
        self._closed = True
        self._finished = True
        yield from self._drop()

    def _drop(self) -> Flow[None]:
        conn, self._conn = self._conn, None
        if conn is not None:
            yield from conn.close()

    def _receive(self) -> Flow[Event | None]:
        while True:
            if self._closed:
                return None
            conn = self._conn
            if conn is None:
                yield from self._reopen()
                continue
            if conn.cancelled:
                self._at_once = True
                yield from self._drop()
                if self.reconnect is None:
                    raise StreamInterrupted("the stream was closed by a cancelled read")
                continue
            try:
                event = yield from conn.next()
            except TrioserveClientError as exc:
                self._cause = exc
                yield from self._drop()
                if self.reconnect is None or not retryable(exc):
                    raise
                continue
            if event is None:
                yield from self._drop()
                if not (yield from self._goes_on()):
                    return None
                continue
            if event.seq is not None and event.seq <= self.last_seq:
                continue  # delivered already (a server or proxy replaying too much)
            self._failures = 0
            return event

    def _goes_on(self) -> Flow[bool]:
        """After a clean end: True if it is a drain to ride out (a ``follow`` stream)."""
        if not self.follow or self.turn_id is not None or self.reconnect is None:
            return False
        self._cause = StreamInterrupted(
            f"the server ended the follow stream of session {self.session_id}, "
            "which has not ended (draining?)"
        )
        try:
            if (yield from self._session_ended()):
                return False
        except TrioserveClientError as exc:
            if not retryable(exc):
                raise
            self._cause = exc
        return True

    def _reopen(self) -> Flow[None]:
        """Open a connection resuming after ``last_seq``, waiting between attempts.

        The next attempt's number and time are kept across steps, so a step
        cancelled while it waits (or while it connects) does not restart
        the wait: the next step picks up where it was.
        """
        policy = self.reconnect
        assert policy is not None
        while self._conn is None:
            if self._next is None:
                now: float = yield Now()
                if self._at_once:  # after a cancelled read: at once, and not counted
                    self._at_once = False
                    self._next = (self._failures, now)
                else:
                    attempt = self._failures + 1
                    if attempt > policy.attempts:
                        raise StreamInterrupted(
                            f"the event stream of session {self.session_id} was cut after seq "
                            f"{self.last_seq} and {policy.attempts} attempt(s) to re-open it "
                            f"failed; the last: {self._cause}"
                        ) from self._cause
                    cause = self._cause
                    retry_after = cause.retry_after if isinstance(cause, APIError) else None
                    self._next = (attempt, now + policy.delay(attempt, retry_after))
            attempt, when = self._next
            yield SleepUntil(when)
            self._failures = attempt
            try:
                conn = yield from self._open(self.last_seq, True)
            except TrioserveClientError as exc:
                self._next = None
                if not retryable(exc):
                    raise
                self._cause = exc
            else:
                self._next = None
                self._conn = conn
                self.reconnects += 1


class WebSocketLog:
    """One WebSocket connection delivering a ``resume``.  A cancelled ``next`` loses nothing."""

    cancelled = False

    def __init__(self, channel: WSChannel) -> None:
        self._channel = channel

    @classmethod
    def start(cls, channel: WSChannel, after: int, turn: str | None) -> Flow[WebSocketLog]:
        """Send the resume and wait for its first message: a refusal raises here."""
        message: dict[str, Any] = {"type": "resume", "after": after}
        if turn is not None:
            message["turn"] = turn
        yield from channel.request(message)
        return cls(channel)

    def next(self) -> Flow[Event | None]:
        while True:
            item = yield from self._channel.next()
            if isinstance(item, Event):
                return item
            if item.get("type") == RESUME_END:
                return None
            # A turn.end: this connection runs no turn; skip it.

    def close(self) -> Flow[None]:
        yield from self._channel.close()


_JSON_SPACE: Final = re.compile(r"[ \t\n\r]*")


def parse_event_array(text: str) -> list[Event]:
    """The events of a JSON array (``GET …/events?format=json``), each with its own text.

    ``Event.raw`` is each element's text exactly as the server sent it.
    ``ProtocolError`` if ``text`` is not an array of wire events.
    """
    decoder = json.JSONDecoder()
    events: list[Event] = []

    def skip(pos: int) -> int:
        match = _JSON_SPACE.match(text, pos)
        return pos if match is None else match.end()

    pos = skip(0)
    if text[pos : pos + 1] != "[":
        raise ProtocolError(f"expected a JSON array of events, got {text[:100]!r}")
    pos = skip(pos + 1)
    if text[pos : pos + 1] == "]":
        pos = skip(pos + 1)
    else:
        while True:
            try:
                value, end = decoder.raw_decode(text, pos)
            except ValueError as exc:
                raise ProtocolError(f"the server sent an export that is not JSON ({exc})") from None
            events.append(Event.from_json(value, text[pos:end]))
            pos = skip(end)
            separator = text[pos : pos + 1]
            pos = skip(pos + 1)
            if separator == "]":
                break
            if separator != ",":
                raise ProtocolError("the server sent an export that is not a JSON array")
    if pos != len(text):
        raise ProtocolError("the server sent text after the export's JSON array")
    return events
