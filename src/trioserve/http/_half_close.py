"""A client that half-closed its connection after a whole request: what is still owed it.

RFC 9112 §9.6 lets a client shut down its sending side once its request is
out (``shutdown(SHUT_WR)``; ``nc -N``, some proxies and test harnesses do)
and read the response; the server finishes it.  The server cannot tell such
a client by its EOF alone from one that closed the socket altogether and
left: both send a FIN.  The difference shows when the server writes: a
socket that is gone answers with a reset.

So, after an EOF that ends a complete request whose response is not done
(``response_owed``), the connection keeps serving it, and finds a client
that left by writing: any response data it writes anyway, and for an SSE
stream, which may stay silent for a long time, one SSE comment at once
(``PROBE``, the ``: keep-alive`` every SSE client ignores).  A reset comes
back within a round trip; ``reset_wait`` is how long to give it (twice the
connection's smoothed round-trip time, at least 20 ms), and ``peer_reset``
whether it came (the socket's TCP state is ``CLOSE``).  A client that is
gone is then told to the application as a disconnect, as at any EOF before.

This module holds those rules without I/O beyond reading the socket's
``TCP_INFO``; ``_connections.Connection`` applies them.
"""

from __future__ import annotations

import socket
import struct
from typing import Any, Final

import h11

#: The SSE comment written to a half-closed client's stream to find whether it is there.
PROBE: Final = b": keep-alive\n\n"
_TCP_CLOSE: Final = 7  # ``tcpi_state`` of a socket the peer reset
_TCP_INFO_SIZE: Final = 104
_RTT_OFFSET: Final = 68  # ``tcpi_rtt``, microseconds
_MIN_WAIT: Final = 0.02
_SSE_HEAD: Final = b"\r\ncontent-type: text/event-stream"


def response_owed(protocol: Any) -> bool:
    """Whether hypercorn's HTTP/1.1 ``protocol`` has read a whole request and not
    finished its response (``False`` for a WebSocket: it has no such request)."""
    connection = getattr(protocol, "connection", None)
    return (
        isinstance(connection, h11.Connection)
        and connection.their_state is h11.DONE
        and connection.our_state in (h11.SEND_RESPONSE, h11.SEND_BODY)
    )


def is_sse_head(data: bytes) -> bool:
    """Whether ``data`` is the head of a successful SSE response."""
    return data.startswith(b"HTTP/1.1 2") and _SSE_HEAD in data.partition(b"\r\n\r\n")[0].lower()


def probe_chunk(protocol: Any) -> bytes | None:
    """``PROBE`` framed as the next chunk of ``protocol``'s response body, or ``None``
    once the response is complete (nothing may follow it)."""
    connection = getattr(protocol, "connection", None)
    if not isinstance(connection, h11.Connection) or connection.our_state is not h11.SEND_BODY:
        return None
    try:
        return connection.send(h11.Data(data=PROBE))
    except h11.LocalProtocolError:
        return None


def _tcp_info(sock: Any) -> bytes | None:
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_SIZE)
    except OSError:
        return None
    return info if isinstance(info, bytes) and len(info) >= _RTT_OFFSET + 4 else None


def reset_wait(sock: Any) -> float:
    """Seconds a reset would take to come back: 2 x the smoothed RTT, at least 20 ms."""
    info = _tcp_info(sock)
    rtt = 0.0 if info is None else struct.unpack_from("I", info, _RTT_OFFSET)[0] / 1e6
    return max(_MIN_WAIT, 2 * rtt)


def peer_reset(sock: Any) -> bool:
    """Whether the client reset the connection (or it can no longer be asked)."""
    info = _tcp_info(sock)
    return info is None or info[0] == _TCP_CLOSE
