"""Adapter stdout as lines: a sans-IO line framer (no I/O, no trio).

``LineFramer(max_line_bytes)`` takes the bytes an adapter printed, in
whatever chunks the pipe gave them, and returns the complete lines they
hold: ``feed(data)`` returns the lines ``data`` completes, ``end()`` (at
EOF) the last line if the adapter did not end it with a newline.

- Lines are split at ``b"\\n"`` only and come without it; a ``b"\\r"``
  before it stays in the line (the decoder strips surrounding whitespace,
  and skips a blank line).  An empty line is ``b""``.
- A line is a plain ``bytes`` (one is made per event on the streaming
  path).  The start of a line still waiting for its newline is kept in
  parts and joined once, when the newline comes: a long line costs one
  copy, not one per chunk.
- A line longer than ``max_line_bytes`` (its newline not counted) ends the
  framing: the lines before it come as usual, then one ``Oversized``, and
  nothing after it, ever.  A line is found too long as soon as its start
  exceeds the limit, without waiting for its newline, so the framer never
  holds more than about ``max_line_bytes`` plus one chunk.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple, TypeAlias, cast

#: One line, without its newline.
Line: TypeAlias = bytes


class Oversized(NamedTuple):
    """A line longer than the limit; the framer takes nothing more after it."""

    limit: int  # max_line_bytes
    size: int  # the bytes of it seen (more than ``limit``; the line may be longer still)


class LineFramer:
    """Splits a byte stream into lines; see the module doc."""

    def __init__(self, max_line_bytes: int) -> None:
        if max_line_bytes < 0:
            raise ValueError("max_line_bytes must be 0 or more")
        self.max_line_bytes = max_line_bytes
        self._parts: list[bytes] = []
        self._waiting = 0  # bytes in _parts
        self._over = False

    @property
    def over(self) -> bool:
        """Whether an ``Oversized`` has been returned (the framer takes nothing more)."""
        return self._over

    def feed(self, data: bytes) -> list[Line | Oversized]:
        """The lines ``data`` completes (and an ``Oversized`` last, if one is too long)."""
        if self._over:
            return []
        limit = self.max_line_bytes
        end = data.rfind(b"\n")
        if end < 0:
            if data:
                self._parts.append(data)
                self._waiting += len(data)
                if self._waiting > limit:
                    return self._oversized(self._waiting)
            return []
        parts = self._parts
        complete = b"".join([*parts, data[:end]]) if parts else data[:end]
        lines = cast("list[Line | Oversized]", complete.split(b"\n"))
        rest = data[end + 1 :]
        self._parts, self._waiting = ([rest], len(rest)) if rest else ([], 0)
        if max(map(len, cast("list[bytes]", lines))) > limit:
            fits = list(itertools.takewhile(lambda line: len(line) <= limit, lines))
            return [*fits, *self._oversized(len(lines[len(fits)]))]
        if self._waiting > limit:
            lines.extend(self._oversized(self._waiting))
        return lines

    def end(self) -> list[Line | Oversized]:
        """At EOF: the last line, if the stream did not end with a newline (else nothing)."""
        if self._over or not self._waiting:
            return []
        line = b"".join(self._parts)
        self._parts, self._waiting = [], 0
        return [line]

    def _oversized(self, size: int) -> list[Line | Oversized]:
        self._over = True
        self._parts, self._waiting = [], 0
        return [Oversized(self.max_line_bytes, size)]
