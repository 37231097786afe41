"""Request heads as strict as RFC 9110 and 9112 allow: what is refused before any route.

h11 parses requests leniently where the RFCs let a server choose, and a
lenient parse is where two parsers (a proxy's and this server's) disagree,
or where the web framework above trips.  ``head_problem`` checks a request
head h11 has parsed, before hypercorn hands it to the application (so
before quart builds a request context: werkzeug's ``BadHost`` on a ``Host``
of an empty or over-long label was a ``500``); ``apply`` makes h11 itself
refuse what it would otherwise accept.  Each refusal is the error envelope
with ``Connection: close`` (``_hypercorn_fixes`` sends it):

- a request head over ``h11_max_incomplete_size``, however it arrived: ``431``;
- ``Content-Length`` with ``Transfer-Encoding``: ``400`` (RFC 9112 §6.1: what a
  proxy framed by the other header would be a smuggled request);
- a method outside the standard ones, in upper case (RFC 9110 §9.1: methods
  are case-sensitive, so ``get`` is an unknown method): ``501``;
- a ``Host`` that is not ``host[:port]`` (RFC 9110 §7.2, RFC 3986 §3.2.2): a
  name of dot-separated labels of letters, digits, ``-`` and ``_``, each 1-63
  characters and 253 in all (an IDNA name is sent in its ``xn--`` form), an
  IPv4 address, or a bracketed IPv6 address; a port of up to 5 digits, at
  most 65535.  No percent-encoding, no user info, nothing else: ``400``;
- more than one ``Authorization`` header (which one would be the key?): ``400``;
- obs-fold, a header line continued on the next line that starts with a space
  or a tab (RFC 9112 §5.2 lets a server refuse it; a folded
  ``Transfer-Encoding: chunked`` was honoured): ``400``;
- a chunk size over 16 hex digits (2^64 and more), as soon as its 17th digit
  arrives, or over 2^63 - 1 (what a signed 64-bit length holds, as in Go):
  ``400``, instead of waiting for a body that size.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Final

import h11
from h11 import _readers

from trioserve.http._browser import split_host

#: The methods served, as RFC 9110 spells them (case-sensitive).
METHODS: Final = frozenset(
    {b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"CONNECT", b"OPTIONS", b"TRACE", b"PATCH"}
)
#: A chunk size has at most this many hex digits (2^64 - 1).
MAX_CHUNK_DIGITS: Final = 16
#: The largest chunk accepted: what a signed 64-bit length holds.
MAX_CHUNK: Final = 2**63 - 1
_SHOWN: Final = 80  # characters of a refused value in a message
_HEX: Final = frozenset(b"0123456789abcdefABCDEF")


def head_too_large(limit: int) -> str:
    return f"request head (request line and headers) larger than {limit} bytes"


def head_size(request: h11.Request) -> int:
    """The bytes of ``request``'s head as h11 parsed it (without optional whitespace)."""
    line = len(request.method) + len(request.target) + len(request.http_version) + 9
    fields = sum(len(name) + len(value) + 3 for name, value in request.headers.raw_items())
    return line + fields + 2


_ABSOLUTE_FORM: Final = re.compile(rb"[Hh][Tt][Tt][Pp][Ss]?://[^/?#]*/")


def _valid_target(target: bytes, method: bytes) -> bool:
    """Origin-form, absolute-form with a path, or asterisk-form for OPTIONS (quart takes
    the path of any other as empty, and failed on it: a 500; found by ``nox -s fuzz``)."""
    if target.startswith(b"/"):
        return True
    if target == b"*":
        return method == b"OPTIONS"
    return _ABSOLUTE_FORM.match(target) is not None


def head_problem(request: h11.Request, limit: int) -> tuple[int, str, str] | None:
    """Why ``request``'s head is refused (status, reason, message), or ``None``."""
    if head_size(request) > limit:
        return 431, "headers_too_large", head_too_large(limit)
    if request.method not in METHODS:
        method = _shown(request.method)
        return (
            501,
            "not_implemented",
            f"method {method} is not implemented (methods are case-sensitive: "
            + ", ".join(sorted(m.decode() for m in METHODS))
            + ")",
        )
    if not _valid_target(request.target, request.method):
        return (
            400,
            "bad_request",
            f"malformed request target {_shown(request.target)}: expected a path that starts"
            " with '/', an absolute http(s) URI with a path, or '*' for OPTIONS (RFC 9112 §3.2)",
        )
    hosts: list[bytes] = []
    authorizations = 0
    framing = set()
    for name, value in request.headers:  # names lower-case
        if name == b"host":
            hosts.append(value)
        elif name == b"authorization":
            authorizations += 1
        elif name in (b"content-length", b"transfer-encoding"):
            framing.add(name)
    if len(framing) == 2:
        return (
            400,
            "bad_request",
            "a request may not have both Content-Length and Transfer-Encoding",
        )
    if authorizations > 1:
        return 400, "bad_request", "a request may have one Authorization header, not several"
    for host in hosts:  # h11 allows one at most (none in HTTP/1.0)
        if not valid_host(host):
            return (
                400,
                "bad_request",
                f"malformed Host header {_shown(host)}: expected host[:port], the host a"
                " name (labels of letters, digits, '-', '_', 1-63 characters each), an IPv4"
                " address or a bracketed IPv6 address",
            )
    return None


@functools.lru_cache(maxsize=256)  # a client sends the same Host with every request
def valid_host(value: bytes) -> bool:
    """Whether a ``Host`` header value is ``host[:port]`` (see the module doc)."""
    try:
        text = value.decode("ascii")
    except UnicodeDecodeError:
        return False
    if text != text.strip() or "%" in text:
        return False
    split = split_host(text)
    if split is None:
        return False
    host = split[0]
    if host.startswith("["):
        return True
    labels = host.split(".")
    return len(host) <= 253 and all(1 <= len(label) <= 63 for label in labels)


def _shown(value: bytes) -> str:
    """A refused value for a message: escaped, and cut at ``_SHOWN`` characters."""
    text = ascii(value[:_SHOWN].decode("latin-1"))
    return text + ("..." if len(value) > _SHOWN else "")


# -- what h11 is made to refuse ----------------------------------------------------------

_unfolded = _readers._obsolete_line_fold
_chunked = _readers.ChunkedReader.__call__


def _no_obs_fold(lines: Any) -> Any:
    for line in lines:
        if line[:1] in (b" ", b"\t"):
            raise h11.LocalProtocolError(
                "obsolete line folding (a header line that starts with a space or a tab)"
                " is not accepted (RFC 9112 §5.2)",
                error_status_hint=400,
            )
        yield line


def _bounded_chunks(self: Any, buf: Any) -> Any:
    at_size = not self._reading_trailer and not self._bytes_to_discard and not self._bytes_in_chunk
    event = _chunked(self, buf)
    size = self._bytes_in_chunk + (len(event.data) if isinstance(event, h11.Data) else 0)
    if at_size and size > MAX_CHUNK:
        raise h11.LocalProtocolError(
            f"chunk size {size:#x} is larger than {MAX_CHUNK:#x}", error_status_hint=400
        )
    if event is None and at_size and len(buf) > MAX_CHUNK_DIGITS:
        start = bytes(buf)[: MAX_CHUNK_DIGITS + 1]
        if all(byte in _HEX for byte in start):
            raise h11.LocalProtocolError(
                f"chunk size of more than {MAX_CHUNK_DIGITS} hex digits", error_status_hint=400
            )
    return event


def apply() -> None:
    """Make h11 refuse obs-fold and oversized chunk sizes (idempotent)."""
    _readers._obsolete_line_fold = _no_obs_fold
    _readers.ChunkedReader.__call__ = _bounded_chunks  # type: ignore[method-assign]
