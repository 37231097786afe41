"""Browser defence: the ``Host`` a request may name, the ``Origin`` it may come from, CORS.

A web page can make its visitor's browser send requests to any address,
``127.0.0.1`` included.  Two checks keep such pages out:

- **Host** (``--allowed-hosts``): a DNS-rebinding page makes its own name
  resolve to the server, so the browser sends ``Host: evil.example``; only
  the names the server is known by are answered (``421`` otherwise).
- **Origin** (``--cors-origins``): a request from a page carries that
  page's ``Origin``; one not listed is refused (``403``), whatever the
  method, so a cross-origin ``text/plain`` POST (no preflight) starts
  nothing, and a WebSocket (which browsers never subject to CORS) is not
  opened.  Clients that are not browsers send no ``Origin``.

Listed origins get CORS headers and preflight answers.  This module holds
the rules as plain functions; ``app.py`` applies them to each request.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterable
from typing import Final

from trioserve.units import is_loopback

#: Allows any ``Host``.
ANY_HOST: Final = "*"

#: Names a server bound to loopback (or to every interface) is reached by, any port.
LOOPBACK_NAMES: Final = ("localhost", "127.0.0.1", "[::1]")

#: Methods and request headers a listed origin may use (the preflight's answer).
ALLOW_METHODS: Final = "GET, POST, DELETE"
ALLOW_HEADERS: Final = "Authorization, Content-Type, Last-Event-ID, traceparent, tracestate"
#: Response headers a page may read besides the CORS-safelisted ones.
EXPOSE_HEADERS: Final = (
    "Trioserve-Turn-Id, Retry-After, Location, Trioserve-Next-Page, Link, WWW-Authenticate"
)
#: How long a browser may cache a preflight answer (seconds).
PREFLIGHT_MAX_AGE: Final = 600

_HOSTNAME: Final = re.compile(
    r"(?:[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?\.)*[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?"
)
_PORT: Final = re.compile(r"[0-9]{1,5}")
_ORIGIN: Final = re.compile(r"(https?)://([^/?#@\s]+)")


@functools.lru_cache(maxsize=256)  # a client sends the same Host with every request
def split_host(value: str) -> tuple[str, str | None] | None:
    """``(host, port)`` of a ``Host`` value, the host lower-case (``[v6]`` kept in brackets);
    ``None`` if it is not a host name, an IPv4 address or a bracketed IPv6 address
    with an optional port."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        host, rest = value[: end + 1], value[end + 1 :]
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return None
    else:
        host, sep, rest = value.partition(":")
        rest = sep + rest
        host = host.removesuffix(".")  # "localhost." is "localhost"
        if not _HOSTNAME.fullmatch(host):
            return None
    if not rest:
        return host, None
    port = rest.removeprefix(":")
    if rest[0] != ":" or not _PORT.fullmatch(port) or int(port) > 65535:
        return None
    return host, port


def parse_hosts(text: str) -> tuple[str, ...]:
    """``--allowed-hosts``: comma-separated names, each optionally with ``:PORT``, or ``*``."""
    hosts = []
    for item in text.split(","):
        item = item.strip()
        if item == ANY_HOST:
            hosts.append(ANY_HOST)
            continue
        split = split_host(item) if item else None
        if split is None:
            raise ValueError(
                f"invalid host {item!r}: expected a name or address as clients write it in"
                " the Host header (agents.example.com, 10.0.0.5, [fd00::5]), optionally"
                " with :PORT, or *"
            )
        host, port = split
        hosts.append(host if port is None else f"{host}:{port}")
    return tuple(hosts)


def parse_origins(text: str) -> tuple[str, ...]:
    """``--cors-origins``: comma-separated ``http(s)://HOST[:PORT]`` origins, lower-case."""
    origins = []
    for item in text.split(","):
        item = item.strip()
        match = _ORIGIN.fullmatch(item.lower().removesuffix("/"))
        if match is None or split_host(match.group(2)) is None:
            raise ValueError(
                f"invalid origin {item!r}: expected scheme://host[:port] as a browser sends it"
                " in the Origin header, e.g. https://console.example.com (no path)"
            )
        origins.append(match.group(0))
    return tuple(origins)


def default_hosts(bind: str) -> tuple[str, ...]:
    """The ``Host`` names a server bound to ``bind`` answers to by default (any port).

    The bound address itself; for loopback, or every interface (which
    includes loopback), also ``localhost``, ``127.0.0.1`` and ``[::1]``.
    """
    address = bind.strip("[]").lower()
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        own = address
        wildcard = address == ""
    else:
        own = f"[{ip}]" if ip.version == 6 else str(ip)
        wildcard = ip.is_unspecified
    names = [own] if own else []
    if is_loopback(address) or wildcard:
        names += [n for n in LOOPBACK_NAMES if n not in names]
    return tuple(names)


def host_allowed(header: str | None, allowed: Iterable[str]) -> bool:
    """Whether a request's ``Host`` header value is one of ``allowed``.

    An entry without a port allows the name with any port; ``*`` allows
    anything, a missing or malformed header too.
    """
    allowed = tuple(allowed)
    if ANY_HOST in allowed:
        return True
    split = None if header is None else split_host(header)
    if split is None:
        return False
    host, port = split
    return host in allowed or (port is not None and f"{host}:{port}" in allowed)


def origin_allowed(origin: str, allowed: Iterable[str]) -> bool:
    """Whether an ``Origin`` header value is one of the listed origins (exactly, any case)."""
    return origin.strip().lower() in tuple(allowed)


def same_origin(origin: str, host: str | None) -> bool:
    """Whether ``origin`` is the server's own: ``http(s)://`` and the request's ``Host``.

    A page the server itself served (the web console) sends its ``Origin``
    with each ``POST`` and ``DELETE``; it names the ``Host`` the browser
    connected to, which the guard has checked against ``--allowed-hosts``
    first, so a DNS-rebinding page (``Host: evil.example``) is still refused.
    """
    match = _ORIGIN.fullmatch(origin.strip().lower())
    if match is None or host is None:
        return False
    own, theirs = split_host(match.group(2)), split_host(host)
    if own is None or theirs is None:
        return False
    default = "443" if match.group(1) == "https" else "80"
    return own[0] == theirs[0] and (own[1] or default) == (theirs[1] or default)


def cors_headers(origin: str) -> dict[str, str]:
    """The headers of a response to a listed ``origin`` (no credentials: no cookies)."""
    return {"Access-Control-Allow-Origin": origin, "Access-Control-Expose-Headers": EXPOSE_HEADERS}


def preflight_headers(origin: str) -> dict[str, str]:
    """The headers of a ``204`` answer to a listed ``origin``'s preflight ``OPTIONS``."""
    return {
        "Access-Control-Allow-Origin": origin,
        "Access-Control-Allow-Methods": ALLOW_METHODS,
        "Access-Control-Allow-Headers": ALLOW_HEADERS,
        "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE),
    }
