"""The request guard: what is refused before any route, and CORS.

Every route but the open ones (``OPEN_PATHS``: ``/healthz``, ``/readyz``,
``/openapi.json``) is guarded by a ``before_request`` hook (and its
``before_websocket`` twin, which refuses the handshake before it is
accepted), in this order: the ``Host`` must be allowed (``421``), an
``Origin`` must be this server's own (the web console's calls: scheme and
the ``Host`` just allowed) or listed (``403``; a listed one's preflight is
answered ``204``), with API keys (``keys``) the key must be valid (``401``,
and the connection is closed; the console's own files need none), and the
server-wide ``GET /metrics`` needs a key of the ``admin`` scope (``403
admin_required``).  The key's tenant goes into
``g.tenant`` (``_errors.tenant()`` reads it), its entry into ``g.key``.
The keys in force are read on every request: ``reload_keys`` (on SIGHUP)
puts the key file's new contents in force and closes the streams of the
keys it no longer holds.
Before that, on every route, a path with an empty segment is a ``404``.
Responses to a listed origin carry CORS headers (``_browser.py`` has the
rules).
"""

from __future__ import annotations

import logging
from typing import Final

from quart import Response, g, has_websocket_context, request, websocket
from quart_trio import QuartTrio

from trioserve.http._auth import ADMIN, KeyFileError, Keys, bearer_token
from trioserve.http._browser import (
    cors_headers,
    host_allowed,
    origin_allowed,
    preflight_headers,
    same_origin,
)
from trioserve.http._console import is_console_path
from trioserve.http._errors import error_response
from trioserve.http._streams import StreamSlots

log = logging.getLogger("trioserve.http")

#: Routes open without an API key (health checks of load balancers, kubelets; the
#: OpenAPI document, which describes the API and holds nothing secret).
OPEN_PATHS: Final = frozenset({"/healthz", "/readyz", "/openapi.json"})
#: Routes that need a key of the ``admin`` scope (what they show is every tenant's).
ADMIN_PATHS: Final = frozenset({"/metrics"})
#: Why a revoked key's streams are closed (an SSE comment, a WebSocket close reason).
REVOKED: Final = "the API key was revoked"


def unauthorized(token: str | None) -> Response:
    """``401``: no key (``token`` is ``None``) or a key of no tenant.

    The connection is closed after it: a client without a valid key holds
    no connection for longer than its refusal takes.
    """
    challenge = 'Bearer realm="trioserve"'
    if token is None:
        message = "an API key is required: send the header Authorization: Bearer KEY"
    else:
        challenge += ', error="invalid_token"'
        message = "the API key is not valid"
    headers = {"WWW-Authenticate": challenge, "Connection": "close"}
    return error_response(401, "unauthorized", message, headers)


def install_guard(
    app: QuartTrio,
    *,
    keys: Keys | None,
    allowed_hosts: tuple[str, ...],
    cors_origins: tuple[str, ...],
) -> None:
    """Add the guard's hooks and the CORS headers to ``app`` (see the module doc)."""

    async def guard() -> Response | None:
        """Refuse what the module doc says, answer preflights; ``g.tenant`` for the rest.

        One hook, not one per check: each hook costs Quart a coroutine call a
        request, whatever it does.
        """
        is_ws = has_websocket_context()
        target = websocket if is_ws else request
        # werkzeug strips leading slashes from the path (//v1/sessions is served
        # as /v1/sessions); a path with an empty segment is no route of ours.
        raw = str(target.scope.get("path", ""))
        method = "WEBSOCKET" if is_ws else request.method
        if "//" in raw:
            return error_response(404, "route_not_found", f"no route for {method} {raw}")
        g.tenant = None
        path = target.path
        if path in OPEN_PATHS:
            return None
        headers = target.headers
        host = headers.get("Host")
        if not host_allowed(host, allowed_hosts):
            return error_response(
                421,
                "host_not_allowed",
                f"this server does not answer to Host {host!r} (see --allowed-hosts)",
            )
        origin = headers.get("Origin")
        if origin is not None and not same_origin(origin, host):
            if not origin_allowed(origin, cors_origins):
                return error_response(
                    403,
                    "origin_not_allowed",
                    f"requests from origin {origin!r} are not allowed (see --cors-origins)",
                )
            if method == "OPTIONS" and "Access-Control-Request-Method" in headers:
                return Response("", status=204, headers=preflight_headers(origin))
        if keys is None or is_console_path(path):
            return None
        token = bearer_token(headers.get("Authorization"))
        entry = None if token is None else keys.ring.match(token)
        if entry is None:
            if token is not None:
                log.warning("refused %s %s: the API key is not valid", method, path)
            return unauthorized(token)
        if path in ADMIN_PATHS and ADMIN not in entry.scopes:
            return error_response(
                403,
                "admin_required",
                f"{path} shows every tenant's figures: it needs a key of the admin scope"
                " (a key file line 'sha256:... TENANT admin'), or --metrics-bind",
            )
        g.tenant = entry.tenant
        g.key = entry
        return None

    app.before_request(guard)
    app.before_websocket(guard)
    if not cors_origins:
        return  # no CORS headers, no Vary: no hook

    @app.after_request
    async def _cors(response: Response) -> Response:
        response.vary.add("Origin")
        origin = request.headers.get("Origin")
        if origin is not None and origin_allowed(origin, cors_origins):
            response.headers.update(cors_headers(origin))
        return response


def reload_keys(keys: Keys, streams: StreamSlots) -> None:
    """Put the key file's contents in force (SIGHUP); close the streams of keys it lost.

    A file that cannot be used changes nothing: the keys in force stay, and
    the error (never a key) is logged.
    """
    try:
        ring, gone = keys.reload()
    except KeyFileError as exc:
        log.error("API keys not reloaded, those in force stay: %s", exc)
        return
    closed = streams.revoke(gone, REVOKED)
    log.warning(
        "API keys reloaded from %s: %d keys of %d tenants; %d gone, %d of their streams closed",
        ring.source,
        len(ring.entries),
        len(ring.tenants),
        len(gone),
        closed,
    )
