"""The endpoints as flows: what ``Client`` and ``SyncClient`` both run.

Each method returns a flow (``effects.py``) for one call of the API: the
request it sends, how its answer becomes a result or an exception, and for
``open_turn`` and ``open_log`` the streams a block reads.  The clients are
shells that run these flows with their I/O (``aio.py``, ``blocking.py``);
see ``Client`` for what each call means.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import quote

from trioserve.client import errors
from trioserve.client.effects import Flow, sleep
from trioserve.client.errors import APIError, ConnectError, ProtocolError, StreamInterrupted
from trioserve.client.http import HTTP, RETRY_STATUSES, json_of, new_key
from trioserve.client.log import (
    LogConnection,
    LogReader,
    Reconnect,
    WebSocketLog,
    parse_event_array,
)
from trioserve.client.models import Approval, Event, Session, SessionPage, Turn
from trioserve.client.turns import SSESource, Transport, WSChannel
from trioserve.client.websocket import CLOSE_LOST, WS_MAX_MESSAGE, WebSocket, websocket_url
from trioserve.protocol import NEXT_PAGE_HEADER, TURN_ID_HEADER, Multitask, OnDisconnect

R = TypeVar("R")
#: Makes the block's turn stream: ``(session_id, source, cancel)``.
TurnMaker = Callable[[str, SSESource | WSChannel, Flow[None] | None], R]


class Calls:
    """The API of one server, as flows (see the module doc)."""

    def __init__(self, http: HTTP, *, ws_max_message: int = WS_MAX_MESSAGE) -> None:
        self.http = http
        self.ws_max_message = ws_max_message

    # -- sessions ----------------------------------------------------------------------

    def create_session(self, inputs: Mapping[str, str] | None) -> Flow[Session]:
        body = {"inputs": dict(inputs)} if inputs else {}
        response = yield from self.http.request(
            "POST", "/v1/sessions", json=body, expect=201, keyed=True
        )
        return Session.from_json(json_of(response))

    def get_session(self, session_id: str) -> Flow[Session]:
        response = yield from self.http.request("GET", session_path(session_id))
        return Session.from_json(json_of(response))

    def sessions_page(
        self, status: str | None, limit: int | None, before: str | None
    ) -> Flow[SessionPage]:
        params: dict[str, str] = {}
        if status is not None:
            params["status"] = status
        if limit is not None:
            params["limit"] = str(limit)
        if before is not None:
            params["before"] = before
        response = yield from self.http.request("GET", "/v1/sessions", params=params)
        value = json_of(response)
        if not isinstance(value, list):
            raise ProtocolError("the server sent a session list that is not a JSON array")
        sessions = [Session.from_json(item) for item in value]
        return SessionPage(sessions, response.headers.get(NEXT_PAGE_HEADER) or None)

    def pages(self, status: str | None, page_size: int) -> Pages:
        """Every session, page after page: ``Pages.next`` gives each page's sessions."""
        return Pages(self, status, page_size)

    def end_session(self, session_id: str) -> Flow[None]:
        yield from self.http.request("DELETE", session_path(session_id), expect=204)

    # -- turn records ------------------------------------------------------------------

    def detach(
        self,
        session_id: str,
        text: str,
        multitask: Multitask | None = None,
        webhook: str | None = None,
    ) -> Flow[Turn]:
        body: dict[str, Any] = {"input": text, "detach": True}
        if multitask is not None:
            body["multitask"] = multitask
        if webhook is not None:
            body["webhook"] = webhook
        response = yield from self.http.request(
            "POST",
            session_path(session_id) + "/turns",
            json=body,
            expect=202,
            keyed=True,
        )
        return Turn.from_json(json_of(response))

    def list_turns(self, session_id: str) -> Flow[list[Turn]]:
        response = yield from self.http.request("GET", session_path(session_id) + "/turns")
        value = json_of(response)
        if not isinstance(value, list):
            raise ProtocolError("the server sent a turn list that is not a JSON array")
        return [Turn.from_json(item) for item in value]

    def get_turn(self, session_id: str, turn_id: str) -> Flow[Turn]:
        path = session_path(session_id) + "/turns/" + quote(turn_id, safe="")
        response = yield from self.http.request("GET", path)
        return Turn.from_json(json_of(response))

    def cancel(self, session_id: str, turn_id: str | None = None) -> Flow[None]:
        turn = "current" if turn_id is None else quote(turn_id, safe="")
        path = session_path(session_id) + "/turns/" + turn
        yield from self.http.request("DELETE", path, expect=202)

    def approvals(self, session_id: str) -> Flow[list[Approval]]:
        response = yield from self.http.request("GET", session_path(session_id) + "/approvals")
        value = json_of(response)
        if not isinstance(value, list):
            raise ProtocolError("the server sent an approval list that is not a JSON array")
        return [Approval.from_json(item) for item in value]

    def decide(
        self,
        session_id: str,
        approval_id: str,
        decision: str,
        arguments: Mapping[str, Any] | None,
        message: str | None,
    ) -> Flow[Approval]:
        body: dict[str, Any] = {"decision": decision}
        if arguments is not None:
            body["arguments"] = dict(arguments)
        if message is not None:
            body["message"] = message
        path = session_path(session_id) + "/approvals/" + quote(approval_id, safe="")
        response = yield from self.http.request("POST", path, json=body)
        return Approval.from_json(json_of(response))

    def health(self) -> Flow[bool]:
        response = yield from self.http.request("GET", "/healthz", expect=None)
        return response.status_code == 200

    def ready(self) -> Flow[bool]:
        response = yield from self.http.request("GET", "/readyz", expect=None)
        if response.status_code in (200, 503):
            return response.status_code == 200
        raise errors.from_response(response.status_code, response.headers, response.content)

    def export(self, session_id: str, after: int, turn: str | None) -> Flow[list[Event]]:
        params = {"format": "json", "after": str(after)}
        if turn is not None:
            params["turn"] = turn
        path = session_path(session_id) + "/events"
        response = yield from self.http.request("GET", path, params=params)
        return parse_event_array(response.content.decode(errors="replace"))

    # -- streams -----------------------------------------------------------------------

    def open_turn(
        self,
        make: TurnMaker[R],
        session_id: str,
        text: str,
        transport: Transport,
        on_disconnect: OnDisconnect | None,
        multitask: Multitask | None = None,
    ) -> Flow[R]:
        """A turn started, its stream ready to read (over WebSocket, its first event in:
        an enqueued turn's is ``trioserve.queued``)."""
        options: dict[str, Any] = {}
        if on_disconnect is not None:
            options["onDisconnect"] = on_disconnect
        if multitask is not None:
            options["multitask"] = multitask
        if transport == "sse":
            body: dict[str, Any] = {"input": text, **options}
            path = session_path(session_id) + "/turns"
            request = self.http.build("POST", path, json=body, read_timeout=None, keyed=True)
            source = SSESource((yield from self.http.open_stream(request)))
            # With multitask the turn may wait behind another: a cancel names it.
            turn_id = source.body.response.headers.get(TURN_ID_HEADER) if multitask else None
            return make(session_id, source, self.cancel(session_id, turn_id))
        if transport == "websocket":
            message: dict[str, Any] = {
                "type": "turn",
                "input": text,
                "idempotencyKey": new_key(),
                **options,
            }
            channel = yield from self._send_turn(session_id, message)
            return make(session_id, channel, None)
        raise ValueError(f"transport must be 'sse' or 'websocket', got {transport!r}")

    def open_log(
        self,
        make: Callable[..., R],
        session_id: str,
        *,
        after: int,
        turn: str | None,
        follow: bool,
        reconnect: bool | Reconnect,
        transport: Transport,
    ) -> Flow[R]:
        """A ``LogReader`` (made by ``make``) with its first connection open."""
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise ValueError(f"after must be a non-negative integer seq, got {after!r}")
        if transport not in ("sse", "websocket"):
            raise ValueError(f"transport must be 'sse' or 'websocket', got {transport!r}")
        if follow and transport != "sse":
            raise ValueError("follow=True needs transport='sse'")
        policy = Reconnect() if reconnect is True else reconnect or None

        def opener(cursor: int, reconnecting: bool) -> Flow[LogConnection]:
            if transport == "websocket":
                channel = yield from self.open_websocket(session_id)
                try:
                    return (yield from WebSocketLog.start(channel, cursor, turn))
                except BaseException:
                    yield from channel.close()
                    raise
            path = session_path(session_id) + "/events"
            params = {"after": str(cursor)}
            if turn is not None:
                params["turn"] = turn
            if follow:
                params["follow"] = "true"
            # As an EventSource does when it reconnects (the header wins over ?after=).
            headers = {"Last-Event-ID": str(cursor)} if reconnecting else {}
            read_timeout = policy.read_timeout if policy is not None else None
            request = self.http.build(
                "GET", path, params=params, headers=headers, read_timeout=read_timeout
            )
            return SSESource((yield from self.http.open_stream(request)))

        def session_ended() -> Flow[bool]:
            return (yield from self.get_session(session_id)).terminal

        reader = make(
            session_id,
            transport,
            after=after,
            turn=turn,
            follow=follow,
            reconnect=policy,
            opener=opener,
            session_ended=session_ended,
        )
        assert isinstance(reader, LogReader)
        yield from reader.open()
        return reader

    def websocket_url(self, session_id: str) -> str:
        return str(websocket_url(self.http.url, session_path(session_id) + "/ws"))

    def _send_turn(self, session_id: str, message: dict[str, Any]) -> Flow[WSChannel]:
        """A WebSocket turn sent, its first message in.

        A connection lost before that (no close frame: the turn may have
        started, or not) is sent again on a new connection, as ``HTTP.send``
        does a lost request: the same ``idempotencyKey``, so a server that
        started it re-attaches this client to it from its first event.
        """
        attempt = 0
        while True:
            attempt += 1
            channel = yield from self.open_websocket(session_id)
            try:
                yield from channel.request(message)
                return channel
            except StreamInterrupted as exc:
                yield from channel.close()
                delay = self.http.retry.delay(attempt, None)
                if delay is None or exc.close_code not in (None, CLOSE_LOST):
                    raise
                yield from sleep(delay)
            except BaseException:
                yield from channel.close()
                raise

    def open_websocket(self, session_id: str) -> Flow[WSChannel]:
        """A WebSocket to the session, sent again (as ``HTTP.send``) if it may help."""
        url = websocket_url(self.http.url, session_path(session_id) + "/ws")
        attempt = 0
        while True:
            attempt += 1
            try:
                ws = yield from WebSocket.connect(
                    url,
                    self.http.headers,
                    timeout=self.http.timeout,
                    max_message=self.ws_max_message,
                )
                return WSChannel(ws)
            except (ConnectError, APIError) as exc:
                retry_after = exc.retry_after if isinstance(exc, APIError) else None
                if isinstance(exc, APIError) and exc.code not in RETRY_STATUSES:
                    raise
                delay = self.http.retry.delay(attempt, retry_after)
                if delay is None:
                    raise
                yield from sleep(delay)


class Pages:
    """``GET /v1/sessions`` page after page, each from the last one's ``next_page``.

    Pages are keyset pages: a session appears once, even if sessions are
    created meanwhile (those come before the first page, and are not
    seen); one whose activity changes meanwhile may be seen twice or not at
    all.  Nothing is held between pages.
    """

    def __init__(self, calls: Calls, status: str | None, page_size: int) -> None:
        self._calls = calls
        self._status = status
        self._page_size = page_size
        self._before: str | None = None
        self._done = False

    def next(self) -> Flow[list[Session] | None]:
        """The next page's sessions; ``None`` after the last page."""
        if self._done:
            return None
        page = yield from self._calls.sessions_page(self._status, self._page_size, self._before)
        self._before = page.next_page
        self._done = page.next_page is None
        return page.sessions


def session_path(session_id: str) -> str:
    return "/v1/sessions/" + quote(session_id, safe="")
