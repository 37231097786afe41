"""``SyncDriver``: runs flows with blocking calls, and no event loop at all.

HTTP goes through one pooled ``httpx.Client`` (thread-safe: threads share
the pool, each request takes its own connection), WebSocket connections
over plain sockets (``ssl`` for ``wss://``).  Nothing runs in the
background: a call blocks the thread that made it, and only that thread.
So the driver works in any thread, beside an event loop running in another
one, or inside a callback of a running loop (as in Jupyter, where a
hidden ``asyncio.run`` would fail).

Ctrl-C: a blocking read or sleep in the main thread is interrupted by
``KeyboardInterrupt``, which the flow sees like a cancellation (a turn's
block then cancels the turn on the server; ``TurnReader.leave``).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from collections.abc import Iterator
from typing import Any, cast

import httpx

from trioserve.client import effects as fx
from trioserve.client.errors import TrioserveClientError


class SyncDriver:
    """Runs flows (``effects.py``) with a pooled httpx client and blocking sockets."""

    def __init__(self, pool: httpx.Limits) -> None:
        self.http = httpx.Client(limits=pool)

    def run(self, flow: fx.Flow[fx.T]) -> fx.T:
        """Run ``flow`` to its end: its result, or what it raised."""
        stepper = fx.Stepper(flow)
        while (effect := stepper.next()) is not None:
            try:
                stepper.result = self._perform(effect)
            except BaseException as exc:  # thrown into the flow: it decides
                stepper.error = exc
        return stepper.value

    def cleanup(self, flow: fx.Flow[None]) -> None:
        """Run a closing flow for a block left by an exception, which it must not replace."""
        with contextlib.suppress(TrioserveClientError):
            self.run(flow)

    def _perform(self, effect: fx.Effect) -> Any:
        match effect:
            case fx.NextChunk(body):
                return next(cast(Iterator[bytes], body.chunks), b"")
            case fx.Receive(sock, timeout):
                raw = cast(socket.socket, sock)
                raw.settimeout(timeout)
                return raw.recv(fx.RECEIVE_SIZE)
            case fx.Send(request):
                response = self.http.send(request, stream=True)
                return fx.Body(response, response.iter_bytes())
            case fx.ReadBody(body):
                return body.response.read()
            case fx.CloseResponse(body):
                body.response.close()
                return None
            case fx.Write(sock, data, timeout):
                raw = cast(socket.socket, sock)
                raw.settimeout(timeout)
                raw.sendall(data)
                return None
            case fx.Connect(host, port, tls, timeout):
                return _connect(host, port, tls, timeout)
            case fx.CloseSocket(sock):
                cast(socket.socket, sock).close()
                return None
            case fx.Now():
                return time.monotonic()
            case fx.SleepUntil(deadline):
                time.sleep(max(0.0, deadline - time.monotonic()))
                return None
        raise AssertionError(f"unknown effect {effect!r}")


def _connect(host: str, port: int, tls: bool, timeout: float | None) -> socket.socket:
    raw = socket.create_connection((host, port), timeout=timeout)
    try:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls:
            return ssl.create_default_context().wrap_socket(raw, server_hostname=host)
    except BaseException:
        raw.close()
        raise
    return raw
