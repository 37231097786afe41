"""How many connections the listener keeps open: in all, and per client address.

``ConnectionCaps`` counts the open connections and decides, when one is
accepted, whether it may be served or is refused with a ready-made answer:

- ``503 too_many_connections`` once ``--max-connections`` are open and
  none of them is idle (the server is full: a load balancer retries
  elsewhere); while one is, the one idle longest is closed instead
  (``_idle``);
- ``429 address_connection_cap`` once the client's address has
  ``--max-connections-per-ip`` open (this client holds its share: it should
  wait or reuse a connection).  An IPv4 address counts alone; an IPv6
  address counts with its /64, the block one host is usually given, so a
  host cannot dodge the cap by cycling through its own addresses; an
  IPv4-mapped IPv6 address (a dual-stack bind) counts as its IPv4 address.
  Loopback counts like any other address.

Both answers are the JSON envelope with ``Retry-After: 1`` and
``Connection: close``, sent without reading the request (``_connections``
sends them and lingers).  The per-address cap is what keeps one client
from taking every connection of ``--max-connections``; behind a proxy every
client has the proxy's address, so the cap is then the proxy's, and is
raised or turned off (``0``) there (docs/operations.md, "Connections").

``auto_max_connections`` is the default ``--max-connections``: what
RLIMIT_NOFILE leaves once adapters and the server's own descriptors are
provided for, so a turn never fails to start its adapter because
connections took the descriptors.
"""

from __future__ import annotations

import ipaddress
import logging
import resource
from collections import Counter
from collections.abc import Callable
from http import HTTPStatus
from typing import Final

import trio

from trioserve.http._hypercorn_fixes import envelope, error_headers
from trioserve.sessions import Limits

log = logging.getLogger("trioserve.connections")

#: Descriptors one adapter process holds in the server: 3 pipes and a pidfd.
FDS_PER_ADAPTER: Final = 4
#: Descriptors kept back for the server itself: stdio, logs, the store's
#: files, the listening socket, Trio's own, the reaper's pipe, the pipes of
#: adapters being spawned, refusals in flight.
FDS_RESERVED: Final = 64
LOG_INTERVAL: Final = 1.0
_V6_BLOCK: Final = 64  # the prefix length an IPv6 address counts under


def open_file_limit() -> int | None:
    """The soft RLIMIT_NOFILE, or None if there is none."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def auto_max_connections(limits: Limits, nofile: int | None) -> int:
    """The default ``--max-connections`` for ``nofile`` descriptors (0: no cap).

    ``nofile - 4 * (max_concurrent_turns + warm) - 64``; with no turn cap,
    half of ``nofile - 4 * warm - 64``; ``warm`` is the most warm adapters
    the pool may hold (``Limits.warm_ceiling``).  At
    least 1.
    """
    if nofile is None:
        return 0
    warm = limits.warm_ceiling
    free = nofile - FDS_RESERVED - FDS_PER_ADAPTER * warm
    if limits.max_concurrent_turns:
        free -= FDS_PER_ADAPTER * limits.max_concurrent_turns
    else:
        free //= 2
    return max(free, 1)


def address_key(address: str) -> str:
    """What a client address counts under: the IPv4 address, or the IPv6 /64."""
    try:
        ip = ipaddress.ip_address(address.partition("%")[0])
    except ValueError:
        return address  # not an IP (a Unix socket's path): counts as itself
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, _V6_BLOCK), strict=False))
    return str(ip)


class Throttled:
    """A log line at most once per ``interval``, counting those held back."""

    def __init__(self, interval: float = LOG_INTERVAL) -> None:
        self.interval = interval
        self.next_at = -float("inf")
        self.held = 0

    def __call__(self, level: int, message: str, *args: object) -> None:
        now = trio.current_time()
        if now < self.next_at:
            self.held += 1
            return
        if self.held:
            message += f" ({self.held} more since the last such line)"
        log.log(level, message, *args)
        self.next_at = now + self.interval
        self.held = 0


class ConnectionCaps:
    """The open connections, in all and per address (see the module doc).

    ``admit`` counts a new connection and returns ``None``, or leaves it
    uncounted and returns the bytes of its refusal; ``release`` uncounts an
    admitted one.  0 for a cap: none.
    """

    def __init__(self, max_connections: int, max_per_address: int) -> None:
        self.max_connections = max_connections
        self.max_per_address = max_per_address
        self.open = 0
        self.per_address: Counter[str] = Counter()
        self._full = refusal(
            503,
            "too_many_connections",
            f"the server has its maximum of {max_connections} connections open;"
            " retry in a moment or reuse a connection",
        )
        self._address_full = refusal(
            429,
            "address_connection_cap",
            f"this client address has its maximum of {max_per_address} connections open"
            " (--max-connections-per-ip); close one or reuse it",
        )
        self._full_log = Throttled(10.0)
        self._address_log = Throttled(10.0)

    def admit(self, key: str, evict: Callable[[], bool] | None = None) -> bytes | None:
        """``None`` (counted) or the refusal.  At ``max_connections`` it calls ``evict()``,
        unless the address is at its own cap: a connection closed for this one (``True``)
        makes room (the closed one still counts until it has closed)."""
        if (
            self.max_connections
            and self.open >= self.max_connections
            and (self._address_over(key) or evict is None or not evict())
        ):
            self._full_log(
                logging.WARNING,
                "refusing connections: %d open (--max-connections %d)",
                self.open,
                self.max_connections,
            )
            return self._full
        if self._address_over(key):
            self._address_log(
                logging.WARNING,
                "refusing connections from %s: %d open (--max-connections-per-ip %d)",
                key,
                self.per_address[key],
                self.max_per_address,
            )
            return self._address_full
        self.open += 1
        self.per_address[key] += 1
        return None

    def _address_over(self, key: str) -> bool:
        return bool(self.max_per_address) and self.per_address[key] >= self.max_per_address

    def release(self, key: str) -> None:
        self.open -= 1
        self.per_address[key] -= 1
        if not self.per_address[key]:
            del self.per_address[key]  # the table holds only addresses with connections


def refusal(status: int, reason: str, message: str) -> bytes:
    """A whole ``HTTP/1.1`` refusal: the envelope, ``Retry-After: 1``, ``Connection: close``."""
    body = envelope(status, reason, message)
    headers = [*error_headers(body), (b"retry-after", b"1")]
    head = f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n".encode()
    head += b"".join(name + b": " + value + b"\r\n" for name, value in headers)
    return head + b"\r\n" + body
