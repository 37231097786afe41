"""HTTP as flows: requests built, sent (again when that is safe), checked, mapped to errors.

``HTTP`` holds what every request of one client shares: the base URL, the
API key, the timeout and the ``Retry`` policy.  Its flows (``request``,
``open_stream``) yield ``effects.Send`` and friends; ``errors_of``
turns httpx's exceptions into the client's.

Safe retries (issue 29).  ``POST /v1/sessions`` and ``POST …/turns`` carry
an ``Idempotency-Key`` header, a fresh random key per call, the same on
every attempt of it, so that a server that supports the header runs a
repeated request once.  A request is sent again, up to twice by default and
after a short backoff, when

- the connection failed before the response's head arrived (refused, reset,
  closed by the server at its keep-alive deadline as the request went out):
  the request may or may not have reached the server;
- or the answer is 502, 503 or 504 (a proxy's, or a draining server's;
  after ``Retry-After`` if it says so and that is at most
  ``Retry.max_wait``).

Only requests that may be repeated are: ``GET``, ``DELETE``, and a
``POST`` that carries an idempotency key.  A timeout is not retried (the
server may be working on it), nor is anything once the head has arrived.
"""

from __future__ import annotations

import json as jsonlib
import math
import random
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, Literal

import httpx

from trioserve.client import errors
from trioserve.client.effects import Body, CloseResponse, Flow, ReadBody, Send, sleep
from trioserve.client.errors import ConnectError, ProtocolError, RequestTimeout, TransportError
from trioserve.protocol import IDEMPOTENCY_KEY_HEADER

#: Statuses a request is sent again for (a proxy's bad gateway, unavailable, gateway timeout).
RETRY_STATUSES: Final = frozenset({502, 503, 504})
#: How long an idle pooled connection is kept: shorter than the server's keep-alive
#: (``--keep-alive``, 5 s in v0.8), so the server is not the one to close it while a
#: request is on its way.
POOL_EXPIRY: Final = 4.0
#: Pooled connections kept per client.
POOL_SIZE: Final = 20
_SAFE_METHODS: Final = frozenset({"GET", "HEAD", "DELETE"})
#: httpx's errors that mean the connection failed before any answer (not a timeout).
_CONNECTION_ERRORS: Final = (
    httpx.ConnectError,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
    httpx.CloseError,
)


@dataclass(frozen=True, slots=True)
class Retry:
    """How a request that may not have reached the server is sent again.

    ``attempts`` more tries (``0``: none), each after ``backoff`` seconds
    times 2**n, less up to ``jitter`` of it at random, or after the
    answer's ``Retry-After`` when that is longer; an answer whose
    ``Retry-After`` is over ``max_wait`` is raised at once instead.
    """

    #: Two, as OpenAI's client: under load a retry can itself land on a pooled
    #: connection the server is closing (tests/system/test_load.py saw it at load 12).
    attempts: int = 2
    backoff: float = 0.2
    jitter: float = 0.5
    max_wait: float = 5.0

    def __post_init__(self) -> None:
        if self.attempts < 0:
            raise ValueError(f"attempts must be 0 or more, got {self.attempts}")
        if self.backoff < 0 or not 0 <= self.jitter <= 1 or self.max_wait < 0:
            raise ValueError("need backoff >= 0, 0 <= jitter <= 1 and max_wait >= 0")

    def delay(self, attempt: int, retry_after: float | None) -> float | None:
        """Seconds before retry ``attempt`` (from 1), or ``None``: do not retry."""
        if attempt > self.attempts:
            return None
        base = self.backoff * 2.0 ** min(attempt - 1, 32) * (1 - self.jitter * random.random())
        if retry_after is None:
            return base
        return max(base, retry_after) if retry_after <= self.max_wait else None


class HTTP:
    """One server's requests: see the module doc."""

    def __init__(
        self, base_url: str, *, timeout: float | None, api_key: str | None, retry: Retry
    ) -> None:
        url = check_base_url(base_url)
        self.url = url
        self.base_url = str(url).rstrip("/")
        self.timeout = timeout
        self.retry = retry
        self.headers: dict[str, str] = {"User-Agent": "trioserve-client"}
        if api_key is not None:
            self.headers["Authorization"] = f"Bearer {api_key}"

    @property
    def seconds(self) -> float:
        """The timeout, ``inf`` for none."""
        return math.inf if self.timeout is None else self.timeout

    def build(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        read_timeout: float | Literal["client"] | None = "client",
        keyed: bool = False,
    ) -> httpx.Request:
        """A request to ``path``; ``keyed`` adds a fresh ``Idempotency-Key``.

        ``read_timeout``: seconds a read may wait (``None``: forever; by
        default the client's ``timeout``, which bounds every other step).
        """
        all_headers = dict(self.headers)
        if keyed:
            all_headers[IDEMPOTENCY_KEY_HEADER] = new_key()
        if headers:
            all_headers.update(headers)
        content = None
        if json is not None:
            content = jsonlib.dumps(json, separators=(",", ":")).encode()
            all_headers["Content-Type"] = "application/json"
        read = self.timeout if read_timeout == "client" else read_timeout
        timeout = httpx.Timeout(self.timeout, read=read)
        return httpx.Request(
            method,
            self.base_url + path,
            params=params,
            headers=all_headers,
            content=content,
            extensions={"timeout": timeout.as_dict()},
        )

    def send(self, request: httpx.Request) -> Flow[Body]:
        """Send ``request`` (again when that is safe); the body, its head arrived.

        Raises the client's exception for a transport failure, and for a
        502/503/504 still answered after the retries.
        """
        repeatable = request.method in _SAFE_METHODS or IDEMPOTENCY_KEY_HEADER in request.headers
        attempt = 0
        while True:
            attempt += 1
            try:
                body: Body = yield Send(request)
            except httpx.HTTPError as exc:
                delay = self.retry.delay(attempt, None)
                if repeatable and delay is not None and isinstance(exc, _CONNECTION_ERRORS):
                    yield from sleep(delay)
                    continue
                raise self.error_of(exc, request.url.path) from exc
            status = body.response.status_code
            if repeatable and status in RETRY_STATUSES:
                retry_after = errors.parse_retry_after(body.response.headers.get("retry-after"))
                delay = self.retry.delay(attempt, retry_after)
                if delay is not None:
                    yield CloseResponse(body)
                    yield from sleep(delay)
                    continue
            return body

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        expect: int | None = 200,
        keyed: bool = False,
    ) -> Flow[httpx.Response]:
        """The whole answer; a status other than ``expect`` (``None``: any) raises its error."""
        request = self.build(method, path, json=json, params=params, keyed=keyed)
        body = yield from self.send(request)
        try:
            with self.translated(path):
                yield ReadBody(body)
        finally:
            yield CloseResponse(body)
        response = body.response
        if expect is not None and response.status_code != expect:
            raise errors.from_response(response.status_code, response.headers, response.content)
        return response

    def open_stream(self, request: httpx.Request) -> Flow[Body]:
        """An event stream's response, checked: the refusal it holds raises, after closing it."""
        body = yield from self.send(request)
        try:
            yield from self.check_event_stream(body, request.url.path)
        except BaseException:
            yield CloseResponse(body)
            raise
        return body

    def check_event_stream(self, body: Body, path: str) -> Flow[None]:
        response = body.response
        if response.status_code != 200:
            content = b""
            with self.translated(path):
                content = yield ReadBody(body)
            raise errors.from_response(response.status_code, response.headers, content)
        content_type = response.headers.get("content-type", "")
        if not content_type.startswith("text/event-stream"):
            raise ProtocolError(f"expected an event stream, got {content_type or 'no type'}")

    @contextmanager
    def translated(self, path: str) -> Iterator[None]:
        """httpx's exceptions as the client's."""
        try:
            yield
        except httpx.HTTPError as exc:
            raise self.error_of(exc, path) from exc

    def error_of(self, exc: httpx.HTTPError, path: str) -> TransportError:
        url = self.base_url + path
        if isinstance(exc, httpx.TimeoutException):
            return RequestTimeout(f"{url}: timed out ({type(exc).__name__})")
        if isinstance(exc, httpx.ConnectError):
            return ConnectError(f"cannot connect to {self.base_url}: {exc}")
        return TransportError(f"{url}: {exc or type(exc).__name__}")


def new_key() -> str:
    """A fresh idempotency key (128 random bits)."""
    return uuid.uuid4().hex


def check_base_url(base_url: str) -> httpx.URL:
    """The parsed URL; ``ValueError`` unless it is ``http://HOST…`` or ``https://…``."""
    try:
        url = httpx.URL(base_url)
    except httpx.InvalidURL as exc:
        raise ValueError(f"base URL {base_url!r} is not a URL: {exc}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"base URL must be http://HOST[:PORT] or https://…, got {base_url!r}")
    return url


def json_of(response: httpx.Response) -> Any:
    """The answer's JSON; ``ProtocolError`` if it is not JSON."""
    try:
        return response.json()
    except ValueError:
        raise ProtocolError(
            f"expected JSON from {response.request.url}, got {response.text[:100]!r}"
        ) from None
