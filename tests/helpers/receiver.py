"""A webhook receiver on 127.0.0.1: records each POST and answers as the test says.

``Receiver`` is a small HTTP/1.1 server on Trio (one request per
connection, ``Connection: close``).  ``statuses`` are the answers, in
order (the last one repeats); ``hang`` makes it never answer; a status of
3xx carries ``Location: redirect_to``; ``body_bytes`` makes a 2xx answer
that long (in 64 KiB chunks), and ``cut`` then counts the answers whose
client closed before their end.  ``verify`` checks a request's signature
by the Standard Webhooks rules, written here from the format's text (not
with the library the server signs with).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio


@dataclass
class Received:
    """One request as it arrived."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    """See the module doc; ``url`` is set by ``start``."""

    statuses: list[int] = field(default_factory=lambda: [200])
    hang: bool = False
    redirect_to: str = ""
    body_bytes: int = 0
    requests: list[Received] = field(default_factory=list)
    cut: int = 0
    url: str = ""
    _arrived: trio.Event = field(default_factory=trio.Event)

    async def start(self, nursery: trio.Nursery) -> str:
        listeners = await nursery.start(partial(trio.serve_tcp, self._handle, 0, host="127.0.0.1"))
        self.url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        return self.url

    async def wait_for(self, count: int, seconds: float = 60) -> list[Received]:
        """Return once ``count`` requests have arrived (a safety-net deadline)."""
        with trio.fail_after(seconds):
            while len(self.requests) < count:
                await self._arrived.wait()
        return self.requests

    async def _handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0"))
            while len(body) < length:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                body += chunk
            status = self.statuses[min(len(self.requests), len(self.statuses) - 1)]
            self.requests.append(Received(method, path, headers, body))
            self._arrived.set()
            self._arrived = trio.Event()
            if self.hang:
                await trio.sleep_forever()
            await self._answer(stream, status)

    async def _answer(self, stream: trio.SocketStream, status: int) -> None:
        extra = f"Location: {self.redirect_to}\r\n" if 300 <= status < 400 else ""
        size = self.body_bytes if 200 <= status < 300 else 0
        head = f"HTTP/1.1 {status} X\r\nContent-Length: {size}\r\n{extra}Connection: close\r\n\r\n"
        try:
            await stream.send_all(head.encode())
            chunk = b"x" * 65536
            for _ in range(size // len(chunk)):
                await stream.send_all(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.cut += 1


def verify(secret: str, received: Received, *, tolerance: float = 300) -> None:
    """Check ``received``'s Standard Webhooks signature under ``secret`` (``whsec_`` +
    base64), as the format defines it: HMAC-SHA256 of ``{id}.{timestamp}.{body}``,
    base64, as ``v1,<signature>`` among the space-separated signatures."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    msg_id = received.headers["webhook-id"]
    stamp = received.headers["webhook-timestamp"]
    assert stamp.isdigit(), stamp
    assert abs(time.time() - int(stamp)) < tolerance, "timestamp far from now"
    signed = f"{msg_id}.{stamp}.".encode() + received.body
    expected = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    sent = received.headers["webhook-signature"].split(" ")
    assert any(hmac.compare_digest(expected, s) for s in sent), (expected, sent)
