"""``Client``: the HTTP endpoints and turns over SSE or WebSocket."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from types import TracebackType
from typing import Any, Final
from urllib.parse import quote

import httpx
import trio
from trio_websocket import (
    ConnectionRejected,
    ConnectionTimeout,
    DisconnectionTimeout,
    HandshakeError,
    open_websocket_url,
)

from . import errors
from .errors import ConnectError, ProtocolError, RequestTimeout, TransportError
from .models import Session
from .turns import SSETurn, Transport, TurnStream, WebSocketTurn

#: Largest WebSocket message accepted from the server (an event can be up to
#: the server's ``--max-event-bytes``, 8 MiB by default).
WS_MAX_MESSAGE: Final = 64 * 1024 * 1024
_WS_CLOSE_TIMEOUT: Final = 5.0


class Client:
    """A trioserve client: ``async with Client("http://127.0.0.1:8080") as client:``.

    ``timeout`` (seconds, ``None`` for none) bounds each network operation
    of a request: connecting, sending, waiting for bytes.  A turn's stream
    has no read timeout (a turn may run for minutes, quietly); bound it with
    ``trio.fail_after`` / ``trio.move_on_after`` around the block.

    Guarantees under cancellation (every method is a plain Trio wait):

    - A cancelled request is abandoned and its connection closed, never
      returned half-read to the pool.  The server may or may not have acted
      on it (a cancelled ``create_session`` may still have created one).
    - However the block of ``turn()`` is left (the turn's last event, a
      ``break``, an exception, a cancellation), its stream is closed before
      ``__aexit__`` returns; the socket is closed even if the exit itself is
      cancelled.  A turn still running is then cancelled by the server (its
      adapter gets SIGINT), exactly as for any client that disconnects
      (under the server's default ``--on-disconnect cancel``; with
      ``continue`` it runs on and its events stay in the session's log).
    - Once the turn's last event was received and the block is left
      normally, the server has freed the session and the turn slot: the next
      ``turn()`` is not refused as busy.  (Over SSE, leaving reads the stream
      to its end for this, which the server sends once the adapter has
      exited; one still running 1 s after its ``session.ended`` is stopped.)
    - The client starts no background task of its own.  A WebSocket turn
      runs trio-websocket's reader task in a nursery inside the ``turn()``
      block; it has ended when the block is left.  ``aclose`` closes the
      connection pool.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float | None = 30.0,
        ws_max_message: int = WS_MAX_MESSAGE,
    ) -> None:
        url = check_base_url(base_url)
        self.base_url = str(url).rstrip("/")
        self._url = url
        self._timeout = timeout
        self._ws_max_message = ws_max_message
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=httpx.Timeout(timeout))

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
        await self._http.aclose()

    # -- sessions ----------------------------------------------------------------

    async def create_session(self, inputs: Mapping[str, str] | None = None) -> Session:
        """``POST /v1/sessions``: a new active session; ``inputs`` fill ``${inputs.*}``."""
        body = {"inputs": dict(inputs)} if inputs else {}
        response = await self._request("POST", "/v1/sessions", json=body, expect=201)
        return Session.from_json(_json(response))

    async def get_session(self, session_id: str) -> Session:
        """``GET /v1/sessions/{id}``; ``NotFoundError`` if unknown."""
        response = await self._request("GET", _session_path(session_id))
        return Session.from_json(_json(response))

    async def list_sessions(
        self, status: str | None = None, limit: int | None = None
    ) -> list[Session]:
        """``GET /v1/sessions``, most recently active first.

        ``BadRequestError`` for an unknown ``status`` or a ``limit`` below 1.
        """
        params: dict[str, str] = {}
        if status is not None:
            params["status"] = status
        if limit is not None:
            params["limit"] = str(limit)
        response = await self._request("GET", "/v1/sessions", params=params)
        value = _json(response)
        if not isinstance(value, list):
            raise ProtocolError("the server sent a session list that is not a JSON array")
        return [Session.from_json(item) for item in value]

    async def end_session(self, session_id: str) -> None:
        """``DELETE /v1/sessions/{id}``: end it (and stop its running turn); idempotent."""
        await self._request("DELETE", _session_path(session_id), expect=204)

    async def cancel(self, session_id: str) -> None:
        """``DELETE /v1/sessions/{id}/turns/current``: cancel the running turn.

        Returns once the server has accepted (202); the turn's stream then
        ends with one ``session.ended`` whose reason is ``cancelled``.
        ``NotFoundError`` with ``reason == "no_turn"`` if nothing runs.
        """
        await self._request("DELETE", _session_path(session_id) + "/turns/current", expect=202)

    async def health(self) -> bool:
        """``GET /healthz``: True when the server answers 200."""
        response = await self._request("GET", "/healthz", expect=None)
        return response.status_code == 200

    async def ready(self) -> bool:
        """``GET /readyz``: True when ready, False while draining (503)."""
        response = await self._request("GET", "/readyz", expect=None)
        if response.status_code in (200, 503):
            return response.status_code == 200
        raise errors.from_response(response.status_code, response.headers, response.content)

    # -- turns -------------------------------------------------------------------

    @asynccontextmanager
    async def turn(
        self, session_id: str, input: str = "", *, transport: Transport = "sse"
    ) -> AsyncIterator[TurnStream]:
        """Run one turn: ``async with client.turn(sid, "hi") as events: async for e in events``.

        ``transport`` is ``"sse"`` (``POST /v1/sessions/{id}/turns``) or
        ``"websocket"`` (a connection to ``/v1/sessions/{id}/ws`` for this
        turn).  An empty ``input`` runs the session's own task.

        A refusal raises on entering the block, before any event: 400, 404
        (unknown or terminal session), 409 (a turn is in flight), 429
        (turn cap), 503 (draining), as ``APIError`` subclasses; an
        unreachable server raises ``ConnectError``.  Over WebSocket, entering
        waits for the turn's first event.  See the class doc for what
        leaving the block guarantees.
        """
        if transport == "sse":
            async with self._sse_turn(session_id, input) as stream:
                yield stream
        elif transport == "websocket":
            async with self._websocket_turn(session_id, input) as ws_stream:
                yield ws_stream
        else:
            raise ValueError(f"transport must be 'sse' or 'websocket', got {transport!r}")

    @asynccontextmanager
    async def _sse_turn(self, session_id: str, text: str) -> AsyncIterator[SSETurn]:
        path = _session_path(session_id) + "/turns"
        timeout = httpx.Timeout(self._timeout, read=None)
        async with AsyncExitStack() as stack:
            with self._translated(path):
                response = await stack.enter_async_context(
                    self._http.stream("POST", path, json={"input": text}, timeout=timeout)
                )
            if response.status_code != 200:
                body = b""
                with self._translated(path), trio.move_on_after(self._seconds):
                    body = await response.aread()
                raise errors.from_response(response.status_code, response.headers, body)
            content_type = response.headers.get("content-type", "")
            if not content_type.startswith("text/event-stream"):
                raise ProtocolError(f"expected an event stream, got {content_type or 'no type'}")
            stream = SSETurn(session_id, response)
            stack.push_async_callback(stream.aclose)
            yield stream
            await stream.read_to_end()

    @asynccontextmanager
    async def _websocket_turn(self, session_id: str, text: str) -> AsyncIterator[WebSocketTurn]:
        url = self.websocket_url(session_id)
        entered = False
        try:
            async with open_websocket_url(
                url,
                connect_timeout=self._seconds,
                disconnect_timeout=min(self._seconds, _WS_CLOSE_TIMEOUT),
                max_message_size=self._ws_max_message,
                receive_buffer_size=None,
            ) as ws:
                stream = WebSocketTurn(session_id, ws)
                await stream.start(text)
                entered = True
                yield stream
        except DisconnectionTimeout as exc:
            # The close handshake timed out; the socket is closed regardless.
            # Re-raise what the block raised, if anything.
            if exc.__context__ is not None:
                raise exc.__context__ from None
        except ConnectionRejected as exc:
            if entered:
                raise
            headers = {k.decode().lower(): v.decode(errors="replace") for k, v in exc.headers}
            raise errors.from_response(exc.status_code, headers, exc.body or b"") from None
        except ConnectionTimeout:
            if entered:
                raise
            raise RequestTimeout(f"timed out connecting to {url}") from None
        except HandshakeError as exc:
            if entered:
                raise
            raise ConnectError(f"cannot connect to {url}: {exc.__cause__ or exc}") from exc

    def websocket_url(self, session_id: str) -> str:
        """``ws://…/v1/sessions/{id}/ws`` (``wss://`` for an https base URL)."""
        scheme = "wss" if self._url.scheme == "https" else "ws"
        path = self._url.path.rstrip("/") + _session_path(session_id) + "/ws"
        return str(self._url.copy_with(scheme=scheme, path=path, query=None, fragment=None))

    # -- plumbing ----------------------------------------------------------------

    @property
    def _seconds(self) -> float:
        return math.inf if self._timeout is None else self._timeout

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        expect: int | None = 200,
    ) -> httpx.Response:
        with self._translated(path):
            response = await self._http.request(method, path, json=json, params=params)
        if expect is not None and response.status_code != expect:
            raise errors.from_response(response.status_code, response.headers, response.content)
        return response

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


def check_base_url(base_url: str) -> httpx.URL:
    """The parsed URL; ``ValueError`` unless it is ``http://HOST…`` or ``https://HOST…``."""
    try:
        url = httpx.URL(base_url)
    except httpx.InvalidURL as exc:
        raise ValueError(f"base URL {base_url!r} is not a URL: {exc}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"base URL must be http://HOST[:PORT] or https://…, got {base_url!r}")
    return url


def _session_path(session_id: str) -> str:
    return "/v1/sessions/" + quote(session_id, safe="")


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        raise ProtocolError(
            f"expected JSON from {response.request.url}, got {response.text[:100]!r}"
        ) from None
