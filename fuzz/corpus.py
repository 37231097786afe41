"""Valid requests to start from: HTTP/1.1 heads with their bodies, and WebSocket frames."""

from __future__ import annotations

import base64
import json
import os
import struct


def request(
    method: str,
    target: str,
    body: bytes = b"",
    *,
    chunked: bool = False,
    headers: tuple[tuple[str, str], ...] = (),
) -> bytes:
    """One request as sent: request line, headers, body (``Content-Length`` or chunked)."""
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{name}: {value}" for name, value in headers]
    if chunked:
        lines.append("Transfer-Encoding: chunked")
        middle = len(body) // 2
        parts = [body[:middle], body[middle:]]
        framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts if p) + b"0\r\n\r\n"
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + framed
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def seeds(session_id: str, turn_id: str) -> list[bytes]:
    """Requests every route answers with a success, for a session and turn that exist."""
    s = f"/v1/sessions/{session_id}"
    turn = json.dumps({"input": "fuzz", "detach": True}).encode()
    create = json.dumps({"inputs": {"topic": "fuzz"}}).encode()
    return [
        request("GET", "/healthz"),
        request("GET", "/readyz"),
        request("GET", "/openapi.json"),
        request("GET", "/metrics"),
        request("GET", "/v1/sessions?limit=3"),
        request("GET", "/v1/sessions?status=active&limit=2"),
        request("POST", "/v1/sessions", create, headers=(("Content-Type", "application/json"),)),
        request("POST", "/v1/sessions", create, chunked=True),
        request("POST", "/v1/sessions", create, headers=(("Idempotency-Key", "fuzz-key-1"),)),
        request("GET", s),
        request("GET", f"{s}/turns"),
        request("GET", f"{s}/turns/{turn_id}"),
        request("GET", f"{s}/events?after=0&format=json"),
        request("GET", f"{s}/events?after=0&turn={turn_id}", headers=(("Last-Event-ID", "1"),)),
        request("POST", f"{s}/turns", turn),
        request("POST", f"{s}/turns", turn, chunked=True),
        request("DELETE", f"{s}/turns/current"),
        request("GET", "/v1/sessions?before=" + session_id),
        request("OPTIONS", "/v1/sessions"),
        request("HEAD", "/healthz"),
    ]


def ws_handshake(session_id: str) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return request(
        "GET",
        f"/v1/sessions/{session_id}/ws",
        headers=(
            ("Upgrade", "websocket"),
            ("Connection", "Upgrade"),
            ("Sec-WebSocket-Key", key),
            ("Sec-WebSocket-Version", "13"),
        ),
    )


def frame(
    payload: bytes,
    opcode: int = 1,
    *,
    fin: bool = True,
    rsv: int = 0,
    mask: bytes | None = b"\x01\x02\x03\x04",
    length: int | None = None,
) -> bytes:
    """A WebSocket frame (client frames are masked); ``length`` lies about the payload."""
    size = len(payload) if length is None else length
    first = (0x80 if fin else 0) | (rsv & 0x7) << 4 | (opcode & 0xF)
    masked = 0x80 if mask is not None else 0
    if size < 126:
        head = bytes([first, masked | size])
    elif size < 1 << 16:
        head = bytes([first, masked | 126]) + struct.pack("!H", size)
    else:
        head = bytes([first, masked | 127]) + struct.pack("!Q", size & (1 << 64) - 1)
    if mask is None:
        return head + payload
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


WS_MESSAGES = [
    b'{"type":"ping"}',
    b'{"type":"resume","after":0}',
    b'{"type":"turn","input":"fuzz"}',
    b'{"type":"cancel"}',
]
