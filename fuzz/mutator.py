"""Mutations of valid requests, sent over plain sockets, and what counts as a finding.

Each case takes a valid request (``fuzz.corpus``) and applies one to three
mutations: a byte flipped, inserted or deleted (from a set of bytes that
matter to HTTP: CR, LF, NUL, space, colon, ``%``, 0xFF, ...), a line
duplicated or dropped, a number (``Content-Length``, a chunk size, a
query's) swapped for an odd one, the method's case changed, the request
cut short (then ``shutdown(SHUT_WR)``) or followed by garbage, sent in
small pieces.  WebSocket cases do a valid handshake, then send frames with
odd opcodes, reserved bits, unmasked or fragmented frames, lengths that
lie, oversized control frames, invalid UTF-8 or mutated JSON.  The answer
is read for a short while; a status ``5xx`` other than ``501``, or a
WebSocket closed with ``1011``, is a finding.
"""

from __future__ import annotations

import random
import re
import socket
import struct
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from fuzz import Findings
from fuzz.corpus import WS_MESSAGES, frame, seeds, ws_handshake

_STATUS = re.compile(rb"(?:^|\r\n)HTTP/1\.[01] (\d{3})[ \r]")
_BYTES = b'\r\n\x00 \t:%;,/?#=&"\\\x7f\xff\xc0\x80\xed'
_NUMBERS = [b"-1", b"0", b"00", b"1 1", b"+5", b"0x10", b"99999999999999999999", b"\xd9\xa1", b""]
_READ_SECONDS = 1.5
#: Cases sent at once (each on its own connection, under ``--max-connections-per-ip``).
CLIENTS = 8


def mutate(data: bytes, rng: random.Random) -> bytes:
    """``data`` with one to three mutations."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        if not out:
            break
        out = bytearray(rng.choice(_MUTATIONS)(bytes(out), rng))
    return bytes(out) or b"\r\n"


def _flip(data: bytes, rng: random.Random) -> bytes:
    i = rng.randrange(len(data))
    return data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1 :]


def _insert(data: bytes, rng: random.Random) -> bytes:
    i = rng.randrange(len(data) + 1)
    return data[:i] + bytes([rng.choice(_BYTES)]) * rng.choice((1, 1, 2, 64)) + data[i:]


def _delete(data: bytes, rng: random.Random) -> bytes:
    i = rng.randrange(len(data))
    return data[:i] + data[i + rng.randint(1, 8) :]


def _lines(data: bytes, rng: random.Random) -> bytes:
    head, sep, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    i = rng.randrange(len(lines))
    if rng.random() < 0.5:
        lines.insert(i, lines[i])  # a duplicate (Host, Content-Length, Authorization, ...)
    elif len(lines) > 1:
        del lines[i]
    return b"\r\n".join(lines) + sep + body


def _number(data: bytes, rng: random.Random) -> bytes:
    found = list(re.finditer(rb"\d+", data))
    if not found:
        return data
    m = rng.choice(found)
    return data[: m.start()] + rng.choice(_NUMBERS) + data[m.end() :]


def _method(data: bytes, rng: random.Random) -> bytes:
    method, _, rest = data.partition(b" ")
    other = rng.choice([method.lower(), b"PROPFIND", b"G\x00T", b"", method * 40, b"BREW"])
    return other + b" " + rest


def _header(data: bytes, rng: random.Random) -> bytes:
    head, sep, body = data.partition(b"\r\n\r\n")
    extra = rng.choice(
        [
            b"Host: a..b",
            b"Host: " + b"x" * 70 + b".test",
            b"Host: [::1",
            b"Transfer-Encoding: chunked",
            b"Transfer-Encoding: gzip, chunked",
            b"Content-Length: 5",
            b" folded: continuation",
            b"Authorization: Bearer x",
            b"Expect: 100-continue",
            b"Connection: close",
            b"Upgrade: h2c",
            b"X-" + b"a" * 9000 + b": 1",
            b"Last-Event-ID: " + rng.choice(_NUMBERS),
        ]
    )
    return head + b"\r\n" + extra + sep + body


def _truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data))]


def _append(data: bytes, rng: random.Random) -> bytes:
    return data + rng.choice([b"\r\n", b"GET / HTTP/1.1\r\n\r\n", b"\x00" * 10, b"0\r\n\r\n"])


_MUTATIONS: list[Callable[[bytes, random.Random], bytes]] = [
    _flip,
    _flip,
    _insert,
    _insert,
    _delete,
    _lines,
    _number,
    _number,
    _method,
    _header,
    _header,
    _truncate,
    _append,
]


def ws_frames(rng: random.Random) -> bytes:
    """One to four hostile frames after a valid handshake."""
    out = b""
    for _ in range(rng.randint(1, 4)):
        payload = rng.choice(WS_MESSAGES)
        kind = rng.randrange(10)
        if kind == 0:
            out += frame(mutate(payload, rng))
        elif kind == 1:
            out += frame(payload, rng.randrange(16))  # reserved and odd opcodes
        elif kind == 2:
            out += frame(payload, rsv=rng.randint(1, 7))
        elif kind == 3:
            out += frame(payload, mask=None)  # a client frame must be masked
        elif kind == 4:
            out += frame(payload[:5], fin=False) + frame(payload[5:], rng.choice((0, 1, 2)))
        elif kind == 5:
            out += frame(payload, 0)  # a continuation with nothing to continue
        elif kind == 6:
            out += frame(b"\xff\xfe\xc0\xaf" + payload)  # not UTF-8
        elif kind == 7:
            out += frame(payload, length=rng.choice((0, 126, 65535, 1 << 20, 1 << 63)))
        elif kind == 8:
            out += frame(b"x" * rng.choice((126, 200)), rng.choice((8, 9, 10)))
        else:
            code = rng.choice((0, 999, 1004, 1005, 1006, 1015, 2999, 5000, 65535))
            out += frame(struct.pack("!H", code) + b"\xff", 8)
    return out


def exchange(port: int, data: bytes, rng: random.Random, *, half_close: bool) -> bytes:
    """Send ``data`` (in pieces, sometimes), read for a while; what came back."""
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            if rng.random() < 0.2 and len(data) > 1:
                cuts = sorted(rng.sample(range(1, len(data)), min(3, len(data) - 1)))
                for start, end in zip([0, *cuts], [*cuts, len(data)], strict=True):
                    sock.sendall(data[start:end])
            else:
                sock.sendall(data)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server closed first (a refusal): read what it said
        deadline = time.monotonic() + _READ_SECONDS
        sock.settimeout(0.2)
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                if received:
                    break  # an answer whose rest is a stream or a body still coming
                continue
            except OSError:
                break
            if not chunk:
                break
            received += chunk
    return received


def _ws_close_code(data: bytes) -> int | None:
    """The code of the server's close frame in ``data`` (after the 101 head), if any."""
    _, _, frames = data.partition(b"\r\n\r\n")
    i = 0
    while i + 2 <= len(frames):
        opcode, size = frames[i] & 0xF, frames[i + 1] & 0x7F
        i += 2
        if size == 126:
            size = int.from_bytes(frames[i : i + 2], "big")
            i += 2
        elif size == 127:
            size = int.from_bytes(frames[i : i + 8], "big")
            i += 8
        if opcode == 8 and size >= 2:
            return int.from_bytes(frames[i : i + 2], "big")
        i += size
    return None


def run_batch(
    port: int, session_id: str, turn_id: str, rng: random.Random, n: int, findings: Findings
) -> None:
    """``n`` cases, ``CLIENTS`` at a time; each 5xx (but 501) or WebSocket 1011 is a finding.

    The cases are drawn from ``rng`` before any is sent, so a seed gives the same
    cases whatever the order their answers come in."""
    corpus = seeds(session_id, turn_id)
    cases: list[tuple[bool, bytes, bool, random.Random]] = []
    for _ in range(n):
        websocket = rng.random() < 0.25
        if websocket:
            sent = ws_handshake(session_id) + ws_frames(rng)
            if rng.random() < 0.3:
                sent = mutate(sent, rng)
        else:
            sent = mutate(rng.choice(corpus), rng)
        cases.append((websocket, sent, rng.random() < 0.3, random.Random(rng.random())))

    def one(case: tuple[bool, bytes, bool, random.Random]) -> tuple[bytes | None, str]:
        _, sent, half_close, own = case
        try:
            return exchange(port, sent, own, half_close=half_close), ""
        except OSError as exc:
            return None, str(exc)

    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = list(pool.map(one, cases))
    for (websocket, sent, _, _), (answer, error) in zip(cases, answers, strict=True):
        if answer is None:
            findings.add("connect", request=sent[:2000].decode("latin-1"), detail=error)
            continue
        findings.count("raw websocket" if websocket else "raw http")
        statuses = [int(s) for s in _STATUS.findall(answer)]
        bad = [s for s in statuses if s >= 500 and s != 501]
        code = _ws_close_code(answer) if 101 in statuses else None
        if bad or code == 1011:
            findings.add(
                "5xx" if bad else "websocket 1011",
                request=sent[:4000].decode("latin-1"),
                answer=answer[:2000].decode("latin-1"),
            )
