"""What the client's wire logic asks of the I/O layer: effects, yielded by flows.

The wire logic -- building requests, sending them again when that is safe,
mapping refusals to exceptions, parsing SSE, speaking WebSocket, re-opening
a cut log stream -- is written once, as *flows*: generators that yield an
effect each time they need the outside world and get its result back, the
way ``httpx.Auth.auth_flow`` yields a request and receives the response.
A flow does no I/O and never blocks; it knows no event loop.

Two drivers run flows: ``aio.AsyncDriver`` (``Client``, on anyio, so under
asyncio and Trio alike) and ``blocking.SyncDriver`` (``SyncClient``, plain
sockets, no event loop).  Each performs an effect and sends its result into
the flow, or throws what performing it raised: httpx's exceptions as they
are; for raw sockets ``OSError`` (``TimeoutError`` for a timeout); a
cancellation (``trio.Cancelled``, ``asyncio.CancelledError``) or
``KeyboardInterrupt`` as it is.  So every decision about an error is the
flow's, and the same in both clients.

Closing (``CloseResponse``, ``CloseSocket``) never fails and is not
cancelled: the async driver shields it, so a stream left by a cancellation
still closes its socket.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Final, Generic, Protocol, TypeVar

import httpx

T = TypeVar("T")
#: The most bytes one ``Receive`` asks for.
RECEIVE_SIZE: Final = 65536

#: A flow: yields ``Effect`` objects, receives each one's result, returns a ``T``.
Flow = Generator["Effect", Any, T]


@dataclass(frozen=True, slots=True)
class Body:
    """A response whose head has arrived; the driver reads its body on request.

    ``chunks`` is the driver's iterator over the body (``aiter_bytes()`` or
    ``iter_bytes()``), opaque to flows.
    """

    response: httpx.Response
    chunks: Any


class Socket(Protocol):
    """A connected byte stream (TCP, or TLS over TCP); opaque to flows."""


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``request``; result: a ``Body`` once the response's head has arrived.

    Anything raised here happened before the response's head arrived (the
    retry rules in ``http.py`` rely on that).
    """

    request: httpx.Request


@dataclass(frozen=True, slots=True)
class ReadBody:
    """Read the rest of the body; result: ``bytes``."""

    body: Body


@dataclass(frozen=True, slots=True)
class NextChunk:
    """The next bytes of the body; result: ``bytes``, ``b""`` at its end."""

    body: Body


@dataclass(frozen=True, slots=True)
class CloseResponse:
    """Close the response (its connection goes back to the pool only if it was read whole)."""

    body: Body


@dataclass(frozen=True, slots=True)
class Connect:
    """Open a TCP connection (TLS if ``tls``) within ``timeout``; result: a ``Socket``."""

    host: str
    port: int
    tls: bool
    timeout: float | None


@dataclass(frozen=True, slots=True)
class Write:
    """Send all of ``data`` within ``timeout``."""

    socket: Socket
    data: bytes
    timeout: float | None


@dataclass(frozen=True, slots=True)
class Receive:
    """Receive some bytes within ``timeout``; result: ``bytes``, ``b""`` at EOF."""

    socket: Socket
    timeout: float | None


@dataclass(frozen=True, slots=True)
class CloseSocket:
    """Close the socket at once."""

    socket: Socket


@dataclass(frozen=True, slots=True)
class Now:
    """Result: the driver's clock (seconds, monotonic)."""


@dataclass(frozen=True, slots=True)
class SleepUntil:
    """Wait until the driver's clock reads ``deadline``."""

    deadline: float


Effect = (Send | ReadBody | NextChunk | CloseResponse | Connect | Write | Receive | CloseSocket) | (
    Now | SleepUntil
)


class Stepper(Generic[T]):
    """A flow being run by a driver, one effect at a time::

    stepper = Stepper(flow)
    while (effect := stepper.next()) is not None:
        try:
            stepper.result = perform(effect)  # or await it
        except BaseException as exc:  # a cancellation too: the flow decides
            stepper.error = exc
    return stepper.value
    """

    def __init__(self, flow: Flow[T]) -> None:
        self._flow = flow
        #: What performing the last effect returned, sent into the flow next.
        self.result: Any = None
        #: What performing it raised instead, thrown into the flow next.
        self.error: BaseException | None = None
        #: What the flow returned, once ``next`` returned ``None``.
        self.value: T

    def next(self) -> Effect | None:
        """The flow's next effect; ``None`` once it returned.  What it raises goes on."""
        error, self.error = self.error, None
        result, self.result = self.result, None
        try:
            return self._flow.send(result) if error is None else self._flow.throw(error)
        except StopIteration as stop:
            self.value = stop.value
            return None


def sleep(seconds: float) -> Flow[None]:
    now: float = yield Now()
    yield SleepUntil(now + seconds)
