"""Start-up: what runs before the spec arrives, then the turn.

A warm adapter waits in the ``read`` of its stdin with its libraries
already loaded, so this imports what every turn needs (httpx, anyio, the
spec model) first, and the MCP SDK too when started with
``--preload-mcp`` (``trioserve run`` adds it when the spec has MCP servers).
A signal while it waits ends it quietly with status 130: nothing was asked
of it yet.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType


class _Stopped(Exception):
    pass


def _stop(signum: int, frame: FrameType | None) -> None:
    raise _Stopped


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    try:
        from trioserve.runtime.openai_adapter import _adapter

        if "--preload-mcp" in args:
            _adapter.preload_mcp()
        raw = sys.stdin.buffer.read()
    except _Stopped:
        return 130
    return _adapter.run(raw)


if __name__ == "__main__":
    sys.exit(main())
