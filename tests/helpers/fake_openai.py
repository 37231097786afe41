"""A fake OpenAI-compatible model server on 127.0.0.1, speaking the real wire.

``POST /v1/chat/completions`` with ``"stream": true`` is answered with
server-sent events: ``data: {chunk}`` frames whose ``choices[0].delta``
carries ``content`` or ``tool_calls`` pieces (a call's arguments split
across chunks), a chunk with ``finish_reason``, a last chunk with
``usage`` (when ``stream_options.include_usage``), then ``data: [DONE]``.

Each request takes the next queued :class:`Script` (``server.queue(...)``);
with none queued, the server answers as a tiny deterministic "model":

- when the last message is the user's and tools are offered whose name is
  in :attr:`FakeModel.auto_tools`, it calls that tool with the arguments
  given there;
- otherwise it replies ``Reply N: you said "LAST". Earlier you said "A" |
  "B".`` (the user messages before the last one, in order), or, right after
  tool results, ``The tools said: RESULT | RESULT.``

Every request is kept (``server.requests``: headers and JSON body) for the
tests to check what the adapter sent.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import h11
import trio


@dataclass
class Script:
    """One answer: ``status``/``headers``/``body`` for a refusal, else ``frames`` then ``end``."""

    frames: list[bytes] = field(default_factory=list)
    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    #: After the frames: "done" (``[DONE]``), "eof" (end the body without it), "hang" (send
    #: nothing more), "close" (drop the connection mid-body).
    end: str = "done"
    #: Seconds between frames.
    every: float = 0.0


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> bytes:
    """One ``data:`` frame holding a chunk with one choice."""
    choice = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    body = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": "fake"}
    return frame({**body, "choices": [choice], **extra})


def frame(data: Any) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def usage_frame(prompt: int, completion: int) -> bytes:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    return frame(
        {
            "id": "chatcmpl-fake",
            "choices": [],
            "usage": usage | {"total_tokens": prompt + completion},
        }
    )


def text_script(*pieces: str, usage: tuple[int, int] = (11, 7), **options: Any) -> Script:
    """A streamed text reply: one chunk per piece (the first with the role)."""
    frames = [chunk({"role": "assistant", "content": ""})]
    frames += [chunk({"content": piece}) for piece in pieces]
    frames += [chunk(finish="stop"), usage_frame(*usage)]
    return Script(frames, **options)


def tool_script(*calls: tuple[str, str, dict[str, Any]], text: str = "") -> Script:
    """A reply that calls tools: each call's name in its first piece, its arguments in three."""
    frames = [chunk({"role": "assistant", "content": text or None})]
    for index, (call_id, name, arguments) in enumerate(calls):
        args = json.dumps(arguments)
        cut = [
            args[: len(args) // 3],
            args[len(args) // 3 : 2 * len(args) // 3],
            args[2 * len(args) // 3 :],
        ]
        first = {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        frames.append(chunk({"tool_calls": [first]}))
        frames += [
            chunk({"tool_calls": [{"index": index, "function": {"arguments": p}}]}) for p in cut
        ]
    frames += [chunk(finish="tool_calls"), usage_frame(20, 9)]
    return Script(frames)


def refusal(
    status: int, message: str, headers: list[tuple[str, str]] | None = None, **error: Any
) -> Script:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", **error}})
    return Script(status=status, headers=headers or [], body=body.encode())


@dataclass
class Request:
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = self.body["messages"]
        return messages


class FakeModel:
    """The server: ``url`` is its base URL (``http://127.0.0.1:PORT/v1``)."""

    def __init__(self) -> None:
        self.url = ""
        self.requests: list[Request] = []
        self.scripts: list[Script] = []
        #: Tool name -> arguments: called when offered and the user just spoke.
        self.auto_tools: dict[str, dict[str, Any]] = {}
        self.connections = 0
        #: A file each request is appended to as a JSON line (for a server in another process).
        self.log: Path | None = None
        self.streaming = trio.Event()  # set once a stream has started

    def queue(self, *scripts: Script) -> None:
        self.scripts.extend(scripts)

    def _script(self, body: dict[str, Any]) -> Script:
        if self.scripts:
            return self.scripts.pop(0)
        messages = body.get("messages", [])
        last = messages[-1] if messages else {}
        offered = {t["function"]["name"] for t in body.get("tools", [])}
        if last.get("role") == "user":
            for name, arguments in self.auto_tools.items():
                if name in offered:
                    return tool_script((f"call_{len(self.requests)}", name, arguments))
        if last.get("role") == "tool":
            said = [
                m["content"]
                for m in messages[messages.index(_first_tool(messages)) :]
                if m["role"] == "tool"
            ]
            return text_script("The tools", " said: ", " | ".join(said) + ".")
        users = [m["content"] for m in messages if m.get("role") == "user"]
        reply = f'Reply {len(self.requests)}: you said "{users[-1] if users else ""}".'
        if len(users) > 1:
            reply += " Earlier you said " + " | ".join(f'"{u}"' for u in users[:-1]) + "."
        return text_script(*(reply[i : i + 12] for i in range(0, len(reply), 12)))

    async def serve(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request, body = await _read_request(conn, stream)
                if request is None:
                    return
                await self._answer(conn, stream, request, body)
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError):
            return
        finally:
            await stream.aclose()

    async def _answer(
        self, conn: h11.Connection, stream: trio.SocketStream, request: h11.Request, body: bytes
    ) -> None:
        headers = {k.decode().lower(): v.decode() for k, v in request.headers}
        if request.method != b"POST" or request.target != b"/v1/chat/completions":
            await _send_whole(conn, stream, 404, [], b'{"error":{"message":"no such path"}}')
            return
        decoded = json.loads(body)
        script = self._script(decoded)
        self.requests.append(Request(headers, decoded))
        if self.log is not None:
            with self.log.open("a") as f:
                f.write(json.dumps(decoded) + "\n")
        if script.status != 200:
            await _send_whole(conn, stream, script.status, script.headers, script.body)
            return
        head = [
            ("content-type", "text/event-stream"),
            ("cache-control", "no-cache"),
            *script.headers,
        ]
        await stream.send_all(conn.send(h11.Response(status_code=200, headers=head)))
        self.streaming.set()
        for data in script.frames:
            await stream.send_all(conn.send(h11.Data(data=data)))
            if script.every:
                await trio.sleep(script.every)
        if script.end == "hang":
            await trio.sleep_forever()
        if script.end == "close":
            return
        if script.end == "done":
            await stream.send_all(conn.send(h11.Data(data=b"data: [DONE]\n\n")))
        await stream.send_all(conn.send(h11.EndOfMessage()))


def _first_tool(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The first tool message after the last user message."""
    start = max(i for i, m in enumerate(messages) if m["role"] == "user")
    return next(m for m in messages[start:] if m["role"] == "tool")


async def _read_request(
    conn: h11.Connection, stream: trio.SocketStream
) -> tuple[h11.Request | None, bytes]:
    request: h11.Request | None = None
    body = b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(65536)
            conn.receive_data(data)
            if not data and request is None:
                return None, b""
        elif isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return request, body
        elif isinstance(event, h11.ConnectionClosed):
            return None, b""


async def _send_whole(
    conn: h11.Connection,
    stream: trio.SocketStream,
    status: int,
    headers: list[tuple[str, str]],
    body: bytes,
) -> None:
    head = [("content-type", "application/json"), ("content-length", str(len(body))), *headers]
    await stream.send_all(conn.send(h11.Response(status_code=status, headers=head)))
    await stream.send_all(conn.send(h11.Data(data=body)))
    await stream.send_all(conn.send(h11.EndOfMessage()))


@asynccontextmanager
async def fake_model() -> AsyncIterator[FakeModel]:
    """Serve a :class:`FakeModel` on 127.0.0.1 (a free port) for the block."""
    model = FakeModel()
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, model.serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        model.url = f"http://127.0.0.1:{port}/v1"
        yield model
        nursery.cancel_scope.cancel()


async def _serve_forever(tools: dict[str, dict[str, Any]], log: Path | None) -> None:
    async with fake_model() as model:
        model.auto_tools, model.log = tools, log
        print(model.url, flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    # python -m tests.helpers.fake_openai [--tool NAME JSON]... [--log FILE]: prints its URL.
    import sys

    argv, tools, log = sys.argv[1:], {}, None
    while argv:
        flag = argv.pop(0)
        if flag == "--tool":
            name = argv.pop(0)
            tools[name] = json.loads(argv.pop(0))
        elif flag == "--log":
            log = Path(argv.pop(0))
    trio.run(_serve_forever, tools, log)
