"""HTTP/1.1 written byte for byte, for what httpx would fix up or hide.

``raw_request`` sends one request on a fresh connection; ``Raw`` is one
client connection that a test drives request by request, or byte by byte,
and watches close (httpx hides when a connection closes).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import h11
import trio

GUARD = 10.0  # seconds; a hang guard, never a measurement


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]  # names lower-case; a repeated header's values joined by ", "
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def raw_request(
    url: str, method: str, target: str, headers: list[tuple[str, str]], body: bytes = b""
) -> RawResponse:
    """One HTTP/1.1 request written byte for byte (``headers`` exactly as given, Host
    included) on a fresh connection, and the response as it came.

    For what httpx would fix up or hide: a forged ``Host``, a WebSocket
    handshake refused before it is accepted.
    """
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    conn = h11.Connection(h11.CLIENT)
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream(parts.hostname, parts.port)
        async with stream:
            if body:
                headers = [*headers, ("Content-Length", str(len(body)))]
            data = conn.send(h11.Request(method=method, target=target, headers=headers))
            if body:
                data += conn.send(h11.Data(data=body))
            data += conn.send(h11.EndOfMessage())
            await stream.send_all(data)
            response: h11.Response | h11.InformationalResponse | None = None
            chunks = []
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await stream.receive_some(65536))
                elif isinstance(event, h11.Response | h11.InformationalResponse):
                    response = event
                elif isinstance(event, h11.Data):
                    chunks.append(bytes(event.data))
                elif event is h11.PAUSED or isinstance(
                    event, h11.EndOfMessage | h11.ConnectionClosed
                ):
                    break  # PAUSED: a 101, the connection now speaks another protocol
    assert response is not None
    found: dict[str, str] = {}
    for name, value in response.headers:
        key = name.decode().lower()
        found[key] = f"{found[key]}, {value.decode()}" if key in found else value.decode()
    return RawResponse(response.status_code, found, b"".join(chunks))


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    rest: bytes = b""  # bytes after this response (parse_reply)

    def error(self) -> dict[str, Any]:
        assert self.headers["content-type"] == "application/json", self.headers
        envelope = json.loads(self.body)
        assert set(envelope) == {"error"} and set(envelope["error"]) >= {
            "code",
            "reason",
            "message",
        }, envelope
        assert envelope["error"]["code"] == self.status
        return dict(envelope["error"])


def parse_reply(data: bytes) -> Reply:
    """One response with a Content-Length, from raw bytes."""
    head, sep, rest = data.partition(b"\r\n\r\n")
    assert sep, data[:200]
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers["content-length"])
    return Reply(int(status_line.split()[1]), headers, rest[:length], rest[length:])


@dataclass
class Raw:
    """One client connection; h11 frames the well-formed requests."""

    stream: trio.SocketStream
    host: str  # the Host header sent: the server's own address (it refuses others)
    h11: h11.Connection = field(default_factory=lambda: h11.Connection(h11.CLIENT))

    @classmethod
    async def open(
        cls, url: str, receive_buffer: int | None = None, source: str | None = None
    ) -> Raw:
        """A connection to ``url``; ``receive_buffer`` sets its SO_RCVBUF before connecting,
        ``source`` the local address it comes from (another loopback address, 127.0.0.2,
        is another client address to the server)."""
        netloc = url.removeprefix("http://")
        host, port = netloc.rsplit(":", 1)
        if receive_buffer is None and source is None:
            return cls(await trio.open_tcp_stream(host, int(port)), netloc)
        sock = trio.socket.socket()
        if receive_buffer is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        if source is not None:
            await sock.bind((source, 0))
        try:
            await sock.connect((host, int(port)))
        except BaseException:
            sock.close()
            raise
        return cls(trio.SocketStream(sock), netloc)

    def head(self, method: str, target: str, *fields: str) -> bytes:
        """A request head written by hand: ``fields`` are whole header lines."""
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self.host}", *fields]
        return "".join(line + "\r\n" for line in lines).encode() + b"\r\n"

    async def request(
        self,
        method: str,
        target: str,
        body: bytes = b"",
        headers: Sequence[tuple[str, str]] = (),
    ) -> Reply:
        fields = [("Host", self.host), *headers]
        if body:
            fields += [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        data = self.h11.send(h11.Request(method=method, target=target, headers=fields)) or b""
        data += (self.h11.send(h11.Data(data=body)) or b"") if body else b""
        data += self.h11.send(h11.EndOfMessage()) or b""
        await self.stream.send_all(data)
        return await self.response()

    async def open_stream(
        self, method: str, target: str, headers: Sequence[tuple[str, str]] = ()
    ) -> Reply:
        """Send a request without a body and read only its response head (a stream
        that stays open: its body is left unread)."""
        fields = [("Host", self.host), *headers]
        data = self.h11.send(h11.Request(method=method, target=target, headers=fields)) or b""
        await self.stream.send_all(data + (self.h11.send(h11.EndOfMessage()) or b""))
        with trio.fail_after(GUARD):
            while True:
                event = self.h11.next_event()
                if event is h11.NEED_DATA:
                    self.h11.receive_data(await self.stream.receive_some(65536))
                elif isinstance(event, h11.Response):
                    found = {k.decode(): v.decode() for k, v in event.headers}
                    return Reply(event.status_code, found, b"")

    async def read_body(self) -> bytes:
        """The rest of a response whose head ``open_stream`` read."""
        body = bytearray()
        with trio.fail_after(GUARD):
            while True:
                event = self.h11.next_event()
                if event is h11.NEED_DATA:
                    self.h11.receive_data(await self.stream.receive_some(65536))
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                    return bytes(body)

    async def response(self) -> Reply:
        status, headers, body = 0, {}, bytearray()
        with trio.fail_after(GUARD):
            while True:
                event = self.h11.next_event()
                if event is h11.NEED_DATA:
                    self.h11.receive_data(await self.stream.receive_some(65536))
                elif isinstance(event, h11.Response):
                    status = event.status_code
                    headers = {k.decode(): v.decode() for k, v in event.headers}
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    break
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
        return Reply(status, headers, bytes(body))

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def until_eof(self) -> bytes:
        """Everything the server sends until its EOF, under the guard; a reset fails."""
        data = bytearray()
        with trio.fail_after(GUARD):
            while chunk := await self.stream.receive_some(65536):
                data += chunk
        return bytes(data)

    async def until_closed(self) -> bytes:
        """Everything the server sends until it closes (EOF or reset), under the guard."""
        data = bytearray()
        with trio.fail_after(GUARD):
            try:
                while chunk := await self.stream.receive_some(65536):
                    data += chunk
            except trio.BrokenResourceError:
                pass  # closed with our bytes unread: a reset instead of a FIN
        return bytes(data)

    async def aclose(self) -> None:
        await self.stream.aclose()
