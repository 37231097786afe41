"""The HTTP transport: quart-trio routes over the session manager.

Every refusal is the JSON envelope ``{"error":{"code","reason","message"}}``,
also for unknown routes (404), wrong methods (405) and oversized bodies
(413).  A turn is an SSE stream: one ``event:``/``data:``/``id:`` frame per
logged event, sent as soon as it is ready (events ready together go out in
one write); ``GET .../events`` replays and follows a session's log the same
way.

What is refused before any route (an empty path segment, the ``Host``, an
``Origin``, the API key) and CORS are ``_guard.py``'s; the error handlers
are ``_errors.py``'s.  The key's tenant is ``_errors.tenant()``, and each
route hands it to the manager, which enforces who owns what.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import AsyncIterator, Callable
from typing import Any, Final, Literal

from quart import Response, request
from quart_trio import QuartTrio

from trioserve.errors import Draining, InvalidRequest
from trioserve.http import _approvals as approvals
from trioserve.http import _console as console_files
from trioserve.http import _crons as cron_routes
from trioserve.http import _metricsroute as metricsroute
from trioserve.http import _openapi as openapi
from trioserve.http import _paging as paging
from trioserve.http._auth import KeyRing, Keys
from trioserve.http._browser import LOOPBACK_NAMES
from trioserve.http._errors import RETRY_AFTER, install_error_handlers, key_digest, tenant
from trioserve.http._guard import install_guard, reload_keys
from trioserve.http._lazy_faces import Needs
from trioserve.http._lazy_faces import install as install_faces
from trioserve.http._models import agent_out, parse_body
from trioserve.http._request_task import HTTPConnection
from trioserve.http._sse import SSEBody, sse_response
from trioserve.http._streams import Slot, StreamSlots
from trioserve.http._untrusted import parse_idempotency_key, parse_int
from trioserve.http._ws import add_websocket_route
from trioserve.protocol import (
    IDEMPOTENCY_KEY_HEADER,
    IDEMPOTENT_REPLAYED_HEADER,
    MAX_SEQ,
    TURN_ID_HEADER,
    CreateSessionBody,
    SessionStatus,
    TurnBody,
)
from trioserve.sessions import (
    Crons,
    QueuedTurn,
    SessionManager,
    Turn,
    TurnReplay,
    session_out,
    turn_out,
)
from trioserve.stores.base import LoggedEvent, TurnRecord

#: What Go's net/http sends for plain text (``/healthz``, ``/readyz``).
TEXT_PLAIN: Final = "text/plain; charset=utf-8"


#: The header of ``GET /readyz`` counting warm adapters: ``ready/target``
#: (ready: loaded and waiting; the ones still loading are not counted).
WARM_HEADER: Final = "Trioserve-Warm-Adapters"
_TRACEPARENT: Final = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")

#: Where an app with API keys keeps its key reload (``key_reloader``).
RELOAD_KEYS: Final = "trioserve.reload_keys"

#: The largest ``?limit=`` of ``GET /v1/sessions``.
MAX_LIMIT: Final = 10_000


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":")) + "\n"


@functools.cache
def _api_document(auth: bool, console: bool, mcp: bool, ag_ui: bool, a2a: bool) -> str:
    """The OpenAPI document's bytes for these settings: built once a process (~15 ms)."""
    return _json(openapi.build(auth=auth, console=console, mcp=mcp, ag_ui=ag_ui, a2a=a2a))


def json_response(value: Any, status: int = 200) -> Response:
    return Response(_json(value), status=status, content_type="application/json")


def create_app(
    manager: SessionManager,
    *,
    max_body_bytes: int = 1024 * 1024,
    heartbeat: float = 15.0,
    keys: KeyRing | None = None,
    allowed_hosts: tuple[str, ...] = LOOPBACK_NAMES,
    cors_origins: tuple[str, ...] = (),
    max_streams_per_tenant: int = 0,
    console: bool = True,
    mcp: bool = True,
    ag_ui: bool = True,
    a2a: bool = True,
    crons: Crons | None = None,
) -> QuartTrio:
    """Build the app.  It holds no session state: everything is the manager's.

    ``keys``: the API keys the server accepts (``None``: no authentication).
    ``allowed_hosts``: the ``Host`` names it answers to (``*``: any).
    ``cors_origins``: the browser origins that may call it.
    ``max_streams_per_tenant``: SSE streams and WebSockets one tenant may hold
    open (0: no cap; no tenants, no cap).
    ``console``: serve the web console at ``/`` (``_console.py``).
    ``mcp``: serve the agent as an MCP tool at ``/mcp`` (``_mcp.py``).
    ``ag_ui``: serve AG-UI runs at ``/ag-ui`` (``_agui.py``).
    ``a2a``: serve A2A's card and JSON-RPC binding at ``/a2a`` (``_a2a.py``).
    Each face's module (and its protocol's SDK) is imported on its first
    request (``_lazy_faces.py``).
    ``crons``: the crons ``/v1/crons`` serves (``_crons.py``; default: the manager's store's).
    """
    streams = StreamSlots(max_streams_per_tenant if keys is not None else 0)
    idle = heartbeat if heartbeat > 0 else math.inf
    app = QuartTrio("trioserve")
    app.asgi_http_class = HTTPConnection  # one task fewer a request (``_request_task``)
    app.url_map.merge_slashes = False  # /v1//sessions is a 404, not a redirect elsewhere
    app.config.update(
        MAX_CONTENT_LENGTH=max_body_bytes,
        RESPONSE_TIMEOUT=None,
        BODY_TIMEOUT=60,
        PROVIDE_AUTOMATIC_OPTIONS=False,
    )
    install_error_handlers(app, max_body_bytes)
    held = None if keys is None else Keys(keys)
    install_guard(app, keys=held, allowed_hosts=allowed_hosts, cors_origins=cors_origins)
    if held is not None:
        app.extensions[RELOAD_KEYS] = functools.partial(reload_keys, held, streams)

    @app.after_request
    async def _close_when_draining(response: Response) -> Response:
        if manager.draining:
            response.headers["Connection"] = "close"
        return response

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response("ok\n", content_type=TEXT_PLAIN)

    @app.get("/readyz")
    async def readyz() -> Response:
        status = "draining" if manager.draining else "ready"
        code = 503 if manager.draining else 200
        warm = _warm_adapters(manager)
        if request.accept_mimetypes.best == "application/json":
            turns = {"running": manager.turns_in_flight, "max": manager.limits.max_concurrent_turns}
            body = {
                "status": status,
                "warmAdapters": warm,
                "forkServer": _fork_server(manager),
                "turns": turns,
            }
            response = json_response(body, status=code)
        else:
            # The reference's bytes: w.Write("ready\n"), or http.Error(w, "draining", 503).
            response = Response(status + "\n", status=code, content_type=TEXT_PLAIN)
            if code == 503:
                response.headers["X-Content-Type-Options"] = "nosniff"
        if code == 503:
            response.headers["Retry-After"] = str(RETRY_AFTER)
        response.headers[WARM_HEADER] = f"{warm['ready']}/{warm['target']}"
        return response

    api_document = _api_document(keys is not None, console, mcp, ag_ui, a2a)

    @app.get("/openapi.json")
    async def openapi_json() -> Response:
        return Response(api_document, content_type="application/json")

    @app.post("/v1/sessions")
    async def create_session() -> Response:
        if manager.draining:
            raise Draining("server is draining; not accepting new sessions")
        body = parse_body(CreateSessionBody, await _body())
        key = _idempotency_key()
        if key is None:
            session, replayed = await manager.create_session(body.inputs, tenant=tenant()), False
        else:
            session, replayed = await manager.keyed.create_session(
                key, body.inputs, tenant=tenant()
            )
        response = json_response(session_out(session).model_dump(), status=201)
        if replayed:
            response.headers[IDEMPOTENT_REPLAYED_HEADER] = "true"
        return response

    @app.get("/v1/sessions")
    async def list_sessions() -> Response:
        status = _status_arg(request.args.get("status"))
        limit = _limit_arg(request.args.get("limit"))
        before = paging.before_arg(request.args.get("before"))
        if status is False:
            return json_response([])  # as in the reference: no session has that status
        page = await manager.list_sessions(status, limit, before, tenant=tenant())
        response = json_response([session_out(s).model_dump() for s in page.sessions])
        if page.next is not None:
            query = request.args.items(multi=True)
            response.headers.update(paging.next_page_headers(request.path, query, page.next))
        return response

    @app.get("/v1/sessions/<session_id>")
    async def get_session(session_id: str) -> Response:
        session = await manager.get_session(session_id, tenant())
        return json_response(session_out(session).model_dump())

    @app.delete("/v1/sessions/<session_id>")
    async def end_session(session_id: str) -> Response:
        await manager.end_session(session_id, tenant())
        return Response("", status=204)

    @app.post("/v1/sessions/<session_id>/turns")
    async def run_turn(session_id: str) -> Response:
        if manager.draining:
            raise Draining("server is draining; not accepting new turns")
        body = parse_body(TurnBody, await _body())
        key = _idempotency_key()
        env = trace_env(request.headers.get("traceparent"), request.headers.get("tracestate"))
        slot = None if body.detach else streams.take(tenant(), key_digest())
        try:
            if key is None:
                turn: Turn | QueuedTurn | TurnReplay = await manager.start_turn(
                    session_id,
                    body.input,
                    on_disconnect=body.onDisconnect,
                    env=env,
                    tenant=tenant(),
                    multitask=body.multitask,
                    webhook=body.webhook,
                )
            else:
                turn = await manager.keyed.start_turn(
                    key,
                    session_id,
                    body.input,
                    detach=body.detach,
                    on_disconnect=body.onDisconnect,
                    env=env,
                    tenant=tenant(),
                    multitask=body.multitask,
                    webhook=body.webhook,
                )
            if isinstance(turn, TurnReplay):  # a repeat: the first request's turn, from its start
                return await _replayed_turn(turn, slot)
        except BaseException:
            if slot is not None:
                slot.release()
            raise
        if slot is None:
            return _detached(turn.record)
        events = manager.turn_events(turn, idle=idle)
        stream = _stream(SSEBody(events, turn.client_left, slot.release), slot)
        return sse_response(stream, {TURN_ID_HEADER: turn.id})

    async def _replayed_turn(replay: TurnReplay, slot: Slot | None) -> Response:
        """``slot``: the stream's (``None``: detached, no stream)."""
        sid, tid = replay.session_id, replay.turn_id
        if slot is None:
            response = _detached(await manager.get_turn(sid, tid, tenant()))
        else:
            events = await manager.events(sid, turn_id=tid, idle=idle, tenant=tenant())
            body = _stream(SSEBody(events, slot.release), slot)
            response = sse_response(body, {TURN_ID_HEADER: tid})
        response.headers[IDEMPOTENT_REPLAYED_HEADER] = "true"
        return response

    @app.get("/v1/sessions/<session_id>/turns")
    async def list_turns(session_id: str) -> Response:
        turns = await manager.list_turns(session_id, tenant())
        return json_response([turn_out(t).model_dump() for t in turns])

    @app.get("/v1/sessions/<session_id>/turns/<turn_id>")
    async def get_turn(session_id: str, turn_id: str) -> Response:
        turn = await manager.get_turn(session_id, turn_id, tenant())
        return json_response(turn_out(turn).model_dump())

    @app.get("/v1/sessions/<session_id>/events")
    async def session_events(session_id: str) -> Response:
        after = _cursor(request.headers.get("Last-Event-ID"), request.args.get("after"))
        turn_id = request.args.get("turn") or None
        follow = _flag("follow", request.args.get("follow"))
        form = request.args.get("format", "sse")
        if form == "json":
            batches = await manager.export(session_id, after, turn_id=turn_id, tenant=tenant())
            return Response(_json_array(batches), content_type="application/json")
        if form != "sse":
            raise InvalidRequest(f"format must be sse or json, got {form!r}")
        slot = streams.take(tenant(), key_digest())
        try:
            batches = await manager.events(
                session_id, after, turn_id=turn_id, follow=follow, idle=idle, tenant=tenant()
            )
        except BaseException:
            slot.release()
            raise
        return sse_response(_stream(SSEBody(batches, slot.release), slot))

    @app.get("/v1/agent")
    async def agent() -> Response:
        return json_response(agent_out(manager.spec).model_dump())

    add_websocket_route(app, manager, streams)
    wanted = [name for name, on in (("mcp", mcp), ("ag-ui", ag_ui), ("a2a", a2a)) if on]
    install_faces(app, Needs(manager, streams, idle, auth=keys is not None), wanted)
    cron_routes.install(app, crons or Crons(manager))
    metricsroute.install(app, manager.metrics)
    approvals.install(app, manager)
    if console:
        console_files.install(app)

    @app.delete("/v1/sessions/<session_id>/turns/current")
    async def cancel_turn(session_id: str) -> Response:
        await manager.cancel_turn(session_id, tenant())
        return json_response({"turnCancelled": True}, status=202)

    @app.delete("/v1/sessions/<session_id>/turns/<turn_id>")
    async def cancel_turn_by_id(session_id: str, turn_id: str) -> Response:
        await manager.cancel_queued(session_id, turn_id, tenant())
        return json_response({"turnCancelled": True}, status=202)

    return app


def _detached(record: TurnRecord) -> Response:
    """``202``: the turn runs with no client attached; its record, and where to find it."""
    response = json_response(turn_out(record).model_dump(), status=202)
    response.headers[TURN_ID_HEADER] = record.id
    response.headers["Location"] = f"/v1/sessions/{record.session_id}/turns/{record.id}"
    return response


def _idempotency_key() -> str | None:
    return parse_idempotency_key(request.headers.getlist(IDEMPOTENCY_KEY_HEADER))


def key_reloader(app: QuartTrio) -> Callable[[], None] | None:
    """What reloads ``app``'s API keys from their file (SIGHUP); ``None`` without keys."""
    reload: Callable[[], None] | None = app.extensions.get(RELOAD_KEYS)
    return reload


def _stream(body: SSEBody, slot: Slot) -> SSEBody:
    """``body``, which its slot's revocation ends (only a key's slot is ever revoked)."""
    slot.closer = body.end
    body.revocable = slot.key is not None
    return body


def _warm_adapters(manager: SessionManager) -> dict[str, Any]:
    """``/readyz``'s ``warmAdapters``: the pool's figures (all zero with the pool off)."""
    if manager.pool is None:
        keys = ["ready", "loading", "paused", "target", "min", "max", "turnsPerLoad"]
        zero = dict.fromkeys(keys, 0)
        return zero | {"loadMs": None, "loadCpuMs": None, "standingDown": False}
    stats = manager.pool.stats()
    return {
        "ready": stats.ready,
        "loading": stats.loading,
        "paused": stats.paused,
        "target": stats.target,
        "min": stats.floor,
        "max": stats.ceiling,
        "loadMs": _ms(stats.load_seconds),
        "loadCpuMs": _ms(stats.load_cpu_seconds),
        "turnsPerLoad": stats.turns_per_load,
        "standingDown": stats.standing_down,
    }


def _fork_server(manager: SessionManager) -> dict[str, Any]:
    """``/readyz``'s ``forkServer``: its state and figures (``off`` without one)."""
    if manager.forker is None:
        return {"state": "off", "forks": 0, "fallbacks": 0, "restarts": 0, "forkMs": None}
    stats = manager.forker.stats
    median = stats.fork_p50()
    return {
        "state": stats.state,
        "forks": stats.forks,
        "fallbacks": stats.fallbacks,
        "restarts": stats.restarts,
        "forkMs": None if median is None else round(median * 1000, 2),
    }


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1000)


def trace_env(traceparent: str | None, tracestate: str | None) -> dict[str, str] | None:
    """The W3C trace context of a request, for the adapter's environment.

    A missing or malformed ``traceparent`` is ignored (W3C: start a new
    trace); ``tracestate`` only travels with a valid ``traceparent``.
    """
    if traceparent is None or not _TRACEPARENT.fullmatch(traceparent.strip()):
        return None
    env = {"TRACEPARENT": traceparent.strip()}
    if tracestate:
        env["TRACESTATE"] = tracestate.strip()
    return env


async def _body() -> bytes:
    data = await request.get_data(parse_form_data=False)
    return data if isinstance(data, bytes) else data.encode()


async def _json_array(batches: AsyncIterator[list[LoggedEvent]]) -> AsyncIterator[bytes]:
    """A JSON array of the events' JSON, streamed batch by batch."""
    yield b"["
    first = True
    async for batch in batches:
        chunk = b",".join(e.raw for e in batch)
        yield chunk if first else b"," + chunk
        first = False
    yield b"]\n"


def _cursor(header: str | None, query: str | None) -> int:
    """The replay cursor: ``Last-Event-ID`` (a reconnecting SSE client) wins over ``?after=``."""
    for name, value in (("Last-Event-ID", header), ("after", query)):
        if value is not None and value.strip() != "":
            return parse_int(name, value.strip(), maximum=MAX_SEQ)
    return 0


def _flag(name: str, value: str | None) -> bool:
    if value is None or value.lower() in ("", "false", "0", "no"):
        return False
    if value.lower() in ("true", "1", "yes"):
        return True
    raise InvalidRequest(f"{name} must be true or false, got {value!r}")


def _status_arg(value: str | None) -> SessionStatus | Literal[False] | None:
    """The ``?status=`` filter: ``None`` for none, ``False`` for a status no session has."""
    if value is None or value == "":
        return None
    try:
        return SessionStatus(value)
    except ValueError:
        return False


def _limit_arg(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    return parse_int("limit", value, minimum=1, maximum=MAX_LIMIT)
