"""The web console: ``GET /`` and ``/console/<file>``, the page and its assets (package data).

The files are the package's ``http/console/`` directory (HTML, CSS, ES-module
JavaScript; no build step, nothing fetched from elsewhere), read once when
the app is built.  The page holds no data, so it is served without an API
key (the ``Host`` allow-list still applies, ``_guard.py``); every call it
makes is a call of the public API, with the key its user types.

Each file is answered with an ``ETag`` (its digest) and ``Cache-Control:
no-cache`` (a browser asks again and gets ``304`` while it is unchanged),
and with strict headers: a ``Content-Security-Policy`` that allows scripts,
styles and connections from this origin only (no inline script, no remote
origin, no framing), ``X-Content-Type-Options: nosniff`` and
``Referrer-Policy: no-referrer``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from typing import Final

from quart import Response, request
from quart_trio import QuartTrio

from trioserve.http._errors import error_response

#: Where the assets are served (the page is ``/``).
PREFIX: Final = "/console/"
#: The package data directory of the files.
_PACKAGE: Final = "trioserve.http"
_DIRECTORY: Final = "console"
_INDEX: Final = "index.html"

_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}

#: The page's policy: everything from this origin only, nothing inline, no framing.
CSP: Final = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
#: The headers of every file of the console.
STRICT_HEADERS: Final = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}


@dataclass(frozen=True)
class Asset:
    body: bytes
    content_type: str
    etag: str


def load_assets() -> dict[str, Asset]:
    """The console's files by name (``index.html``, ``app.js``, …), as the package holds them."""
    root = resources.files(_PACKAGE).joinpath(_DIRECTORY)
    assets = {}
    for entry in root.iterdir():
        suffix = entry.name[entry.name.rfind(".") :] if "." in entry.name else ""
        if not entry.is_file() or suffix not in _TYPES:
            continue
        body = entry.read_bytes()
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        assets[entry.name] = Asset(body, _TYPES[suffix], etag)
    if _INDEX not in assets:
        raise RuntimeError(f"the console's {_INDEX} is missing from the package ({root})")
    return assets


def is_console_path(path: str) -> bool:
    """Whether ``path`` is the console's (served without an API key)."""
    return path == "/" or path.startswith(PREFIX)


def install(app: QuartTrio) -> None:
    """Serve the console on ``app``: ``GET /`` and ``GET /console/<name>``."""
    assets = load_assets()

    def answer(name: str) -> Response:
        asset = assets.get(name)
        if asset is None:
            return error_response(404, "route_not_found", f"no console file {name!r}")
        if _matches(asset.etag):
            response = Response(b"", status=304)
        else:
            response = Response(asset.body, content_type=asset.content_type)
        response.headers.update(STRICT_HEADERS)
        response.headers["ETag"] = asset.etag
        return response

    @app.get("/")
    async def console_page() -> Response:
        return answer(_INDEX)

    @app.get(PREFIX + "<name>")
    async def console_file(name: str) -> Response:
        return answer(name)


def _matches(etag: str) -> bool:
    """``If-None-Match`` names ``etag`` (in a list, or ``*``)."""
    header = request.headers.get("If-None-Match", "")
    tags = {t.strip().removeprefix("W/") for t in header.split(",")}
    return etag in tags or "*" in tags
