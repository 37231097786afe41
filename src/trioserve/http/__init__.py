"""The HTTP transport: the quart-trio app, WebSocket, the listener, API keys.

``create_app`` builds the app over a ``SessionManager``; ``serve_http``
runs it on hypercorn with the connection limits.  The modules are private;
the names other layers use are exported here and load on first use
(``trioserve._lazy``), so ``from trioserve.http import KeyRing`` does not
load quart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trioserve._lazy import lazy_exports

if TYPE_CHECKING:
    from trioserve.http import _hypercorn_fixes as hypercorn_fixes
    from trioserve.http import _metricsroute as metricsroute
    from trioserve.http._accesslog import Exchange
    from trioserve.http._app import create_app, key_reloader
    from trioserve.http._auth import (
        ADMIN,
        TENANT_RULE,
        KeyFileError,
        KeyRing,
        load_keys,
        new_key,
    )
    from trioserve.http._browser import default_hosts, parse_hosts, parse_origins
    from trioserve.http._connection_caps import auto_max_connections, open_file_limit
    from trioserve.http._connections import serve_http

__all__ = [
    "ADMIN",
    "TENANT_RULE",
    "Exchange",
    "KeyFileError",
    "KeyRing",
    "auto_max_connections",
    "create_app",
    "default_hosts",
    "hypercorn_fixes",
    "key_reloader",
    "load_keys",
    "metricsroute",
    "new_key",
    "open_file_limit",
    "parse_hosts",
    "parse_origins",
    "serve_http",
]

#: The private modules and what each exports here (loaded on first use).
_NAMES = {
    "_accesslog": ("Exchange",),
    "_app": ("create_app", "key_reloader"),
    "_auth": ("ADMIN", "KeyFileError", "KeyRing", "TENANT_RULE", "load_keys", "new_key"),
    "_browser": ("default_hosts", "parse_hosts", "parse_origins"),
    "_connection_caps": ("auto_max_connections", "open_file_limit"),
    "_connections": ("serve_http",),
}
#: Private modules exported whole, by their public name.
_MODULES = {
    "hypercorn_fixes": "_hypercorn_fixes",
    "metricsroute": "_metricsroute",
}

if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, _NAMES, _MODULES)
