"""An incremental Server-Sent Events parser (sans-IO).

It follows the HTML Living Standard, "9.2.6 Interpreting an event stream":

- the stream is UTF-8 (invalid bytes become U+FFFD); one leading byte order
  mark is skipped;
- lines end in CRLF, LF or CR, and a CRLF split across two chunks counts
  once;
- a line starting with ``:`` is a comment (the server's ``: keep-alive``);
- ``field: value`` (one space after the colon is dropped; a line without a
  colon is a field with an empty value);
- ``data`` lines are joined with ``\\n``; ``event`` names the type
  (``message`` when absent); ``id`` sets the last event id unless it holds
  NUL, and the id carries over to later events until another ``id`` line
  changes it; ``retry`` (ASCII digits only) sets the reconnection time;
  other fields are ignored;
- a blank line dispatches the frame; a frame with no ``data`` line
  dispatches nothing (heartbeats, ``id``-only frames);
- an incomplete frame at the end of the stream is discarded.

``feed`` takes bytes in chunks of any size, split anywhere, and returns the
events completed by that chunk.  No I/O, no clock: the parser is pure.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from typing import Final

_EOL: Final = re.compile(r"\r\n|\r|\n")
_BOM: Final = "\ufeff"


@dataclass(frozen=True, slots=True)
class ServerSentEvent:
    """One dispatched event: its type, its data and the last event id (``""`` if none)."""

    event: str
    data: str
    last_event_id: str = ""


class SSEParser:
    """Turns the bytes of an event stream into ``ServerSentEvent`` objects."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._started = False  # the first character (a possible BOM) was seen
        self._skip_lf = False  # the last chunk ended in CR: drop a leading LF
        self._partial: list[str] = []  # the current line so far
        self._data: list[str] = []
        self._event_type = ""
        self._closed = False
        #: The last event id: set by ``id`` fields, kept across events.
        self.last_event_id = ""
        #: The reconnection time in milliseconds, if a ``retry`` field set it.
        self.retry: int | None = None

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Parse ``chunk``; return the events it completes, in order."""
        if self._closed:
            raise RuntimeError("the parser was closed")
        return self._feed_text(self._decoder.decode(chunk))

    def close(self) -> None:
        """The stream has ended: an incomplete frame is discarded, as the standard says."""
        self._decoder.decode(b"", final=True)
        self._closed = True
        self._partial.clear()
        self._data.clear()
        self._event_type = ""

    def _feed_text(self, text: str) -> list[ServerSentEvent]:
        if not text:
            return []
        if not self._started:
            self._started = True
            if text.startswith(_BOM):
                text = text[1:]
        if self._skip_lf and text:
            self._skip_lf = False
            if text.startswith("\n"):
                text = text[1:]
        events: list[ServerSentEvent] = []
        start = 0
        for match in _EOL.finditer(text):
            self._partial.append(text[start : match.start()])
            line = "".join(self._partial)
            self._partial.clear()
            event = self._line(line)
            if event is not None:
                events.append(event)
            start = match.end()
        rest = text[start:]
        if rest:
            self._partial.append(rest)
        elif text.endswith("\r"):
            # The CR ended a line; if the next chunk starts with LF it is the
            # same line ending, not an empty line.
            self._skip_lf = True
        return events

    def _line(self, line: str) -> ServerSentEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event_type = value
        elif name == "id":
            if "\0" not in value:
                self.last_event_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry = int(value)
        return None

    def _dispatch(self) -> ServerSentEvent | None:
        data, event_type = self._data, self._event_type
        self._data, self._event_type = [], ""
        if not data:
            return None
        return ServerSentEvent(event_type or "message", "\n".join(data), self.last_event_id)
