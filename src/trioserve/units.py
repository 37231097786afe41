"""Durations, sizes and addresses: the parsers and printers of every flag's values.

Durations read as Go's ``time.ParseDuration`` does (``168h``, ``1h30m``,
``500ms``) or as plain seconds, so the reference's flags work unchanged.
"""

from __future__ import annotations

import ipaddress
import re

_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h|d)")
_PLAIN_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kib": 1024,
    "m": 1024**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gib": 1024**3,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
}
_SIZE = re.compile(r"([0-9]+)\s*([a-z]*)")


def parse_duration(text: str) -> float:
    """Parse a Go-style duration (``168h``, ``1h30m``, ``500ms``) or plain seconds.

    Returns seconds.  ``0`` is allowed; negative values are not.
    """
    value = text.strip()
    if not value:
        raise ValueError("empty duration")
    if value.startswith("-"):
        raise ValueError(f"invalid duration {text!r}: must be non-negative (0 or more)")
    if _PLAIN_SECONDS.fullmatch(value):
        return float(value)
    pos = 0
    total = 0.0
    for match in _DURATION_PART.finditer(value):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    if pos != len(value) or pos == 0:
        raise ValueError(
            f"invalid duration {text!r}: must be a non-negative number of seconds (30)"
            " or use units like 500ms, 30s, 1h30m, 7d"
        )
    return total


def parse_size(text: str) -> int:
    """Parse a byte size: ``8388608``, ``8MiB``, ``64k``, ``1MB``."""
    match = _SIZE.fullmatch(text.strip().lower())
    if not match or match.group(2) not in _SIZE_UNITS:
        raise ValueError(f"invalid size {text!r}: use bytes (1048576) or units like 64KiB, 8MiB")
    size = int(match.group(1)) * _SIZE_UNITS[match.group(2)]
    if size <= 0:
        raise ValueError(f"invalid size {text!r}: must be positive")
    return size


def parse_bind(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9100`` for IPv6) as ``(host, port)``; port 0 picks a free one."""
    host, colon, port = text.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not colon or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"invalid address {text!r}: expected HOST:PORT, like 127.0.0.1:9100")
    return host, int(port)


def format_size(size: int) -> str:
    """The inverse of ``parse_size`` for display (``8MiB``, ``64KiB``, ``1000``)."""
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


def format_duration(seconds: float) -> str:
    """The inverse of ``parse_duration`` for display (``25s``, ``168h``, ``1.5s``)."""
    if seconds == 0:
        return "0s"
    for unit, scale in (("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= scale and seconds % scale == 0:
            return f"{int(seconds // scale)}{unit}"
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (``127.0.0.0/8``, ``::1``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
