"""A misbehaving HTTP peer (a proxy, a dying server): scripted raw answers, one a request."""

from __future__ import annotations

from functools import partial

import trio


class Responder:
    """Answers the ``n``-th request with ``answers[n]`` (the last one repeats), then closes.

    An answer of ``None`` closes the connection without a word, once the
    request has arrived (as a server closing a keep-alive connection when
    the request is already on its way).  ``requests`` holds each request as
    received (head and body).  ``url`` is set by ``start``.
    """

    def __init__(self, *answers: bytes | None) -> None:
        self.answers = answers
        self.requests: list[bytes] = []
        self.url = ""

    async def start(self, nursery: trio.Nursery) -> str:
        listeners = await nursery.start(partial(trio.serve_tcp, self._handle, 0, host="127.0.0.1"))
        self.url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        return self.url

    async def _handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                request += chunk
            head, _, body = request.partition(b"\r\n\r\n")
            length = [
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ]
            while length and len(body) < length[0]:
                body += await stream.receive_some(65536)
            self.requests.append(head + b"\r\n\r\n" + body)
            answer = self.answers[min(len(self.requests), len(self.answers)) - 1]
            if answer is not None:
                await stream.send_all(answer)

    def headers(self, n: int) -> dict[str, str]:
        """Request ``n``'s headers, names lower-cased."""
        head = self.requests[n].partition(b"\r\n\r\n")[0].decode()
        lines = head.split("\r\n")[1:]
        return {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}


def answer(
    status: int, body: bytes = b"", content_type: str = "application/json", **headers: str
) -> bytes:
    """A whole HTTP/1.1 answer that closes its connection."""
    reason = {200: "OK", 201: "Created", 202: "Accepted", 502: "Bad Gateway"}.get(status, "X")
    extra = "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n"
    ).encode() + body
