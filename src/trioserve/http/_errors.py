"""Errors as HTTP answers: the status of each domain error and the error envelope."""

from __future__ import annotations

import json
from typing import Any, Final

from quart import Response, g

from trioserve.errors import (
    CursorExpired,
    Draining,
    InvalidRequest,
    NotFound,
    NoTurn,
    SessionBusy,
    SessionCapReached,
    TrioserveError,
    TurnCapReached,
)
from trioserve.protocol import ErrorDetail, ErrorEnvelope

STATUS_OF: Final[dict[type[TrioserveError], int]] = {
    InvalidRequest: 400,
    NotFound: 404,
    NoTurn: 404,
    SessionBusy: 409,
    CursorExpired: 410,
    TurnCapReached: 429,
    SessionCapReached: 429,
    Draining: 503,
}
#: Seconds a client should wait before retrying a 429 or a 503.
RETRY_AFTER: Final = 1


def error_body(code: int, reason: str, message: str, **extra: Any) -> dict[str, Any]:
    """The error envelope: ``{"error": {"code", "reason", "message", ...extra}}``."""
    detail = ErrorDetail(code=code, reason=reason, message=message, **extra)
    return ErrorEnvelope(error=detail).model_dump(exclude_none=True)


def error_extra(exc: TrioserveError) -> dict[str, Any]:
    """What an error adds to the envelope (``earliestSeq`` for an expired cursor)."""
    if isinstance(exc, CursorExpired):
        return {"earliestSeq": exc.earliest_seq}
    return {}


def error_response(
    code: int,
    reason: str,
    message: str,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> Response:
    headers = dict(headers or {})
    if code in (429, 503):
        headers["Retry-After"] = str(RETRY_AFTER)
    return Response(
        _json(error_body(code, reason, message, **extra)),
        status=code,
        content_type="application/json",
        headers=headers,
    )


def status_for(exc: TrioserveError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS_OF:
            return STATUS_OF[cls]
    return 500


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":")) + "\n"


def tenant() -> str | None:
    """The tenant of the request (or WebSocket) being handled; ``None`` without keys."""
    value: str | None = g.get("tenant")
    return value
