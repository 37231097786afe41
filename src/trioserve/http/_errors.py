"""Errors as HTTP answers: the status of each domain error, the error envelope, the app's handlers.

``install_error_handlers`` makes every refusal the envelope: domain errors
by their status, werkzeug's (unknown route 404, wrong method 405, body too
large 413) with the route and the limit named, anything unexpected a 500
(logged with its traceback).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Final

from quart import Response, g, has_websocket_context, request, websocket
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from trioserve.errors import (
    ApprovalDecided,
    CronCapReached,
    CursorExpired,
    Draining,
    IdempotencyKeyReused,
    InvalidRequest,
    NotFound,
    NoTurn,
    QueueFull,
    SessionBusy,
    SessionCapReached,
    StoreUnavailable,
    TenantStreamCapReached,
    TrioserveError,
    TurnCapReached,
    TurnEnded,
)
from trioserve.protocol import IDEMPOTENT_REPLAYED_HEADER, ErrorDetail, ErrorEnvelope

log = logging.getLogger("trioserve.http")

STATUS_OF: Final[dict[type[TrioserveError], int]] = {
    InvalidRequest: 400,
    NotFound: 404,
    NoTurn: 404,
    SessionBusy: 409,
    TurnEnded: 409,
    ApprovalDecided: 409,
    CursorExpired: 410,
    IdempotencyKeyReused: 422,
    TurnCapReached: 429,
    QueueFull: 429,
    SessionCapReached: 429,
    CronCapReached: 429,
    TenantStreamCapReached: 429,
    Draining: 503,
    StoreUnavailable: 503,
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


def key_digest() -> bytes | None:
    """The digest of the API key of the request being handled; ``None`` without keys."""
    entry = g.get("key")
    return None if entry is None else bytes(entry.digest)


def request_target() -> tuple[str, str]:
    """The method and path of the request (or WebSocket) being handled."""
    if has_websocket_context():
        return "WEBSOCKET", websocket.path
    return request.method, request.path


def install_error_handlers(app: QuartTrio, max_body_bytes: int) -> None:
    """Answer every error with the envelope (see the module doc)."""

    @app.errorhandler(TrioserveError)
    async def _domain_error(exc: TrioserveError) -> Response:
        headers = {IDEMPOTENT_REPLAYED_HEADER: "true"} if exc.replayed else None
        return error_response(status_for(exc), exc.reason, exc.message, headers, **error_extra(exc))

    @app.errorhandler(HTTPException)
    async def _http_error(exc: HTTPException) -> Response:
        code = exc.code or 500
        method, path = request_target()
        messages = {
            404: ("route_not_found", f"no route for {method} {path}"),
            405: ("method_not_allowed", f"method {method} not allowed for {path}"),
            413: ("payload_too_large", f"request body larger than {max_body_bytes} bytes"),
        }
        fallback = ("invalid_request" if code < 500 else "internal", exc.description or exc.name)
        reason, message = messages.get(code, fallback)
        headers = {}
        if code == 413:
            # The rest of the body is never read: the connection can't be reused.
            headers["Connection"] = "close"
        if code == 405 and getattr(exc, "valid_methods", None):
            headers["Allow"] = ", ".join(sorted(exc.valid_methods))  # type: ignore[attr-defined]
        return error_response(code, reason, message, headers)

    @app.errorhandler(Exception)
    async def _unexpected(exc: Exception) -> Response:
        log.exception("unhandled error in %s %s", *request_target())
        return error_response(500, "internal", "internal server error")
