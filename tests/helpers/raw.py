"""One HTTP/1.1 request written byte for byte, for what httpx would fix up or hide."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import h11
import trio


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
