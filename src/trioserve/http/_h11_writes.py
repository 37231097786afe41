"""A response's head and a stream's chunks, written with one check of the head.

hypercorn writes a response through h11, which checks every header name
and value with a regular expression when the ``h11.Response`` is made; a
stream's head (``Transfer-Encoding: chunked``) is made again, and checked
again, when h11 adds the framing header.  Each body chunk goes through h11's
state machine, which does nothing for a chunk but frame it.  For a
create + turn that was 1.5 % of the server's instructions (docs/benchmarks.md,
go-peer).

``H11Protocol.stream_send`` is replaced by one that:

- makes a final response's ``h11.Response`` as parsed (no second look) once
  its headers pass one check of them all at once: every name a token, no
  value with a control character (tab aside).  A head that fails it is made
  as before, so h11 refuses it with its own error;
- takes the server's own headers (``Date``, ``Server``) from a copy made once a
  second, not once a response;
- frames a chunk of a chunked body itself (``<size>\\r\\n<data>\\r\\n``, what h11's
  ``ChunkedWriter`` writes) when h11 is sending that body; anything else
  (a body with a length, the end of a body, a connection h11 is not sending
  a body on) goes through h11 as before.
"""

from __future__ import annotations

import re
from itertools import chain
from operator import itemgetter
from time import time
from typing import Any, Final

import h11
from h11._writers import ChunkedWriter
from hypercorn.config import Config
from hypercorn.events import RawData
from hypercorn.protocol.events import Body, Response
from hypercorn.protocol.h11 import H11Protocol

#: Header names joined by spaces: tokens (RFC 9110 §5.1) and nothing else.
_NAMES: Final = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+(?: [-!#$%&'*+.^_`|~0-9A-Za-z]+)*")
#: The characters no header value may have (RFC 9110 §5.5): the controls, but tab (and
#: line feed, which joins the values here and is counted apart).
_CONTROLS: Final = bytes([*range(0x09), *range(0x0B, 0x20), 0x7F])
#: What a value may not begin or end with.
_BLANK: Final = (b" ", b"\t")
_NAME, _VALUE = itemgetter(0), itemgetter(1)

_stream_send = H11Protocol.stream_send


def headers_ok(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether h11 would take every header of ``headers`` (one check for them all)."""
    if not headers:
        return True
    last = len(headers) - 1
    names = b" ".join(map(_NAME, headers))
    values = b"\n".join(map(_VALUE, headers))
    return (
        names.count(b" ") == last
        and _NAMES.fullmatch(names) is not None
        and values.count(b"\n") == last
        and len(values.translate(None, _CONTROLS)) == len(values)
        and values[:1] not in _BLANK
        and values[-1:] not in _BLANK
        and b"\n " not in values  # one value's start or another's end, in between
        and b" \n" not in values
        and b"\n\t" not in values
        and b"\t\n" not in values
    )


class _ServerHeaders:
    """``config.response_headers("h11")`` (``Date``, ``Server``), made once a second."""

    def __init__(self) -> None:
        self._key: tuple[int, int] = (0, -1)
        self._headers: tuple[tuple[bytes, bytes], ...] = ()

    def of(self, config: Config) -> tuple[tuple[bytes, bytes], ...]:
        key = (id(config), int(time()))
        if key != self._key:
            self._headers = tuple(config.response_headers("h11"))
            self._key = key
        return self._headers


_server_headers: Final = _ServerHeaders()


async def stream_send(self: Any, event: Any) -> None:
    """``H11Protocol.stream_send``, for a final response and a chunk (see the module doc)."""
    kind = type(event)
    if kind is Body:
        connection: h11.Connection = self.connection
        if connection.our_state is h11.SEND_BODY and type(connection._writer) is ChunkedWriter:
            data = event.data
            if data:  # an empty chunk would read as the end of the body: h11 writes none
                await self.send(RawData(data=b"%x\r\n%b\r\n" % (len(data), data)))
            return
    elif kind is Response and event.status_code >= 200:
        config = self.config
        headers = list(chain(event.headers, _server_headers.of(config)))
        if self.keep_alive_requests >= config.keep_alive_max_requests:
            headers.append((b"connection", b"close"))
        if headers_ok(headers):
            response = h11.Response(
                headers=headers,
                status_code=event.status_code,
                reason=b"",  # the phrase is set on the way out (``_hypercorn_fixes``)
                http_version=b"1.1",
                _parsed=True,
            )
            await self._send_h11_event(response)
            return
    await _stream_send(self, event)


def apply() -> None:
    """Install ``stream_send`` (idempotent)."""
    H11Protocol.stream_send = stream_send  # type: ignore[method-assign]
