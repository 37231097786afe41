"""The client's exceptions, and how server refusals become them.

::

    TrioserveClientError
    ├── APIError                  the server refused (an error envelope, a close code)
    │   ├── BadRequestError       400 invalid_request
    │   ├── UnauthorizedError     401 unauthorized (no API key, or a wrong one); close 4401
    │   ├── NotFoundError         404 not_found, no_turn, route_not_found; close 4404
    │   ├── SessionBusyError      409 session_busy
    │   ├── CursorExpiredError    410 cursor_expired (``earliest_seq``)
    │   ├── PayloadTooLargeError  413 payload_too_large; close 1009
    │   ├── RateLimitedError      429 turn_cap, session_cap, tenant_*_cap, address_connection_cap
    │   ├── DrainingError         503 draining; close 4503, 1001
    │   └── ServerError           500 internal and any other 5xx; close 1011
    └── TransportError            no usable answer
        ├── ConnectError          the server could not be reached
        ├── RequestTimeout        a network operation took longer than the timeout
        ├── StreamInterrupted     a stream was cut before its end (and not re-opened)
        └── ProtocolError         the server sent something this client can't read

Every ``APIError`` carries ``code`` (the HTTP status, or the status a close
code stands for), ``reason`` (the envelope's machine-readable word, or
``"unknown"`` when the body was no envelope), ``message`` and
``retry_after`` (seconds from ``Retry-After``, else ``None``; WebSocket
refusals have no header, so ``None``).  ``CursorExpiredError`` adds
``earliest_seq``, the first seq the server still keeps.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Final

from trioserve.protocol import CLOSE_CODES


class TrioserveClientError(Exception):
    """Base of every exception the client raises."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class APIError(TrioserveClientError):
    """The server refused the request; branch on ``reason`` or on the subclass."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        retry_after: float | None = None,
        close_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.retry_after = retry_after
        #: The WebSocket close code this error came from, if it came from one.
        self.close_code = close_code

    def __str__(self) -> str:
        text = f"{self.message} ({self.code} {self.reason}"
        if self.retry_after is not None:
            text += f"; retry after {self.retry_after:g}s"
        return text + ")"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code}, {self.reason!r}, {self.message!r})"


class BadRequestError(APIError):
    """400: the request was malformed (the message names the field)."""


class UnauthorizedError(APIError):
    """401: the server needs an API key (``Client(api_key=...)``) or refused the one sent."""


class NotFoundError(APIError):
    """404: no such session, a terminal one, nothing to cancel (``no_turn``), or no route."""


class SessionBusyError(APIError):
    """409: another turn of the session is in flight."""


class CursorExpiredError(APIError):
    """410 ``cursor_expired``: retention dropped events after the replay cursor.

    ``earliest_seq`` is the first seq the server still keeps (``None`` if it
    did not say): resume with ``after=earliest_seq - 1`` to read what is left.
    """

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        retry_after: float | None = None,
        close_code: int | None = None,
        earliest_seq: int | None = None,
    ) -> None:
        super().__init__(code, reason, message, retry_after=retry_after, close_code=close_code)
        self.earliest_seq = earliest_seq


class PayloadTooLargeError(APIError):
    """413 (or WebSocket close 1009): the request was over the server's size limit."""


class RateLimitedError(APIError):
    """429: a session or concurrent-turn cap (global or the tenant's); see ``retry_after``."""


class DrainingError(APIError):
    """503: the server is shutting down and takes no new sessions or turns."""


class ServerError(APIError):
    """A 5xx other than 503: a server bug (``internal``) or a proxy's failure."""


class TransportError(TrioserveClientError):
    """The server gave no usable answer: see the subclasses."""


class ConnectError(TransportError):
    """The server could not be reached (refused, unresolvable, handshake failed)."""


class RequestTimeout(TransportError):
    """A network operation took longer than the client's ``timeout``."""


class StreamInterrupted(TransportError):
    """A stream ended (EOF, a dropped socket) before its last event.

    ``Client.events`` raises it too when it gave up re-opening a cut stream;
    ``__cause__`` is then the last attempt's error.
    """

    def __init__(self, message: str, *, close_code: int | None = None) -> None:
        super().__init__(message)
        self.close_code = close_code


class ProtocolError(TransportError):
    """The server sent something this client can't read (not JSON, not an event)."""


_BY_STATUS: Final[dict[int, type[APIError]]] = {
    400: BadRequestError,
    401: UnauthorizedError,
    404: NotFoundError,
    409: SessionBusyError,
    410: CursorExpiredError,
    413: PayloadTooLargeError,
    429: RateLimitedError,
    503: DrainingError,
}


def error_class(code: int) -> type[APIError]:
    """The exception class for an HTTP status."""
    if code in _BY_STATUS:
        return _BY_STATUS[code]
    return ServerError if code >= 500 else APIError


def api_error(
    code: int,
    reason: str,
    message: str,
    *,
    retry_after: float | None = None,
    close_code: int | None = None,
    earliest_seq: int | None = None,
) -> APIError:
    cls = error_class(code)
    if issubclass(cls, CursorExpiredError):
        return cls(
            code,
            reason,
            message,
            retry_after=retry_after,
            close_code=close_code,
            earliest_seq=earliest_seq,
        )
    return cls(code, reason, message, retry_after=retry_after, close_code=close_code)


def from_response(status: int, headers: Mapping[str, str], body: bytes) -> APIError:
    """The exception for a refusal: the error envelope if the body is one, else a summary.

    Never raises: a body that is not the envelope (a proxy's HTML page, an
    empty body) still gives an exception of the status's class, with
    ``reason`` ``"unknown"`` and the start of the body as the message.
    """
    retry_after = parse_retry_after(headers.get("retry-after"))
    envelope = _envelope(body)
    if envelope is not None:
        earliest = envelope.earliest_seq if isinstance(envelope, CursorExpiredError) else None
        reason, message = envelope.reason, envelope.message
        return api_error(status, reason, message, retry_after=retry_after, earliest_seq=earliest)
    text = body[:200].decode(errors="replace").strip()
    message = f"HTTP {status}" + (f": {text}" if text else " with no error body")
    return api_error(status, "unknown", message, retry_after=retry_after)


def from_error_object(error: Any) -> APIError | None:
    """The exception for ``{"code", "reason", "message"[, "earliestSeq"]}``.

    That is the envelope's inner object, also what a WebSocket
    ``trioserve.error`` message carries.  ``None`` if it is not one.
    """
    if not isinstance(error, dict):
        return None
    code, reason, message = error.get("code"), error.get("reason"), error.get("message")
    if isinstance(code, bool) or not isinstance(code, int):
        return None
    reason = reason if isinstance(reason, str) and reason else "unknown"
    message = message if isinstance(message, str) and message else f"HTTP {code}"
    earliest = error.get("earliestSeq")
    if isinstance(earliest, bool) or not isinstance(earliest, int):
        earliest = None
    return api_error(code, reason, message, earliest_seq=earliest)


def from_close(code: int, reason: str | None) -> APIError | None:
    """The exception a WebSocket close code stands for, or ``None`` if it stands for none."""
    if code not in CLOSE_CODES:
        return None
    status, word = CLOSE_CODES[code]
    message = reason or f"the server closed the connection with code {code}"
    return api_error(status, word, message, close_code=code)


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds from a ``Retry-After`` value (delay-seconds or an HTTP date), else ``None``."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(int(value))
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def _envelope(body: bytes) -> APIError | None:
    """The error the envelope in ``body`` describes (its status is the envelope's ``code``)."""
    try:
        value = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(value, dict):
        return None
    return from_error_object(value.get("error"))
