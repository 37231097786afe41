"""A small MCP server over stdio, for ``examples/openai.yaml``: what time it is.

Written with the ``mcp`` SDK (installed with trioserve); the agent's adapter
starts it for each turn (``spec.mcpServers``) and offers its tool to the
model.  Run by hand with ``python3 examples/time_server.py`` it waits for
JSON-RPC on stdin.
"""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("time")


@server.tool()
def current_time(timezone: str = "UTC") -> str:
    """The current date and time in an IANA time zone, such as Europe/Paris or Asia/Tokyo."""
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ToolError(f"unknown time zone {timezone!r}; use an IANA name such as Asia/Tokyo")
    return datetime.now(zone).strftime(f"%Y-%m-%d %H:%M:%S ({timezone})")


if __name__ == "__main__":
    server.run()
