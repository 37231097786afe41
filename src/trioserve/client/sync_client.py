"""``SyncClient``: ``Client``'s methods for blocking code, with no event loop.

``with SyncClient(url) as client:``; every method of ``Client``, with the
same arguments, results and exceptions, returns when it is done; a turn's
and a log's events are iterated with ``for`` inside ``with client.turn(…)
as events:``.  The calls run the same flows as ``Client`` (``calls.py``)
with a ``SyncDriver``: blocking sockets, no event loop, no thread of its
own.  One client may be shared by threads.

Ctrl-C during a turn (``KeyboardInterrupt`` in its block, before the
turn's end) cancels the turn on the server, as ``trioserve chat`` does,
then closes the stream; the ``KeyboardInterrupt`` goes on.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any, Self

from trioserve.client.log import LogReader
from trioserve.client.models import Approval, Event, Session, SessionPage, Turn
from trioserve.client.shell import Block, S, Shell
from trioserve.client.sync_io import SyncDriver
from trioserve.client.turns import EventStream, TurnReader
from trioserve.protocol import Multitask


class SyncEventStream(EventStream[SyncDriver]):
    """An ``EventStream`` read with ``for`` (see ``SyncTurnStream``, ``SyncLogStream``)."""

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> Event:
        event = self._driver.run(self.step())
        if event is None:
            raise StopIteration
        return event


class SyncBlock(Block[SyncDriver, S], AbstractContextManager[S]):
    """``with``: see ``Block``."""

    def __enter__(self) -> S:
        return self._opened(self._driver.run(self._opening))

    def __exit__(self, _: object, exc: BaseException | None, __: object) -> None:
        if exc is None:
            self._driver.run(self.leaving(None))
        else:
            self._driver.cleanup(self.leaving(exc))


class SyncTurnStream(SyncEventStream, TurnReader[SyncDriver]):
    """A turn's events, ``for event in stream`` (see ``TurnReader``)."""


class SyncLogStream(SyncEventStream, LogReader[SyncDriver]):
    """A session's logged events, ``for event in stream`` (see ``LogReader``)."""


class SyncClient(Shell[SyncDriver, SyncBlock[SyncTurnStream], SyncBlock[SyncLogStream]]):
    """A blocking trioserve client: ``with SyncClient("http://127.0.0.1:8080") as client:``.

    The arguments are ``Client``'s, and so are the methods (blocking here),
    their results and their exceptions; see ``Client`` for each.
    ``timeout`` also bounds each blocking network operation; a turn's
    stream has no read timeout.
    """

    _driver_class = SyncDriver
    _stream_classes = (SyncTurnStream, SyncLogStream)
    _block_class = SyncBlock

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every pooled connection.  Idempotent."""
        self._driver.http.close()

    def create_session(self, inputs: Mapping[str, str] | None = None) -> Session:
        """``POST /v1/sessions`` (``Client.create_session``)."""
        return self._driver.run(self._calls.create_session(inputs))

    def get_session(self, session_id: str) -> Session:
        """``GET /v1/sessions/{id}`` (``Client.get_session``)."""
        return self._driver.run(self._calls.get_session(session_id))

    def list_sessions(
        self, status: str | None = None, limit: int | None = None, before: str | None = None
    ) -> list[Session]:
        """One page of ``GET /v1/sessions`` (``Client.list_sessions``)."""
        return self.sessions_page(status, limit, before).sessions

    def sessions_page(
        self, status: str | None = None, limit: int | None = None, before: str | None = None
    ) -> SessionPage:
        """One page of ``GET /v1/sessions`` and the next token (``Client.sessions_page``)."""
        return self._driver.run(self._calls.sessions_page(status, limit, before))

    def iter_sessions(
        self, status: str | None = None, *, page_size: int = 100
    ) -> Iterator[Session]:
        """Every session, a page at a time (``Client.iter_sessions``)."""
        pages = self._calls.pages(status, page_size)
        while (sessions := self._driver.run(pages.next())) is not None:
            yield from sessions

    def end_session(self, session_id: str) -> None:
        """``DELETE /v1/sessions/{id}`` (``Client.end_session``)."""
        self._driver.run(self._calls.end_session(session_id))

    def detach(
        self,
        session_id: str,
        input: str = "",
        *,
        multitask: Multitask | None = None,
        webhook: str | None = None,
    ) -> Turn:
        """A turn started with no client attached (``Client.detach``)."""
        return self._driver.run(self._calls.detach(session_id, input, multitask, webhook))

    def list_turns(self, session_id: str) -> list[Turn]:
        """``GET /v1/sessions/{id}/turns`` (``Client.list_turns``)."""
        return self._driver.run(self._calls.list_turns(session_id))

    def get_turn(self, session_id: str, turn_id: str) -> Turn:
        """``GET /v1/sessions/{id}/turns/{turnId}`` (``Client.get_turn``)."""
        return self._driver.run(self._calls.get_turn(session_id, turn_id))

    def cancel(self, session_id: str, turn_id: str | None = None) -> None:
        """``DELETE …/turns/current``, or ``…/turns/{turnId}`` (``Client.cancel``)."""
        self._driver.run(self._calls.cancel(session_id, turn_id))

    def approvals(self, session_id: str) -> list[Approval]:
        """``GET …/approvals`` (``Client.approvals``)."""
        return self._driver.run(self._calls.approvals(session_id))

    def approve(
        self,
        session_id: str,
        approval_id: str,
        *,
        arguments: Mapping[str, Any] | None = None,
        message: str | None = None,
    ) -> Approval:
        """Approve a waiting tool call (``Client.approve``)."""
        flow = self._calls.decide(session_id, approval_id, "approve", arguments, message)
        return self._driver.run(flow)

    def deny(self, session_id: str, approval_id: str, *, message: str | None = None) -> Approval:
        """Deny a waiting tool call (``Client.deny``)."""
        return self._driver.run(self._calls.decide(session_id, approval_id, "deny", None, message))

    def health(self) -> bool:
        """``GET /healthz`` (``Client.health``)."""
        return self._driver.run(self._calls.health())

    def ready(self) -> bool:
        """``GET /readyz`` (``Client.ready``)."""
        return self._driver.run(self._calls.ready())

    def export(self, session_id: str, *, after: int = 0, turn: str | None = None) -> list[Event]:
        """The logged events after ``after``, as a list (``Client.export``)."""
        return self._driver.run(self._calls.export(session_id, after, turn))
