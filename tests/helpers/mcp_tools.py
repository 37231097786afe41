"""A real MCP server over stdio, written with the ``mcp`` SDK, for the openai adapter's tests.

Run as ``python tests/helpers/mcp_tools.py``.  With ``MCP_PID_FILE`` in its
environment it appends its pid to that file when it starts (so a test can
check that no server is left).  Tools: ``add``, ``shout``, ``fail`` (an
error result), ``hang`` (never answers) and ``current_time`` (for the
README's example).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime

import anyio
from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("test-tools")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def shout(text: str) -> str:
    """The text in capitals."""
    return text.upper()


@server.tool()
def fail(message: str) -> str:
    """Always fails, with this message."""
    raise ToolError(message)


@server.tool()
async def hang() -> str:
    """Never answers."""
    await anyio.sleep_forever()
    return "never"


@server.tool()
def current_time(timezone: str = "UTC") -> str:
    """The current time (always given in UTC)."""
    return f"{datetime.now(UTC):%H:%M} UTC (asked for {timezone})"


if __name__ == "__main__":
    if pid_file := os.environ.get("MCP_PID_FILE"):
        with open(pid_file, "a") as f:
            f.write(f"{os.getpid()}\n")
    server.run()
