"""A fake OpenAI-compatible model server for the benchmarks (standard library, a thread).

``POST /v1/chat/completions`` (``"stream": true``) is answered at once with
one streamed reply: a content chunk, a ``finish_reason`` chunk, a ``usage``
chunk, ``data: [DONE]``.  It costs the bench process a few hundred
microseconds a request, so the turn's time is the server's and the adapter's.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPLY = "Hello from the fake model."


def _chunks() -> bytes:
    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "model": "bench-model"}
    frames = [
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": REPLY}}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {**base, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 6}},
    ]
    body = "".join(f"data: {json.dumps(frame)}\n\n" for frame in frames) + "data: [DONE]\n\n"
    return body.encode()


BODY = _chunks()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if not self.path.endswith("/chat/completions"):
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, format: str, *args: object) -> None:
        return


@contextmanager
def fake_model() -> Iterator[str]:
    """Serve on 127.0.0.1 (a free port) while the block runs; yields its ``/v1`` URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
