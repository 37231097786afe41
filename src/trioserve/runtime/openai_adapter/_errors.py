"""The model server's refusals as failures a user can act on.

=============================  ============================================
reason                         when
=============================  ============================================
``model_unreachable``          no connection (refused, DNS, TLS, timeout)
``model_timeout``              the server stayed silent ``requestTimeoutMs``
``model_connection_lost``      the connection broke before the reply ended
``model_auth_failed``          401 or 403
``model_not_found``            404 (a model or a path the server lacks)
``model_rate_limited``         429; ``data.retryAfter`` in seconds, if said
``context_length_exceeded``    the conversation is longer than the model's
                               context (400/413 saying so, or mid-stream)
``model_request_rejected``     another 4xx
``model_server_error``         5xx, or an ``error`` inside the stream
``model_stream_malformed``     a reply that is not a Chat Completions stream
=============================  ============================================

Each message quotes the server's own (``error.message``, cut to 300
characters) and says what to change; none shows the API key, and the base
URL is shown without credentials (``Settings.shown_url``).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Final

from trioserve.runtime.openai_adapter._events import Failure

_CONTEXT: Final = re.compile(
    r"context[ _-]?(length|window)|maximum context|too many tokens|prompt is too long"
    r"|context_length_exceeded|exceeds? the (model'?s? )?(max|context)",
    re.IGNORECASE,
)
_QUOTE_LIMIT: Final = 300
CONTEXT_HINT: Final = (
    "lower runtime.options.contextTokens so that older turns are dropped, or start a new session"
)


def server_message(body: bytes | str) -> str:
    """The server's own words: ``error.message`` of a JSON body, else the body's start."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else body
    try:
        decoded = json.loads(text)
    except ValueError:
        return text.strip()[:_QUOTE_LIMIT]
    return _message_of(decoded)[:_QUOTE_LIMIT]


def _message_of(decoded: Any) -> str:
    error = decoded.get("error", decoded) if isinstance(decoded, dict) else decoded
    if isinstance(error, dict):
        for key in ("message", "detail", "error"):
            if isinstance(error.get(key), str):
                return str(error[key])
    if isinstance(error, str):
        return error
    return json.dumps(decoded)


def retry_after(headers: dict[str, str], *, now: datetime | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date)."""
    if (ms := headers.get("retry-after-ms")) is not None:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def for_status(
    status: int, body: bytes, headers: dict[str, str], *, model: str, url: str
) -> Failure:
    """The failure of a non-200 answer to ``POST {url}/chat/completions``."""
    said = server_message(body) or "(no message)"
    if status in (401, 403):
        return Failure(
            "model_auth_failed",
            f"the model server at {url} refused the request ({status}: {said}); set the API key"
            " in TRIOSERVE_OPENAI_API_KEY or OPENAI_API_KEY where trioserve runs",
            status=status,
        )
    if status == 404:
        return Failure(
            "model_not_found",
            f"the model server at {url} answered 404 ({said}); check spec.model.name"
            f" ('{model}') and that the base URL ends with its API prefix (often /v1)",
            status=status,
        )
    if status == 429:
        wait = retry_after(headers)
        when = f"retry after {wait:g} s" if wait is not None else "retry later"
        return Failure(
            "model_rate_limited",
            f"the model server is rate limiting requests (429: {said}); {when}",
            status=status,
            retryAfter=wait,
        )
    if status in (400, 413, 422) and _CONTEXT.search(said):
        return context_exceeded(said, status=status)
    if status < 500:
        return Failure(
            "model_request_rejected",
            f"the model server rejected the request ({status}: {said}); check spec.model"
            " and runtime.options",
            status=status,
        )
    return Failure(
        "model_server_error",
        f"the model server failed ({status}: {said}); try again, or check the server's log",
        status=status,
    )


def context_exceeded(said: str, **details: Any) -> Failure:
    return Failure(
        "context_length_exceeded",
        f"the conversation is longer than the model's context ({said}); {CONTEXT_HINT}",
        **details,
    )


def error_in_stream(error: Any) -> Failure:
    """An ``error`` object the server put in the stream instead of a chunk."""
    said = _message_of({"error": error})[:_QUOTE_LIMIT]
    if _CONTEXT.search(said):
        return context_exceeded(said)
    return Failure(
        "model_server_error",
        f"the model server reported an error mid-reply ({said}); try again, or check its log",
    )
