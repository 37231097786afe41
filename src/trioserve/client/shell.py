"""What ``Client`` and ``SyncClient`` share: their arguments, their calls, their blocks.

A shell is ``Calls`` (the API as flows) and a driver that runs them.  The
two clients differ only in the driver (``AsyncDriver`` on anyio,
``SyncDriver`` on blocking sockets) and in whether their methods are
awaited; everything they are given and everything they keep is here.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Generic, Protocol, TypeVar, cast

import httpx

from trioserve.client.calls import Calls
from trioserve.client.effects import Flow
from trioserve.client.http import HTTP, POOL_EXPIRY, POOL_SIZE, Retry
from trioserve.client.log import Reconnect
from trioserve.client.turns import Transport
from trioserve.client.websocket import WS_MAX_MESSAGE
from trioserve.protocol import Multitask, OnDisconnect

D = TypeVar("D")
TB = TypeVar("TB")
LB = TypeVar("LB")


class Leaves(Protocol):
    """A stream a block closes: ``leave(exc)`` is what leaving the block does."""

    def leave(self, exc: BaseException | None) -> Flow[None]: ...


S = TypeVar("S", bound=Leaves)


class Shell(Generic[D, TB, LB]):
    """A client of the server at ``base_url``, running its calls with a driver ``D``.

    ``base_url`` is ``http://HOST[:PORT]`` or ``https://…``, optionally with
    a path prefix (``ValueError`` otherwise).  ``timeout`` (seconds,
    ``None`` for none) bounds each network operation of a request:
    connecting, sending, waiting for bytes; a turn's stream has no read
    timeout.  ``api_key`` is sent as ``Authorization: Bearer KEY`` on
    every request and WebSocket handshake.  ``ws_max_message`` is the
    largest WebSocket message accepted.  ``retry`` says how a request that
    may not have reached the server is sent again (``http.Retry``).
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float | None = 30.0,
        ws_max_message: int = WS_MAX_MESSAGE,
        api_key: str | None = None,
        retry: Retry = Retry(),
    ) -> None:
        http = HTTP(base_url, timeout=timeout, api_key=api_key, retry=retry)
        self._calls = Calls(http, ws_max_message=ws_max_message)
        #: The base URL, without a trailing slash.
        self.base_url = http.base_url
        pool = httpx.Limits(max_keepalive_connections=POOL_SIZE, keepalive_expiry=POOL_EXPIRY)
        self._driver = self._driver_class(pool)

    #: Each shell's driver, its turn and log stream classes, and its block class.
    _driver_class: Callable[[httpx.Limits], D]
    _stream_classes: tuple[Callable[..., Any], Callable[..., Any]]
    _block_class: Callable[[D, Flow[Any]], Any]

    def turn(
        self,
        session_id: str,
        input: str = "",
        *,
        transport: Transport = "sse",
        on_disconnect: OnDisconnect | None = None,
        multitask: Multitask | None = None,
    ) -> TB:
        """Run one turn in a block: ``async with``/``async for`` (``Client``), ``with``/``for``.

        ``async with client.turn(sid, "hi") as events: async for event in
        events: …`` (``SyncClient``: ``with``, ``for``).

        ``transport`` is ``"sse"`` (``POST /v1/sessions/{id}/turns``) or
        ``"websocket"`` (a connection to ``/v1/sessions/{id}/ws`` for this
        turn).  An empty ``input`` runs the session's own task.
        ``on_disconnect`` says what the turn does if this client leaves
        before its end: ``"cancel"`` (stop it), ``"continue"`` (run on,
        its events logged for ``events()``), ``None`` (the server's
        ``--on-disconnect``, itself ``cancel`` by default).  ``multitask``
        says what the turn does if the session is busy: ``"reject"`` (409,
        ``SessionBusyError``), ``"enqueue"`` (it waits its turn: the first
        event is ``trioserve.queued``, with ``data["position"]``, then the
        turn's own), ``"interrupt"`` (the running turn is cancelled), ``None``
        (the server's ``--multitask``, itself ``reject``); Ctrl-C while it
        waits takes it out of the queue.

        A refusal raises on entering the block, before any event: 400, 404
        (unknown or terminal session), 409 (a turn is in flight), 429
        (turn cap), 503 (draining), as ``APIError`` subclasses; an
        unreachable server raises ``ConnectError``.  Over WebSocket, entering
        waits for the turn's first event.  The stream's ``turn_id``,
        ``status`` and ``reason``: see ``TurnReader``.  See the class doc
        for what leaving the block guarantees.
        """
        make = partial(self._stream_classes[0], self._driver)
        opening = self._calls.open_turn(
            make, session_id, input, transport, on_disconnect, multitask
        )
        return cast(TB, self._block_class(self._driver, opening))

    def events(
        self,
        session_id: str,
        *,
        after: int = 0,
        turn: str | None = None,
        follow: bool = False,
        reconnect: bool | Reconnect = True,
        transport: Transport = "sse",
    ) -> LB:
        """Read the session's event log in a block: ``async with client.events(sid) as events:``.

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
        ``LogReader`` and ``Reconnect``.

        ``transport="sse"`` reads ``GET /v1/sessions/{id}/events``;
        ``"websocket"`` sends ``{"type":"resume"}`` on a connection to
        ``/v1/sessions/{id}/ws`` (the server refuses a WebSocket for an
        ended session: use SSE to read its log).

        Refusals raise on entering the block: ``NotFoundError`` (unknown
        session or turn), ``BadRequestError`` (a cursor past the end of the
        log), ``CursorExpiredError`` (retention dropped events after the
        cursor; its ``earliest_seq`` is the first one kept), ``ConnectError``.
        The first connection gets the client's ``retry``, not ``reconnect``.
        """
        opening = self._calls.open_log(
            partial(self._stream_classes[1], self._driver),
            session_id,
            after=after,
            turn=turn,
            follow=follow,
            reconnect=reconnect,
            transport=transport,
        )
        return cast(LB, self._block_class(self._driver, opening))

    def websocket_url(self, session_id: str) -> str:
        """``ws://…/v1/sessions/{id}/ws`` (``wss://`` for an https base URL)."""
        return self._calls.websocket_url(session_id)


class Block(Generic[D, S]):
    """The block of ``turn()`` or ``events()``: entering opens the stream, leaving closes it.

    The shells add ``__aenter__``/``__aexit__`` or ``__enter__``/``__exit__``:
    entering runs ``opening``; leaving runs ``leaving(exc)`` (the stream's
    ``leave``) as it is when the block ended normally, and shielded from
    cancellation, within a deadline, when it ended with ``exc``.
    """

    def __init__(self, driver: D, opening: Flow[S]) -> None:
        self._driver = driver
        self._opening: Flow[S] = opening
        self._stream: S | None = None

    def _opened(self, stream: S) -> S:
        self._stream = stream
        return stream

    def leaving(self, exc: BaseException | None) -> Flow[None]:
        assert self._stream is not None, "the block was not entered"
        return self._stream.leave(exc)
