"""The bench's sans-IO response reader, fed a few bytes at a time or all at once."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TypeVar

import pytest

from bench import BenchError
from bench.client import ResponseReader, resume

T = TypeVar("T")

CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"1c\r\nevent: session.started\ndata:\r\n5;x=1\r\n {}\n\n\r\n0\r\n\r\n"
)
SIZED = b'HTTP/1.1 201 Created\r\nContent-Length: 12\r\nConnection: close\r\n\r\n{"id":"s_1"}'


@dataclass
class Wire:
    """What the server sent, handed to the reader ``step`` bytes each time it asks."""

    data: bytes
    step: int
    reader: ResponseReader = field(default_factory=ResponseReader)
    sent: int = 0

    def run(self, reading: Generator[None, None, T]) -> T:
        while not (done := resume(reading)):
            self.reader.feed(self.data[self.sent : self.sent + self.step])
            self.sent += self.step
        return done[0]


@pytest.mark.parametrize("step", [1, 7, 10_000])
def test_a_chunked_then_a_sized_response_on_one_connection(step: int) -> None:
    wire = Wire(CHUNKED + SIZED, step)
    status, headers = wire.run(wire.reader.head())
    assert (status, headers["transfer-encoding"]) == (200, "chunked")
    assert wire.run(wire.reader.body(headers)) == b"event: session.started\ndata: {}\n\n"
    assert wire.reader.chunks == [b"event: session.started\ndata:", b" {}\n\n", b""]
    status, headers = wire.run(wire.reader.head())
    assert (status, headers["connection"]) == (201, "close")
    assert wire.run(wire.reader.body(headers)) == b'{"id":"s_1"}'
    assert wire.reader.chunks == []  # a sized body is not chunks
    assert wire.reader.buf == b""


def test_until_returns_the_bytes_so_far_once_the_needle_is_in() -> None:
    wire = Wire(CHUNKED, 5)
    wire.run(wire.reader.head())
    raw = wire.run(wire.reader.until(b"\n\n"))
    assert raw.startswith(b"1c\r\nevent: session.started\n") and b"\n\n" in raw


def test_a_closed_connection_and_an_unframed_body_are_errors() -> None:
    wire = Wire(b"HTTP/1.1 200 OK\r\n", 100)
    with pytest.raises(BenchError, match="closed"):
        wire.run(wire.reader.head())  # the head never ends: the second feed is empty
    wire = Wire(b"HTTP/1.1 200 OK\r\n\r\nbody", 100)
    _, headers = wire.run(wire.reader.head())
    with pytest.raises(BenchError, match="framing"):
        wire.run(wire.reader.body(headers))
