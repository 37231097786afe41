"""The terminal side of ``trioserve chat``: standard input and output as Trio streams, a printer.

Standard input, output and error are Trio streams on duplicates of fds
0-2 (``trio.lowlevel.FdStream``): reading the terminal needs no thread.
Non-blocking mode belongs to the open file, which a terminal shares with
the shell and with the other two fds, so every fd's mode is restored on
the way out (``Console.open``).  ``Printer`` shows a turn's events: the
assistant's text on stdout as it streams, errors on stderr.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any, Final

import trio

from trioserve.client import Event

_STDIO: Final = (0, 1, 2)


class Console:
    """Standard input, output and error as Trio streams; see the module doc."""

    def __init__(self, streams: dict[int, trio.lowlevel.FdStream]) -> None:
        self._streams = streams
        self._buffer = bytearray()
        self._eof = 0 not in streams
        self.interactive = 0 in streams and os.isatty(0)

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls) -> AsyncIterator[Console]:
        # All modes first: on a terminal the three fds share one open file,
        # and the first FdStream makes it non-blocking for the other two.
        modes: dict[int, bool] = {}
        for fd in _STDIO:
            with contextlib.suppress(OSError):  # not open: no input, or output nowhere
                modes[fd] = os.get_blocking(fd)
        streams: dict[int, trio.lowlevel.FdStream] = {}
        try:
            for fd in modes:
                streams[fd] = trio.lowlevel.FdStream(os.dup(fd))
            yield cls(streams)
        finally:
            for stream in streams.values():
                stream.close()
            for fd, blocking in modes.items():
                with contextlib.suppress(OSError):
                    os.set_blocking(fd, blocking)

    async def readline(self) -> str | None:
        """The next line without its line ending, or ``None`` at the end of input.

        A last line without a newline is still a line.
        """
        while b"\n" not in self._buffer and not self._eof:
            chunk = await self._streams[0].receive_some(65536)
            if chunk:
                self._buffer += chunk
            else:
                self._eof = True
        if not self._buffer:
            return None
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer = bytearray(rest)
        return line.decode(errors="replace").removesuffix("\r")

    async def out(self, text: str) -> None:
        await self._write(1, text)

    async def err(self, text: str) -> None:
        await self._write(2, text)

    async def _write(self, fd: int, text: str) -> None:
        stream = self._streams.get(fd)
        if stream is not None and text:
            await stream.send_all(text.encode(errors="replace"))


class Printer:
    """Prints a turn's events: the assistant's text on stdout, errors on stderr."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._mid_line = False
        self._streamed = False  # chunks were printed since the last whole message
        self._errors = 0
        self.cancelled = False

    async def show(self, event: Event) -> None:
        data = event.data
        if event.type == "message" and data.get("role") == "assistant":
            text = message_text(data)
            if data.get("delta") is True:
                await self._write(text)
                self._streamed = True
            elif data.get("final") is True and self._streamed:
                await self.end_line()  # the whole of the chunks just printed
                self._streamed = False
            elif text:
                await self.end_line()
                await self._write(text)
                await self.end_line()
        elif event.is_error:
            await self._error(data.get("message"))
        elif event.is_end:
            if event.end_reason == "cancelled":
                self.cancelled = True
            elif event.end_reason == "error" and not self._errors:
                await self._error(data.get("message"))

    async def _error(self, message: Any) -> None:
        self._errors += 1
        await self.end_line()
        text = message if isinstance(message, str) and message else "the turn failed"
        await self._console.err(f"error: {text}\n")

    async def _write(self, text: str) -> None:
        if text:
            await self._console.out(text)
            self._mid_line = not text.endswith("\n")

    async def end_line(self) -> None:
        if self._mid_line:
            await self._console.out("\n")
            self._mid_line = False

    async def finish(self) -> None:
        """The turn is over: end the line, and say so if it was cancelled."""
        await self.end_line()
        if self.cancelled:
            await self._console.err("turn cancelled\n")


def message_text(data: dict[str, Any]) -> str:
    """A ``message`` event's text: ``data.text``, as the reference's adapters write it.

    ``data.content`` (a string, or a list of content blocks with ``text``) is
    read when there is no ``text``, for adapters that follow other conventions.
    """
    text = data.get("text")
    if isinstance(text, str):
        return text
    return content_text(data.get("content"))


def content_text(content: Any) -> str:
    """A message's text: a string, or the ``text`` of a list of content blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            block["text"]
            for block in content
            if isinstance(block, dict) and isinstance(block.get("text"), str)
        )
    return ""
