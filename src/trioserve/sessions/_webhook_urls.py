"""Where a webhook may go: the URL checks that keep a client from aiming the server at
its own network (SSRF).

A turn's ``webhook`` URL (``http`` or ``https``, no user or password) is
accepted only when its host is allowed by ``--webhook-allow``, whose
entries are a host name or an IP address (an *explicit* entry), a domain
under which every name is allowed (``*.example.com``), or ``*`` (any
host).  A private, loopback, link-local (cloud metadata, ``169.254.*``),
multicast, reserved or unspecified address is refused unless the host is
listed explicitly: a literal one at once, a name that resolves to one
when the turn is requested and again at every attempt, when the
connection is made to the very address checked (``WebhookPolicy.addresses``,
the deliverer's network backend), so a name re-pointed in between
(DNS rebinding) reaches nothing it should not.  The operator's own
``--webhook`` URL is explicit.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from typing import Final

import trio

from trioserve.errors import InvalidRequest

__all__ = ["FIELD", "WebhookPolicy", "WebhookRefused", "blocked_address", "url_host"]

#: The request field a refusal names.
FIELD: Final = "webhook"
_MAX_URL: Final = 2048

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class WebhookRefused(Exception):
    """A webhook's host or address is not allowed (at delivery time: the attempt fails)."""


def blocked_address(address: IPAddress) -> bool:
    """Whether ``address`` is one a webhook reaches only when listed explicitly."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return (
        address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
    )


def _ip(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None


def url_host(url: str) -> str:
    """``url``'s host as the webhook client reads it (``""``: it cannot be read)."""
    import httpx  # only in a server with webhooks: start-up need not load it

    try:
        return httpx.URL(url).host
    except httpx.InvalidURL:
        return ""


class WebhookPolicy:
    """``--webhook-allow`` and the explicit hosts; see the module doc."""

    def __init__(self, allow: Iterable[str], explicit: Iterable[str] = ()) -> None:
        self.allow = tuple(entry.strip().lower() for entry in allow if entry.strip())
        self._any = "*" in self.allow
        self._domains = tuple(e[1:] for e in self.allow if e.startswith("*.") and len(e) > 2)
        exact = (e for e in self.allow if e != "*" and not e.startswith("*."))
        self._explicit = frozenset(_host_key(h) for h in (*exact, *explicit))

    def explicit(self, host: str) -> bool:
        return _host_key(host) in self._explicit

    def permits(self, host: str) -> bool:
        """Whether ``host`` is allowed at all (its addresses are checked apart)."""
        key = _host_key(host)
        return self._any or key in self._explicit or any(key.endswith(d) for d in self._domains)

    async def check(self, url: str) -> str:
        """``url`` if a turn may carry it (resolving its host if it is a name not listed
        explicitly), else ``InvalidRequest`` naming the field and the reason."""
        if len(url) > _MAX_URL:
            raise InvalidRequest(f"{FIELD}: expected a URL of at most {_MAX_URL} characters")
        import httpx  # as in url_host

        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, TypeError) as exc:
            raise InvalidRequest(f"{FIELD}: expected an http(s) URL, got {url!r} ({exc})") from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise InvalidRequest(f"{FIELD}: expected an http:// or https:// URL, got {url!r}")
        if parsed.userinfo:
            raise InvalidRequest(f"{FIELD}: a user or password in the URL is not accepted")
        host = parsed.host
        if not self.permits(host):
            allowed = ", ".join(self.allow) if self.allow else "none: the list is empty"
            raise InvalidRequest(
                f"{FIELD}: host {host!r} is not allowed (--webhook-allow: {allowed})"
            )
        if self.explicit(host):  # listed by itself: any address (resolved at each attempt)
            return url
        try:
            await self.addresses(host, parsed.port or (443 if parsed.scheme == "https" else 80))
        except WebhookRefused as exc:
            raise InvalidRequest(f"{FIELD}: {exc}") from None
        return url

    async def addresses(self, host: str, port: int) -> list[str]:
        """The addresses of ``host`` a webhook may connect to (all of them: one refused
        address refuses the host); ``WebhookRefused`` says why not."""
        literal = _ip(host)
        explicit = self.explicit(host)
        if literal is not None:
            if blocked_address(literal) and not explicit:
                raise WebhookRefused(
                    f"address {host} is private, loopback or link-local; list it in"
                    " --webhook-allow to allow it"
                )
            return [str(literal)]
        if explicit:  # the operator named it: its addresses, whatever they are
            return await _resolve(host, port)
        found = await _resolve(host, port)
        blocked = [a for a in found if blocked_address(ipaddress.ip_address(a))]
        if blocked:
            raise WebhookRefused(
                f"host {host!r} resolves to {blocked[0]}, a private, loopback or link-local"
                " address; list the host in --webhook-allow to allow it"
            )
        return found


def _host_key(host: str) -> str:
    key = host.strip().lower().rstrip(".")
    if key.startswith("[") and key.endswith("]"):
        key = key[1:-1]
    literal = _ip(key)
    return key if literal is None else str(literal)


async def _resolve(host: str, port: int) -> list[str]:
    try:
        infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise WebhookRefused(f"host {host!r} does not resolve ({exc.strerror or exc})") from None
    found = list(dict.fromkeys(str(info[4][0]).split("%", 1)[0] for info in infos))
    if not found:
        raise WebhookRefused(f"host {host!r} has no address")
    return found
