"""``AsyncDriver``: runs flows on anyio, so under asyncio and Trio alike.

HTTP goes through one pooled ``httpx.AsyncClient`` (httpx runs on anyio),
WebSocket connections over ``anyio.connect_tcp`` streams.  No task is
started: every effect is awaited in the task that runs the flow, so a
cancellation (a cancel scope, ``asyncio.timeout``, a task's ``cancel()``)
lands in that flow as an exception at the effect it was waiting on.
Closing is shielded: a flow cancelled half-way still closes its socket or
response.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import Any, cast

import anyio
import anyio.abc
import httpx

from trioserve.client import effects as fx
from trioserve.client.errors import TrioserveClientError
from trioserve.client.websocket import WS_CLOSE_TIMEOUT


class AsyncDriver:
    """Runs flows (``effects.py``) with a pooled httpx client and anyio sockets."""

    def __init__(self, pool: httpx.Limits) -> None:
        self.http = httpx.AsyncClient(limits=pool)

    async def run(self, flow: fx.Flow[fx.T]) -> fx.T:
        """Run ``flow`` to its end: its result, or what it raised."""
        stepper = fx.Stepper(flow)
        while (effect := stepper.next()) is not None:
            try:
                stepper.result = await self._perform(effect)
            except BaseException as exc:  # thrown into the flow: it decides
                stepper.error = exc
        return stepper.value

    async def cleanup(self, flow: fx.Flow[None]) -> None:
        """Run a closing flow shielded, for at most ``WS_CLOSE_TIMEOUT`` seconds.

        For a block left by an exception (a cancellation included): the
        stream is closed before the exception goes on, and a failure to close
        it gracefully does not replace that exception.
        """
        with anyio.CancelScope(shield=True, deadline=anyio.current_time() + WS_CLOSE_TIMEOUT):
            with contextlib.suppress(TrioserveClientError):
                await self.run(flow)

    async def _perform(self, effect: fx.Effect) -> Any:
        match effect:
            case fx.NextChunk(body):
                chunks = cast(AsyncGenerator[bytes], body.chunks)
                return await anext(chunks, b"")
            case fx.Receive(socket, timeout):
                stream = cast(anyio.abc.ByteStream, socket)
                with anyio.fail_after(timeout):
                    try:
                        return await stream.receive(fx.RECEIVE_SIZE)
                    except anyio.EndOfStream:
                        return b""
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                        raise ConnectionResetError(str(exc) or type(exc).__name__) from exc
            case fx.Send(request):
                response = await self.http.send(request, stream=True)
                return fx.Body(response, response.aiter_bytes())
            case fx.ReadBody(body):
                return await body.response.aread()
            case fx.CloseResponse(body):
                with anyio.CancelScope(shield=True):
                    try:
                        await cast(AsyncGenerator[bytes], body.chunks).aclose()
                    finally:
                        await body.response.aclose()
                return None
            case fx.Write(socket, data, timeout):
                stream = cast(anyio.abc.ByteStream, socket)
                with anyio.fail_after(timeout):
                    try:
                        await stream.send(data)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                        raise ConnectionResetError(str(exc) or type(exc).__name__) from exc
                return None
            case fx.Connect(host, port, tls, timeout):
                with anyio.fail_after(timeout):
                    if tls:
                        return await anyio.connect_tcp(host, port, tls=True)
                    return await anyio.connect_tcp(host, port)
            case fx.CloseSocket(socket):
                await anyio.aclose_forcefully(cast(anyio.abc.ByteStream, socket))
                return None
            case fx.Now():
                return anyio.current_time()
            case fx.SleepUntil(deadline):
                await anyio.sleep_until(deadline)
                return None
        raise AssertionError(f"unknown effect {effect!r}")
