"""``Connection``: one server's requests and streams, with the client's errors.

What ``Client`` (``core.py``) sends goes through here: the pooled
``httpx.AsyncClient`` with the API key and the timeouts, requests whose
answer must have one status, and the streams a turn or a log is read from
(SSE responses checked before they are read, WebSocket connections opened
with the same key and timeouts; the stream classes are in ``turns.py`` and
``log.py``).  httpx's and trio-websocket's exceptions come out as the
client's (``errors.py``).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import (
    AbstractAsyncContextManager,
    AsyncExitStack,
    asynccontextmanager,
    contextmanager,
)
from typing import Any, Final, NoReturn
from urllib.parse import quote

import httpx
import trio
from trio_websocket import (
    ConnectionRejected,
    ConnectionTimeout,
    DisconnectionTimeout,
    HandshakeError,
    WebSocketConnection,
    open_websocket_url,
)

from trioserve.client import errors
from trioserve.client.errors import ConnectError, ProtocolError, RequestTimeout, TransportError
from trioserve.client.log import WebSocketLog
from trioserve.client.turns import SSEReader, SSETurn, WebSocketTurn, WSReader
from trioserve.protocol import OnDisconnect

#: Largest WebSocket message accepted from the server (an event can be up to
#: the server's ``--max-event-bytes``, 8 MiB by default).
WS_MAX_MESSAGE: Final = 64 * 1024 * 1024
WS_CLOSE_TIMEOUT: Final = 5.0


class Connection:
    """The server at ``base_url``: see the module doc (and ``Client`` for the arguments)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float | None,
        ws_max_message: int,
        api_key: str | None,
    ) -> None:
        url = check_base_url(base_url)
        self.base_url = str(url).rstrip("/")
        self.url = url
        self.timeout = timeout
        self._ws_max_message = ws_max_message
        self._auth = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
        self.http = httpx.AsyncClient(
            base_url=self.base_url, timeout=httpx.Timeout(timeout), headers=self._auth
        )

    async def aclose(self) -> None:
        """Close every pooled connection.  Idempotent."""
        await self.http.aclose()

    @property
    def seconds(self) -> float:
        """The timeout, ``inf`` for none."""
        return math.inf if self.timeout is None else self.timeout

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        expect: int | None = 200,
    ) -> httpx.Response:
        """The answer; a status other than ``expect`` (``None``: any) raises its ``APIError``."""
        with self._translated(path):
            response = await self.http.request(method, path, json=json, params=params)
        if expect is not None and response.status_code != expect:
            raise errors.from_response(response.status_code, response.headers, response.content)
        return response

    async def _check_event_stream(self, response: httpx.Response, path: str) -> None:
        """Raise the refusal a non-200 answer holds, or ``ProtocolError`` if it is no stream."""
        if response.status_code != 200:
            body = b""
            with self._translated(path), trio.move_on_after(self.seconds):
                body = await response.aread()
            raise errors.from_response(response.status_code, response.headers, body)
        content_type = response.headers.get("content-type", "")
        if not content_type.startswith("text/event-stream"):
            raise ProtocolError(f"expected an event stream, got {content_type or 'no type'}")

    @contextmanager
    def _translated(self, path: str) -> Iterator[None]:
        """httpx's exceptions as the client's."""
        url = self.base_url + path
        try:
            yield
        except httpx.TimeoutException as exc:
            raise RequestTimeout(f"{url}: timed out ({type(exc).__name__})") from exc
        except httpx.ConnectError as exc:
            raise ConnectError(f"cannot connect to {self.base_url}: {exc}") from exc
        except httpx.HTTPError as exc:
            raise TransportError(f"{url}: {exc or type(exc).__name__}") from exc

    def websocket_url(self, session_id: str) -> str:
        """``ws://…/v1/sessions/{id}/ws`` (``wss://`` for an https base URL)."""
        scheme = "wss" if self.url.scheme == "https" else "ws"
        path = self.url.path.rstrip("/") + session_path(session_id) + "/ws"
        return str(self.url.copy_with(scheme=scheme, path=path, query=None, fragment=None))

    def _open_websocket(self, url: str) -> AbstractAsyncContextManager[WebSocketConnection]:
        """``open_websocket_url`` with this client's timeouts and message size."""
        return open_websocket_url(
            url,
            connect_timeout=self.seconds,
            disconnect_timeout=min(self.seconds, WS_CLOSE_TIMEOUT),
            max_message_size=self._ws_max_message,
            receive_buffer_size=None,
            extra_headers=[(k.encode(), v.encode()) for k, v in self._auth.items()],
        )

    async def _hold_websocket(
        self,
        url: str,
        *,
        task_status: trio.TaskStatus[tuple[WebSocketConnection, trio.Event]],
    ) -> None:
        """Open a WebSocket, hand it over, and keep it open until ``done`` is set.

        Errors before the hand-over raise from ``nursery.start``; after it,
        nothing escapes (a failed close handshake still closes the socket),
        so the nursery holding this task never fails because of it.
        """
        done = trio.Event()
        started = False
        try:
            async with self._open_websocket(url) as ws:
                started = True
                task_status.started((ws, done))
                await done.wait()
        except Exception:
            if not started:
                raise

    @asynccontextmanager
    async def sse_turn(
        self, session_id: str, text: str, on_disconnect: OnDisconnect | None
    ) -> AsyncIterator[SSETurn]:
        """``POST /v1/sessions/{id}/turns``'s stream; leaving reads it to its end."""
        path = session_path(session_id) + "/turns"
        timeout = httpx.Timeout(self.timeout, read=None)
        body: dict[str, Any] = {"input": text}
        if on_disconnect is not None:
            body["onDisconnect"] = on_disconnect
        async with AsyncExitStack() as stack:
            with self._translated(path):
                response = await stack.enter_async_context(
                    self.http.stream("POST", path, json=body, timeout=timeout)
                )
            await self._check_event_stream(response, path)
            stream = SSETurn(session_id, response)
            stack.push_async_callback(stream.aclose)
            yield stream
            await stream.read_to_end()

    @asynccontextmanager
    async def websocket_turn(
        self, session_id: str, text: str, on_disconnect: OnDisconnect | None
    ) -> AsyncIterator[WebSocketTurn]:
        """A WebSocket turn, its first event received; leaving reads on to its end."""
        url = self.websocket_url(session_id)
        entered = False
        try:
            async with self._open_websocket(url) as ws:
                stream = WebSocketTurn(session_id, ws)
                await stream.start(text, on_disconnect)
                entered = True
                yield stream
                with trio.move_on_after(min(self.seconds, WS_CLOSE_TIMEOUT)):
                    await stream.read_to_end()
        except DisconnectionTimeout as exc:
            # The close handshake timed out; the socket is closed regardless.
            # Re-raise what the block raised, if anything.
            if exc.__context__ is not None:
                raise exc.__context__ from None
        except HandshakeError as exc:
            if entered:
                raise
            raise_handshake_error(exc, url)

    async def open_log_sse(
        self,
        session_id: str,
        cursor: int,
        reconnecting: bool,
        turn: str | None,
        follow: bool,
        read_timeout: float | None,
    ) -> SSEReader:
        """``GET /v1/sessions/{id}/events`` from ``cursor``, checked and ready to read."""
        path = session_path(session_id) + "/events"
        params = {"after": str(cursor)}
        if turn is not None:
            params["turn"] = turn
        if follow:
            params["follow"] = "true"
        # As an EventSource does when it reconnects (the header wins over ?after=).
        headers = {"Last-Event-ID": str(cursor)} if reconnecting else {}
        request = self.http.build_request(
            "GET",
            path,
            params=params,
            headers=headers,
            timeout=httpx.Timeout(self.timeout, read=read_timeout),
        )
        with self._translated(path):
            response = await self.http.send(request, stream=True)
        try:
            await self._check_event_stream(response, path)
        except BaseException:
            await response.aclose()
            raise
        return SSEReader(response)

    async def open_log_websocket(
        self, nursery: trio.Nursery, session_id: str, cursor: int, turn: str | None
    ) -> WebSocketLog:
        """A WebSocket resumed at ``cursor``, held open by a task in ``nursery``."""
        url = self.websocket_url(session_id)
        try:
            ws, done = await nursery.start(self._hold_websocket, url)
        except HandshakeError as exc:
            raise_handshake_error(exc, url)
        log = WebSocketLog(WSReader(ws), done)
        try:
            await log.start(cursor, turn)
        except BaseException:
            done.set()
            raise
        return log


def raise_handshake_error(exc: HandshakeError, url: str) -> NoReturn:
    """A failed WebSocket handshake as the client's error: the server's refusal, or why not."""
    if isinstance(exc, ConnectionRejected):
        headers = {k.decode().lower(): v.decode(errors="replace") for k, v in exc.headers}
        raise errors.from_response(exc.status_code, headers, exc.body or b"") from None
    if isinstance(exc, ConnectionTimeout):
        raise RequestTimeout(f"timed out connecting to {url}") from None
    raise ConnectError(f"cannot connect to {url}: {exc.__cause__ or exc}") from exc


def check_base_url(base_url: str) -> httpx.URL:
    """The parsed URL; ``ValueError`` unless it is ``http://HOST…`` or ``https://HOST…``."""
    try:
        url = httpx.URL(base_url)
    except httpx.InvalidURL as exc:
        raise ValueError(f"base URL {base_url!r} is not a URL: {exc}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"base URL must be http://HOST[:PORT] or https://…, got {base_url!r}")
    return url


def session_path(session_id: str) -> str:
    return "/v1/sessions/" + quote(session_id, safe="")


def json_of(response: httpx.Response) -> Any:
    """The answer's JSON; ``ProtocolError`` if it is not JSON."""
    try:
        return response.json()
    except ValueError:
        raise ProtocolError(
            f"expected JSON from {response.request.url}, got {response.text[:100]!r}"
        ) from None
