"""``Client``: the async client, the same under asyncio and Trio (anyio underneath).

A thin shell: each method runs one flow of ``calls.Calls`` with an
``AsyncDriver``; ``TurnStream`` and ``LogStream`` iterate by running their
reader's ``step`` flow.  What the calls mean is documented here; how they
are sent, checked and retried is ``calls.py``, ``http.py``, ``turns.py``,
``log.py`` and ``websocket.py``, shared with ``SyncClient``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Self

from trioserve.client.async_io import AsyncDriver
from trioserve.client.log import LogReader
from trioserve.client.models import Approval, Event, Session, SessionPage, Turn
from trioserve.client.shell import Block, S, Shell
from trioserve.client.turns import EventStream, TurnReader
from trioserve.protocol import Multitask


class AsyncEventStream(EventStream[AsyncDriver]):
    """An ``EventStream`` read with ``async for`` (see ``TurnStream``, ``LogStream``)."""

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Event:
        event = await self._driver.run(self.step())
        if event is None:
            raise StopAsyncIteration
        return event


class AsyncBlock(Block[AsyncDriver, S], AbstractAsyncContextManager[S]):
    """``async with``: see ``Block``."""

    async def __aenter__(self) -> S:
        return self._opened(await self._driver.run(self._opening))

    async def __aexit__(self, _: object, exc: BaseException | None, __: object) -> None:
        if exc is None:
            await self._driver.run(self.leaving(None))
        else:
            await self._driver.cleanup(self.leaving(exc))


class TurnStream(AsyncEventStream, TurnReader[AsyncDriver]):
    """A turn's events, ``async for event in stream`` (see ``TurnReader``)."""


class LogStream(AsyncEventStream, LogReader[AsyncDriver]):
    """A session's logged events, ``async for event in stream`` (see ``LogReader``)."""


class Client(Shell[AsyncDriver, AsyncBlock[TurnStream], AsyncBlock[LogStream]]):
    """A trioserve client: ``async with Client("http://127.0.0.1:8080") as client:``.

    The same under ``asyncio.run``, ``trio.run`` and anyio with either
    backend (httpx and the WebSocket layer run on anyio).  ``SyncClient``
    has the same methods for blocking code.  The arguments (``Shell``):
    ``Client(base_url, *, timeout=30.0, api_key=None, retry=Retry(),
    ws_max_message=64 MiB)``.

    ``api_key`` (a key of the server's ``--api-keys``) is sent as
    ``Authorization: Bearer KEY`` on every request and WebSocket handshake;
    a missing or wrong one raises ``UnauthorizedError`` (401).

    ``timeout`` (seconds, ``None`` for none) bounds each network operation
    of a request: connecting, sending, waiting for bytes.  A turn's stream
    has no read timeout (a turn may run for minutes, quietly); bound it with
    a cancel scope (``anyio.fail_after``, ``trio.move_on_after``,
    ``asyncio.timeout``) around the block.

    ``retry``: a request that may not have reached the server (the
    connection failed before an answer, or a proxy answered 502, 503 or
    504) is sent again, up to twice by default; creates and turns carry an
    ``Idempotency-Key`` so that a server can tell a repeat.  ``Retry``
    says how; ``Retry(attempts=0)`` never.

    Guarantees under cancellation (every method is a plain wait of the
    loop it runs on):

    - A cancelled request is abandoned and its connection closed, never
      returned half-read to the pool.  The server may or may not have acted
      on it (a cancelled ``create_session`` may still have created one).
    - However the block of ``turn()`` or ``events()`` is left (the last
      event, a ``break``, an exception, a cancellation), its stream is
      closed before ``__aexit__`` returns; the socket is closed even if the
      exit itself is cancelled.  A turn still running is then cancelled by
      the server (its adapter gets SIGINT), exactly as for any client that
      disconnects, unless it was started with ``on_disconnect="continue"``
      (or the server's default is ``--on-disconnect continue``): then it
      runs on and its events stay in the session's log, for ``events()``.
      Leaving ``events()`` never cancels a turn.
    - Once the turn's last event was received and the block is left
      normally, the server has freed the session and the turn slot: the next
      ``turn()`` is not refused as busy.  (Over SSE, leaving reads the stream
      to its end for this, which the server sends once the adapter has
      exited; one still running 1 s after its ``session.ended`` is stopped.
      Over WebSocket, leaving reads on to ``trioserve.turn.end``.)
    - The client starts no task or thread: everything happens in the task
      that awaits it.  ``aclose`` closes the connection pool.
    - ``events()`` re-opens a cut stream by itself (see ``Reconnect``);
      its waits between attempts are cancellable like any other.
    """

    _driver_class = AsyncDriver
    _stream_classes = (TurnStream, LogStream)
    _block_class = AsyncBlock

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every pooled connection.  Idempotent."""
        await self._driver.http.aclose()

    # -- sessions ----------------------------------------------------------------------

    async def create_session(self, inputs: Mapping[str, str] | None = None) -> Session:
        """``POST /v1/sessions``: a new active session; ``inputs`` fill ``${inputs.*}``."""
        return await self._driver.run(self._calls.create_session(inputs))

    async def get_session(self, session_id: str) -> Session:
        """``GET /v1/sessions/{id}``; ``NotFoundError`` if unknown."""
        return await self._driver.run(self._calls.get_session(session_id))

    async def list_sessions(
        self, status: str | None = None, limit: int | None = None, before: str | None = None
    ) -> list[Session]:
        """``GET /v1/sessions``, most recently active first: one page (``sessions_page``)."""
        return (await self.sessions_page(status, limit, before)).sessions

    async def sessions_page(
        self, status: str | None = None, limit: int | None = None, before: str | None = None
    ) -> SessionPage:
        """``GET /v1/sessions``: up to ``limit`` sessions after ``before``, and the next token.

        ``before`` is a page's ``next_page`` token (or a session id: the page
        starts after that session).  Without ``limit`` the server sends every
        session (after ``before``) at once.  ``BadRequestError`` for a
        ``limit`` out of 1..10000 or a bad ``before``; an unknown ``status``
        matches no session.
        """
        return await self._driver.run(self._calls.sessions_page(status, limit, before))

    async def iter_sessions(
        self, status: str | None = None, *, page_size: int = 100
    ) -> AsyncIterator[Session]:
        """Every session, most recently active first, fetched ``page_size`` at a time.

        Pages are keyset pages: a session appears once, even if sessions are
        created meanwhile (those come before the first page, and are not
        seen); one whose activity changes meanwhile may be seen twice or
        not at all.  Nothing is held between pages: break out at any time.
        """
        pages = self._calls.pages(status, page_size)
        while (sessions := await self._driver.run(pages.next())) is not None:
            for session in sessions:
                yield session

    async def end_session(self, session_id: str) -> None:
        """``DELETE /v1/sessions/{id}``: end it (and stop its running turn); idempotent."""
        await self._driver.run(self._calls.end_session(session_id))

    # -- turn records ------------------------------------------------------------------

    async def detach(
        self,
        session_id: str,
        input: str = "",
        *,
        multitask: Multitask | None = None,
        webhook: str | None = None,
    ) -> Turn:
        """Start a turn with no client attached (``"detach": true``): its record, ``running``
        (``queued`` if it waits behind another: ``multitask="enqueue"``).  With ``webhook``
        the server POSTs the turn's end there, signed (docs/api.md, "Webhooks").

        The server answers ``202`` at once; the turn holds the session and a
        turn slot like any other, and its events are read with
        ``events(session_id, turn=record.id)``.  Refusals as for ``turn()``
        (404, 409, 429, 503).
        """
        return await self._driver.run(self._calls.detach(session_id, input, multitask, webhook))

    async def list_turns(self, session_id: str) -> list[Turn]:
        """``GET /v1/sessions/{id}/turns``: the session's turn records, oldest first."""
        return await self._driver.run(self._calls.list_turns(session_id))

    async def get_turn(self, session_id: str, turn_id: str) -> Turn:
        """``GET /v1/sessions/{id}/turns/{turnId}``; ``NotFoundError`` if unknown."""
        return await self._driver.run(self._calls.get_turn(session_id, turn_id))

    async def cancel(self, session_id: str, turn_id: str | None = None) -> None:
        """``DELETE /v1/sessions/{id}/turns/current``: cancel the running turn; with
        ``turn_id``, ``DELETE …/turns/{turnId}``: that turn, running or queued.

        Returns once the server has accepted (202); the turn's stream then
        ends with one ``session.ended`` whose reason is ``cancelled``.
        ``NotFoundError`` with ``reason == "no_turn"`` if nothing runs;
        An ``APIError`` of status 409 (``SessionBusyError``) with ``reason ==
        "turn_ended"`` for a turn that has ended.
        """
        await self._driver.run(self._calls.cancel(session_id, turn_id))

    async def approvals(self, session_id: str) -> list[Approval]:
        """``GET /v1/sessions/{id}/approvals``: its approvals, pending and decided, oldest
        first (``Approval.pending``)."""
        return await self._driver.run(self._calls.approvals(session_id))

    async def approve(
        self,
        session_id: str,
        approval_id: str,
        *,
        arguments: Mapping[str, Any] | None = None,
        message: str | None = None,
    ) -> Approval:
        """``POST …/approvals/{approvalId}`` ``approve``: the waiting tool call runs (with
        ``arguments`` instead of the model's, if given) and its turn continues.

        ``SessionBusyError`` (409, ``reason == "approval_decided"``) if it was
        decided already; ``NotFoundError`` for an unknown one.
        """
        flow = self._calls.decide(session_id, approval_id, "approve", arguments, message)
        return await self._driver.run(flow)

    async def deny(
        self, session_id: str, approval_id: str, *, message: str | None = None
    ) -> Approval:
        """``POST …/approvals/{approvalId}`` ``deny``: the model is told the call was denied
        (and ``message``); refusals as ``approve``."""
        flow = self._calls.decide(session_id, approval_id, "deny", None, message)
        return await self._driver.run(flow)

    async def health(self) -> bool:
        """``GET /healthz``: True when the server answers 200."""
        return await self._driver.run(self._calls.health())

    async def ready(self) -> bool:
        """``GET /readyz``: True when ready, False while draining (503)."""
        return await self._driver.run(self._calls.ready())

    # -- the event log -----------------------------------------------------------------

    async def export(
        self, session_id: str, *, after: int = 0, turn: str | None = None
    ) -> list[Event]:
        """``GET /v1/sessions/{id}/events?format=json``: the logged events after ``after``.

        What the store holds now, oldest first (no live part: a running
        turn's events so far).  ``turn`` limits it to one turn.  Refusals as
        for ``events()``; ``Event.raw`` is each element's text as sent.
        """
        return await self._driver.run(self._calls.export(session_id, after, turn))
