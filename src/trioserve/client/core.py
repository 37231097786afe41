"""``Client``: the HTTP endpoints, turns over SSE or WebSocket, and the event log.

What goes over the network (requests, and opening the streams a turn or
a log is read from) is ``connection.Connection``'s; the streams themselves
are in ``turns.py`` and ``log.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from types import TracebackType
from urllib.parse import quote

import trio

from trioserve.client import errors
from trioserve.client.connection import WS_MAX_MESSAGE, Connection, json_of, session_path
from trioserve.client.errors import ProtocolError
from trioserve.client.log import LogStream, Opener, Reconnect, WebSocketLog, parse_event_array
from trioserve.client.models import Event, Session, SessionPage, Turn
from trioserve.client.turns import SSEReader, Transport, TurnStream
from trioserve.protocol import NEXT_PAGE_HEADER, OnDisconnect


class Client:
    """A trioserve client: ``async with Client("http://127.0.0.1:8080") as client:``.

    ``api_key`` (a key of the server's ``--api-keys``) is sent as
    ``Authorization: Bearer KEY`` on every request and WebSocket handshake;
    a missing or wrong one raises ``UnauthorizedError`` (401).

    ``timeout`` (seconds, ``None`` for none) bounds each network operation
    of a request: connecting, sending, waiting for bytes.  A turn's stream
    has no read timeout (a turn may run for minutes, quietly); bound it with
    ``trio.fail_after`` / ``trio.move_on_after`` around the block.

    Guarantees under cancellation (every method is a plain Trio wait):

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
    - The client starts no background task of its own.  Over WebSocket,
      each connection's tasks (trio-websocket's reader, and in ``events()``
      one holding the connection open) run in a nursery inside the
      ``turn()`` or ``events()`` block; they have ended when the block is
      left.  ``aclose`` closes the connection pool.
    - ``events()`` re-opens a cut stream by itself (see ``Reconnect``);
      its waits between attempts are cancellable like any other.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float | None = 30.0,
        ws_max_message: int = WS_MAX_MESSAGE,
        api_key: str | None = None,
    ) -> None:
        self._conn = Connection(
            base_url, timeout=timeout, ws_max_message=ws_max_message, api_key=api_key
        )
        self.base_url = self._conn.base_url

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every pooled connection.  Idempotent."""
        await self._conn.aclose()

    # -- sessions ----------------------------------------------------------------

    async def create_session(self, inputs: Mapping[str, str] | None = None) -> Session:
        """``POST /v1/sessions``: a new active session; ``inputs`` fill ``${inputs.*}``."""
        body = {"inputs": dict(inputs)} if inputs else {}
        response = await self._conn.request("POST", "/v1/sessions", json=body, expect=201)
        return Session.from_json(json_of(response))

    async def get_session(self, session_id: str) -> Session:
        """``GET /v1/sessions/{id}``; ``NotFoundError`` if unknown."""
        response = await self._conn.request("GET", session_path(session_id))
        return Session.from_json(json_of(response))

    async def list_sessions(
        self, status: str | None = None, limit: int | None = None, before: str | None = None
    ) -> list[Session]:
        """``GET /v1/sessions``, most recently active first: one page (``sessions_page``)."""
        page = await self.sessions_page(status=status, limit=limit, before=before)
        return page.sessions

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
        params: dict[str, str] = {}
        if status is not None:
            params["status"] = status
        if limit is not None:
            params["limit"] = str(limit)
        if before is not None:
            params["before"] = before
        response = await self._conn.request("GET", "/v1/sessions", params=params)
        value = json_of(response)
        if not isinstance(value, list):
            raise ProtocolError("the server sent a session list that is not a JSON array")
        sessions = [Session.from_json(item) for item in value]
        return SessionPage(sessions, response.headers.get(NEXT_PAGE_HEADER) or None)

    async def iter_sessions(
        self, status: str | None = None, *, page_size: int = 100
    ) -> AsyncIterator[Session]:
        """Every session, most recently active first, fetched ``page_size`` at a time.

        Pages are keyset pages: a session appears once, even if sessions are
        created meanwhile (those come before the first page, and are not
        seen); one whose activity changes meanwhile may be seen twice or
        not at all.  Nothing is held between pages: break out at any time.
        """
        before: str | None = None
        while True:
            page = await self.sessions_page(status=status, limit=page_size, before=before)
            for session in page.sessions:
                yield session
            if page.next_page is None:
                return
            before = page.next_page

    async def end_session(self, session_id: str) -> None:
        """``DELETE /v1/sessions/{id}``: end it (and stop its running turn); idempotent."""
        await self._conn.request("DELETE", session_path(session_id), expect=204)

    # -- turn records ------------------------------------------------------------

    async def detach(self, session_id: str, input: str = "") -> Turn:
        """Start a turn with no client attached (``"detach": true``): its record, ``running``.

        The server answers ``202`` at once; the turn holds the session and a
        turn slot like any other, and its events are read with
        ``events(session_id, turn=record.id)``.  Refusals as for ``turn()``
        (404, 409, 429, 503).
        """
        path = session_path(session_id) + "/turns"
        response = await self._conn.request(
            "POST", path, json={"input": input, "detach": True}, expect=202
        )
        return Turn.from_json(json_of(response))

    async def list_turns(self, session_id: str) -> list[Turn]:
        """``GET /v1/sessions/{id}/turns``: the session's turn records, oldest first."""
        response = await self._conn.request("GET", session_path(session_id) + "/turns")
        value = json_of(response)
        if not isinstance(value, list):
            raise ProtocolError("the server sent a turn list that is not a JSON array")
        return [Turn.from_json(item) for item in value]

    async def get_turn(self, session_id: str, turn_id: str) -> Turn:
        """``GET /v1/sessions/{id}/turns/{turnId}``; ``NotFoundError`` if unknown."""
        path = session_path(session_id) + "/turns/" + quote(turn_id, safe="")
        response = await self._conn.request("GET", path)
        return Turn.from_json(json_of(response))

    async def cancel(self, session_id: str) -> None:
        """``DELETE /v1/sessions/{id}/turns/current``: cancel the running turn.

        Returns once the server has accepted (202); the turn's stream then
        ends with one ``session.ended`` whose reason is ``cancelled``.
        ``NotFoundError`` with ``reason == "no_turn"`` if nothing runs.
        """
        await self._conn.request("DELETE", session_path(session_id) + "/turns/current", expect=202)

    async def health(self) -> bool:
        """``GET /healthz``: True when the server answers 200."""
        response = await self._conn.request("GET", "/healthz", expect=None)
        return response.status_code == 200

    async def ready(self) -> bool:
        """``GET /readyz``: True when ready, False while draining (503)."""
        response = await self._conn.request("GET", "/readyz", expect=None)
        if response.status_code in (200, 503):
            return response.status_code == 200
        raise errors.from_response(response.status_code, response.headers, response.content)

    # -- turns -------------------------------------------------------------------

    @asynccontextmanager
    async def turn(
        self,
        session_id: str,
        input: str = "",
        *,
        transport: Transport = "sse",
        on_disconnect: OnDisconnect | None = None,
    ) -> AsyncIterator[TurnStream]:
        """Run one turn: ``async with client.turn(sid, "hi") as events: async for e in events``.

        ``transport`` is ``"sse"`` (``POST /v1/sessions/{id}/turns``) or
        ``"websocket"`` (a connection to ``/v1/sessions/{id}/ws`` for this
        turn).  An empty ``input`` runs the session's own task.
        ``on_disconnect`` says what the turn does if this client leaves
        before its end: ``"cancel"`` (stop it), ``"continue"`` (run on,
        its events logged for ``events()``), ``None`` (the server's
        ``--on-disconnect``, itself ``cancel`` by default).

        A refusal raises on entering the block, before any event: 400, 404
        (unknown or terminal session), 409 (a turn is in flight), 429
        (turn cap), 503 (draining), as ``APIError`` subclasses; an
        unreachable server raises ``ConnectError``.  Over WebSocket, entering
        waits for the turn's first event.  The stream's ``turn_id``,
        ``status`` and ``reason``: see ``TurnStream``.  See the class doc
        for what leaving the block guarantees.
        """
        if transport == "sse":
            async with self._conn.sse_turn(session_id, input, on_disconnect) as stream:
                yield stream
        elif transport == "websocket":
            async with self._conn.websocket_turn(session_id, input, on_disconnect) as ws_stream:
                yield ws_stream
        else:
            raise ValueError(f"transport must be 'sse' or 'websocket', got {transport!r}")

    # -- the event log -----------------------------------------------------------

    @asynccontextmanager
    async def events(
        self,
        session_id: str,
        *,
        after: int = 0,
        turn: str | None = None,
        follow: bool = False,
        reconnect: bool | Reconnect = True,
        transport: Transport = "sse",
    ) -> AsyncIterator[LogStream]:
        """Read the session's event log: ``async with client.events(sid) as events:``.

        The events after seq ``after`` (``0``: the whole log), then the
        running turn live; the iteration ends after that turn's last event,
        or right after the replay when no turn runs.  ``turn`` limits it to
        one turn (by its id).  ``follow=True`` (SSE only) stays open across
        later turns until the session ends.  Leaving the block never
        cancels a turn.

        ``reconnect`` (``True``: ``Reconnect()``; ``False``: never; or a
        ``Reconnect`` policy): a stream cut before its end is re-opened
        after the last seq delivered, with capped exponential backoff, so
        the iteration yields every event once, in order, with no gap; see
        ``LogStream`` and ``Reconnect``.

        ``transport="sse"`` reads ``GET /v1/sessions/{id}/events``;
        ``"websocket"`` sends ``{"type":"resume"}`` on a connection to
        ``/v1/sessions/{id}/ws`` (the server refuses a WebSocket for an
        ended session: use SSE to read its log).

        Refusals raise on entering the block: ``NotFoundError`` (unknown
        session or turn), ``BadRequestError`` (a cursor past the end of the
        log), ``CursorExpiredError`` (retention dropped events after the
        cursor; its ``earliest_seq`` is the first one kept), ``ConnectError``.
        The first connection is not retried.
        """
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise ValueError(f"after must be a non-negative integer seq, got {after!r}")
        policy = Reconnect() if reconnect is True else reconnect or None
        if transport == "sse":
            read_timeout = policy.read_timeout if policy is not None else None

            async def open_sse(cursor: int, reconnecting: bool) -> SSEReader:
                return await self._conn.open_log_sse(
                    session_id, cursor, reconnecting, turn, follow, read_timeout
                )

            stream = self._log_stream(session_id, "sse", after, turn, follow, policy, open_sse)
            try:
                await stream.open()
                yield stream
            finally:
                await stream.aclose()
        elif transport == "websocket":
            if follow:
                raise ValueError("follow=True needs transport='sse'")
            raised: BaseException | None = None
            async with trio.open_nursery() as nursery:

                async def open_ws(cursor: int, reconnecting: bool) -> WebSocketLog:
                    return await self._conn.open_log_websocket(nursery, session_id, cursor, turn)

                stream = self._log_stream(
                    session_id, "websocket", after, turn, False, policy, open_ws
                )
                try:
                    await stream.open()
                    yield stream
                except BaseException as exc:
                    # Re-raised below, outside the nursery, so that it is not
                    # wrapped in an exception group.
                    raised = exc
                finally:
                    await stream.aclose()  # the socket tasks close their sockets and end
            if raised is not None:
                raise raised
        else:
            raise ValueError(f"transport must be 'sse' or 'websocket', got {transport!r}")

    async def export(
        self, session_id: str, *, after: int = 0, turn: str | None = None
    ) -> list[Event]:
        """``GET /v1/sessions/{id}/events?format=json``: the logged events after ``after``.

        What the store holds now, oldest first (no live part: a running
        turn's events so far).  ``turn`` limits it to one turn.  Refusals as
        for ``events()``; ``Event.raw`` is each element's text as sent.
        """
        params = {"format": "json", "after": str(after)}
        if turn is not None:
            params["turn"] = turn
        response = await self._conn.request(
            "GET", session_path(session_id) + "/events", params=params
        )
        return parse_event_array(response.content.decode(errors="replace"))

    def _log_stream(
        self,
        session_id: str,
        transport: Transport,
        after: int,
        turn: str | None,
        follow: bool,
        policy: Reconnect | None,
        opener: Opener,
    ) -> LogStream:
        async def session_ended() -> bool:
            return (await self.get_session(session_id)).terminal

        return LogStream(
            session_id,
            transport,
            after=after,
            turn=turn,
            follow=follow,
            reconnect=policy,
            opener=opener,
            session_ended=session_ended,
        )

    def websocket_url(self, session_id: str) -> str:
        """``ws://…/v1/sessions/{id}/ws`` (``wss://`` for an https base URL)."""
        return self._conn.websocket_url(session_id)
