"""Serving an agent of ``runtime.type: openai`` in tests: its spec, its turns."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.helpers.cli import CLIServer, start_cli_server
from tests.helpers.fake_openai import FakeModel
from tests.helpers.sse import Frame, parse_sse

#: The real MCP server of the tests (``tests/helpers/mcp_tools.py``).
MCP_TOOLS = Path(__file__).with_name("mcp_tools.py")


def write_openai_spec(
    directory: Path,
    *,
    options: dict[str, Any] | None = None,
    mcp: bool = True,
    command: str | None = None,
    name: str = "model-agent",
) -> Path:
    """An agent on the openai runtime whose MCP server (if any) records its pid in ``mcp.pids``."""
    servers = ""
    if mcp:
        env = json.dumps({"MCP_PID_FILE": str(directory / "mcp.pids")})
        args = json.dumps([str(MCP_TOOLS)])
        servers = (
            "  mcpServers:\n"
            "    - name: tools\n      transport: stdio\n"
            f"      command: {command or sys.executable}\n      args: {args}\n      env: {env}\n"
        )
    runtime = "  runtime:\n    type: openai\n"
    if options:
        runtime += f"    options: {json.dumps(options)}\n"
    path = directory / f"{name}.yaml"
    path.write_text(
        "apiVersion: agent-controller.dev/v1alpha1\n"
        "kind: Agent\n"
        f"metadata:\n  name: {name}\n"
        "spec:\n"
        "  model:\n    provider: openai\n    name: fake-model\n    temperature: 0.3\n"
        "  persona:\n    role: A test assistant\n    instructions: Answer briefly.\n"
        "  task: Say hello.\n"
        "  tools: []\n" + servers + runtime
    )
    return path


def mcp_pids(directory: Path) -> list[int]:
    """The pids of the MCP servers started so far (each appends its own)."""
    path = directory / "mcp.pids"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


async def new_session(url: str) -> str:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        resp = await client.post("/v1/sessions", json={})
        assert resp.status_code == 201, resp.text
        session_id: str = resp.json()["id"]
        return session_id


async def turn(url: str, session_id: str, text: str) -> list[Frame]:
    """Run a turn to its end; its frames."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        resp = await client.post(f"/v1/sessions/{session_id}/turns", json={"input": text})
        assert resp.status_code == 200, resp.text
    frames = parse_sse(resp.text)
    assert frames and frames[-1].event == "session.ended", frames
    return frames


def of_type(frames: list[Frame], event_type: str) -> list[dict[str, Any]]:
    """The ``data`` of the frames of one event type."""
    return [f.data["data"] for f in frames if f.event == event_type]


def reply_text(frames: list[Frame]) -> str:
    """The assistant's whole messages of a turn, joined."""
    return "".join(d["text"] for d in of_type(frames, "message") if d.get("final"))


async def serve(
    nursery: trio.Nursery,
    tmp_path: Path,
    spec: Path,
    model: FakeModel,
    launched: list[CLIServer],
    *args: str,
    **options: Any,
) -> CLIServer:
    """``trioserve run SPEC --in-memory ARGS`` against ``model`` (``OPENAI_BASE_URL``)."""
    server = await start_cli_server(
        nursery, tmp_path, spec, "--in-memory", *args, env={"OPENAI_BASE_URL": model.url}, **options
    )
    launched.append(server)
    return server
