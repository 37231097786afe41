"""Server-sent events as a client reads them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass
class Frame:
    """One SSE frame: its ``event``, its ``data`` (JSON) and its ``id``."""

    event: str
    data: dict[str, Any]
    id: str | None = None

    @property
    def seq(self) -> int:
        assert self.id is not None, self
        return int(self.id)


def parse_sse(text: str) -> list[Frame]:
    """The frames of a whole stream (comment-only blocks, heartbeats, left out)."""
    frames = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if line.startswith(":"):
                continue
            name, _, value = line.partition(": ")
            fields[name] = value
        if "data" not in fields:
            continue  # a comment-only block (a heartbeat)
        frame = Frame(fields.get("event", "message"), json.loads(fields["data"]), fields.get("id"))
        frames.append(frame)
    return frames


async def read_frames(resp: httpx.Response) -> AsyncIterator[Frame]:
    """The SSE frames of a streaming response as they arrive (a comment: ``Frame("comment")``)."""
    buffer = ""
    async for chunk in resp.aiter_text():
        buffer += chunk
        *blocks, buffer = buffer.split("\n\n")
        for block in blocks:
            yield _frame_of(block)


def _frame_of(block: str) -> Frame:
    frames = parse_sse(block + "\n\n")
    return frames[0] if frames else Frame("comment", {})
