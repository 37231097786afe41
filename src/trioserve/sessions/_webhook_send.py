"""One webhook attempt: the signed POST, over an HTTP client that goes only where the
policy allows.

Signing is the Standard Webhooks format, by its maintained library
(``standardwebhooks``): ``webhook-id`` (the delivery's id, the same on
every attempt), ``webhook-timestamp`` (Unix seconds of this attempt) and
``webhook-signature`` (``v1,`` + base64 of HMAC-SHA256 of
``{id}.{timestamp}.{body}`` under the ``whsec_`` secret).

The client (``open_client``): httpx on Trio, no redirect followed, no proxy
from the environment, a connect timeout and a deadline on the whole
attempt (``send``), at most ``MAX_RESPONSE_BYTES`` of the answer read.
Its connections are made by ``_Vetting``, a network backend that resolves
the host itself, checks every address (``WebhookPolicy.addresses``) and
connects to the address it checked: TLS still verifies the URL's name.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

import httpcore
import httpx
import trio
from standardwebhooks import Webhook

from trioserve.sessions._webhook_urls import WebhookPolicy, WebhookRefused

__all__ = ["MAX_RESPONSE_BYTES", "Attempt", "open_client", "send"]

#: How much of a receiver's answer is read (kept for the log line), at most.
MAX_RESPONSE_BYTES: Final = 4096
_USER_AGENT: Final = "trioserve-webhooks/1"


@dataclass(frozen=True, slots=True)
class Attempt:
    """How one attempt went: ``status`` (``None``: no answer) and what to log."""

    status: int | None
    detail: str
    seconds: float

    @property
    def delivered(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


class _Vetting(httpcore.AsyncNetworkBackend):
    """Connects only to addresses the policy allows, the ones it checked."""

    def __init__(self, policy: WebhookPolicy) -> None:
        self._policy = policy
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's signature)
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            addresses = await self._policy.addresses(host, port)
        except WebhookRefused as exc:
            raise httpcore.ConnectError(str(exc)) from None
        failure: Exception = httpcore.ConnectError(f"no address of {host!r} answered")
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's signature)
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("webhooks are not sent over Unix sockets")

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)


def open_client(policy: WebhookPolicy, connect_timeout: float, timeout: float) -> httpx.AsyncClient:
    """The webhooks' HTTP client (close it with ``aclose``)."""
    transport = httpx.AsyncHTTPTransport(retries=0)
    # The transport's pool, made again with the vetting backend (httpx takes none itself).
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=httpx.create_ssl_context(),
        max_connections=32,
        keepalive_expiry=30.0,
        network_backend=_Vetting(policy),
    )
    return httpx.AsyncClient(
        transport=transport,
        follow_redirects=False,
        trust_env=False,
        timeout=httpx.Timeout(timeout, connect=connect_timeout),
        headers={"user-agent": _USER_AGENT},
    )


async def send(
    client: httpx.AsyncClient,
    signer: Webhook,
    url: str,
    delivery_id: str,
    body: bytes,
    deadline: float,
) -> Attempt:
    """POST ``body`` to ``url``, signed, within ``deadline`` seconds in all."""
    now = datetime.now(UTC)
    stamp = str(int(now.timestamp()))
    headers = {
        "content-type": "application/json",
        "webhook-id": delivery_id,
        "webhook-timestamp": stamp,
        "webhook-signature": signer.sign(
            delivery_id, datetime.fromtimestamp(int(stamp), UTC), body
        ),
    }
    started = time.monotonic()
    with trio.move_on_after(deadline) as scope:
        try:
            async with client.stream("POST", url, content=body, headers=headers) as response:
                kept = bytearray()
                async for chunk in response.aiter_raw():
                    kept += chunk[: MAX_RESPONSE_BYTES - len(kept)]
                    if len(kept) >= MAX_RESPONSE_BYTES:
                        break  # the rest is not read: the connection is closed
                text = kept.decode("utf-8", "replace").strip().replace("\n", " ")[:200]
                detail = f"HTTP {response.status_code}" + (f": {text}" if text else "")
                return Attempt(response.status_code, detail, time.monotonic() - started)
        except (httpx.HTTPError, httpx.StreamError, httpx.InvalidURL, OSError) as exc:
            reason = str(exc) or type(exc).__name__
            return Attempt(None, f"{type(exc).__name__}: {reason}", time.monotonic() - started)
    assert scope.cancelled_caught
    return Attempt(None, f"no answer within {deadline:g} s", time.monotonic() - started)
