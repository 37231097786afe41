"""The HTTP transport: quart-trio routes over the session manager.

Every refusal is the JSON envelope ``{"error":{"code","message"}}``, also for
unknown routes (404), wrong methods (405) and oversized bodies (413).  A turn
is an SSE stream: one ``event:``/``data:`` frame per wire event, sent as soon
as it is ready (events already queued go out in one write).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from typing import Any, Final

import trio
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from . import wire
from .errors import (
    Draining,
    InvalidRequest,
    NotFound,
    NoTurn,
    SessionBusy,
    SessionCapReached,
    TrioserveError,
    TurnCapReached,
)
from .manager import SessionManager, Turn
from .models import CreateSessionBody, SessionOut, TurnBody, parse_body
from .stores.base import SessionStatus

log = logging.getLogger("trioserve.http")

STATUS_OF: Final[dict[type[TrioserveError], int]] = {
    InvalidRequest: 400,
    NotFound: 404,
    NoTurn: 404,
    SessionBusy: 409,
    TurnCapReached: 429,
    SessionCapReached: 429,
    Draining: 503,
}
SSE_HEADERS: Final = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
_BATCH_BYTES: Final = 256 * 1024
KEEP_ALIVE: Final = b": keep-alive\n\n"


#: Seconds a client should wait before retrying a 429 or a 503.
RETRY_AFTER: Final = 1


def error_body(code: int, reason: str, message: str) -> dict[str, Any]:
    """The error envelope: ``{"error": {"code", "reason", "message"}}``."""
    return {"error": {"code": code, "reason": reason, "message": message}}


def error_response(
    code: int, reason: str, message: str, headers: dict[str, str] | None = None
) -> Response:
    headers = dict(headers or {})
    if code in (429, 503):
        headers["Retry-After"] = str(RETRY_AFTER)
    return Response(
        _json(error_body(code, reason, message)),
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


def json_response(value: Any, status: int = 200) -> Response:
    return Response(_json(value), status=status, content_type="application/json")


class SSEBody:
    """The body of a turn's SSE response: reads the turn's event channel.

    Closing it (the client left, or the response was dropped unsent)
    detaches from the turn, which cancels it.
    """

    def __init__(self, turn: Turn, heartbeat: float = 0.0) -> None:
        self._turn = turn
        self._events = turn.events
        self._closed = False
        self._heartbeat = heartbeat if heartbeat > 0 else math.inf

    def __aiter__(self) -> SSEBody:
        return self

    async def __anext__(self) -> bytes:
        try:
            with trio.move_on_after(self._heartbeat):
                event = await self._events.receive()
                return self._frames(event)
        except (trio.EndOfChannel, trio.ClosedResourceError):
            self._close()
            raise StopAsyncIteration from None
        # Nothing to send for a while: a comment keeps proxies from closing
        # the stream, and a client that vanished is found by the failed write.
        return KEEP_ALIVE

    def _frames(self, event: wire.Event) -> bytes:
        frames = [wire.sse_frame(event)]
        size = len(frames[0])
        while size < _BATCH_BYTES:
            try:
                event = self._events.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            frame = wire.sse_frame(event)
            frames.append(frame)
            size += len(frame)
        return b"".join(frames)

    async def aclose(self) -> None:
        self._close()

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            self._turn.detach()

    def __del__(self) -> None:
        # The response was dropped without being sent (the client left first).
        with contextlib.suppress(Exception):
            self._close()


def create_app(
    manager: SessionManager, *, max_body_bytes: int = 1024 * 1024, heartbeat: float = 15.0
) -> QuartTrio:
    """Build the app.  It holds no session state: everything is the manager's."""
    app = QuartTrio("trioserve")
    app.config.update(
        MAX_CONTENT_LENGTH=max_body_bytes,
        RESPONSE_TIMEOUT=None,
        BODY_TIMEOUT=60,
        PROVIDE_AUTOMATIC_OPTIONS=False,
    )

    @app.errorhandler(TrioserveError)
    async def _domain_error(exc: TrioserveError) -> Response:
        return error_response(status_for(exc), exc.reason, exc.message)

    @app.errorhandler(HTTPException)
    async def _http_error(exc: HTTPException) -> Response:
        code = exc.code or 500
        messages = {
            404: ("route_not_found", f"no route for {request.method} {request.path}"),
            405: ("method_not_allowed", f"method {request.method} not allowed for {request.path}"),
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
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(500, "internal", "internal server error")

    @app.after_request
    async def _close_when_draining(response: Response) -> Response:
        if manager.draining:
            response.headers["Connection"] = "close"
        return response

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response("ok", content_type="text/plain")

    @app.get("/readyz")
    async def readyz() -> Response:
        if manager.draining:
            return Response("draining", status=503, content_type="text/plain")
        return Response("ready", content_type="text/plain")

    @app.post("/v1/sessions")
    async def create_session() -> Response:
        if manager.draining:
            raise Draining("server is draining; not accepting new sessions")
        body = parse_body(CreateSessionBody, await _body())
        session = await manager.create_session(body.inputs)
        return json_response(SessionOut.of(session).model_dump(), status=201)

    @app.get("/v1/sessions")
    async def list_sessions() -> Response:
        status = _status_arg(request.args.get("status"))
        limit = _limit_arg(request.args.get("limit"))
        sessions = await manager.list_sessions(status, limit)
        return json_response([SessionOut.of(s).model_dump() for s in sessions])

    @app.get("/v1/sessions/<session_id>")
    async def get_session(session_id: str) -> Response:
        session = await manager.get_session(session_id)
        return json_response(SessionOut.of(session).model_dump())

    @app.delete("/v1/sessions/<session_id>")
    async def end_session(session_id: str) -> Response:
        await manager.end_session(session_id)
        return Response("", status=204)

    @app.post("/v1/sessions/<session_id>/turns")
    async def run_turn(session_id: str) -> Response:
        if manager.draining:
            raise Draining("server is draining; not accepting new turns")
        body = parse_body(TurnBody, await _body())
        turn = await manager.start_turn(session_id, body.input)
        response = Response(SSEBody(turn, heartbeat), status=200, headers=SSE_HEADERS)
        response.timeout = None
        return response

    from .ws import add_websocket_route  # ws builds on this module's error mapping

    add_websocket_route(app, manager)

    @app.delete("/v1/sessions/<session_id>/turns/current")
    async def cancel_turn(session_id: str) -> Response:
        await manager.cancel_turn(session_id)
        return json_response({"turnCancelled": True}, status=202)

    return app


async def _body() -> bytes:
    data = await request.get_data(parse_form_data=False)
    return data if isinstance(data, bytes) else data.encode()


def _status_arg(value: str | None) -> SessionStatus | None:
    if value is None or value == "":
        return None
    try:
        return SessionStatus(value)
    except ValueError:
        valid = ", ".join(s.value for s in SessionStatus)
        raise InvalidRequest(f"unknown status {value!r}: expected one of {valid}") from None


def _limit_arg(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    if not value.isdigit() or int(value) < 1:
        raise InvalidRequest(f"limit must be a positive integer, got {value!r}")
    return int(value)
