"""The turn's MCP servers (``spec.mcpServers``, transport ``stdio``) and their tools.

Each server is started for the turn, spoken to with the official ``mcp``
SDK's ``ClientSession`` (initialize, list the tools, call them), and
stopped when the turn ends.  Their tools are offered to the model as
functions named after the tool (``server_tool`` when two servers have a tool
of the same name; characters outside ``[A-Za-z0-9_-]`` become ``_``).

The process is started here, not with the SDK's ``stdio_client``: that one
puts the server in a session of its own, where the stops trioserve sends to
an adapter's process group (SIGINT on cancel, SIGKILL after the grace, the
reaper's SIGKILL when the server dies) would not reach it, and a killed
adapter would leave it running.  Started here it stays in the adapter's
process group, so every one of those stops reaches it too.  It gets the
SDK's default environment (``HOME``, ``PATH``, …, not the model's API key)
plus the spec's ``env``, and writes its stderr to the adapter's (trioserve
keeps the tail).  When the turn ends it is stopped: stdin closed, up to
:data:`STOP_GRACE` to exit, then SIGKILL; shielded, so a cancelled turn
stops it too.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import anyio

from trioserve.runtime.openai_adapter._events import Failure
from trioserve.spec import CompiledSpec, MCPServer

if TYPE_CHECKING:
    from mcp import ClientSession
    from mcp.shared.message import SessionMessage


SUPPORTED_TRANSPORTS: Final = ("stdio",)
#: After its stdin closes, how long a server has to exit before it is killed.
STOP_GRACE: Final = 1.0
#: The most characters of a tool's result given to the model (and the event).
MAX_RESULT_CHARS: Final = 100_000
_NAME: Final = re.compile(r"[^A-Za-z0-9_-]")
#: A pipe to a server that is gone.
_GONE: Final = (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)


def load_mcp() -> None:
    """Import the MCP SDK (a ``Failure`` naming the package if it is missing)."""
    try:
        import mcp
        import mcp.shared.message  # noqa: F401
    except ImportError as exc:
        raise Failure(
            "missing_dependency",
            f"spec.mcpServers needs the Python package 'mcp' ({exc}); it is a dependency of"
            " trioserve: reinstall trioserve, or pip install 'mcp>=2.3,<3'",
        ) from None


@dataclass
class ToolResult:
    """What a tool call gave: the text for the model, and the failure if it failed."""

    content: str
    error: tuple[str, str] | None = None  # (reason, message)
    duration_ms: float = 0.0


@dataclass
class _Route:
    session: ClientSession
    server: str
    tool: str


class ToolBox:
    """The turn's MCP servers, started on entry and stopped on exit."""

    def __init__(self, spec: CompiledSpec, *, start_timeout: float, call_timeout: float) -> None:
        self._servers = list(spec.mcp_servers or ())
        self._start_timeout = start_timeout
        self._call_timeout = call_timeout
        self._stack = AsyncExitStack()
        self._routes: dict[str, _Route] = {}
        #: The ``tools`` of a Chat Completions request.
        self.functions: list[dict[str, Any]] = []

    def server_of(self, function: str) -> str | None:
        route = self._routes.get(function)
        return None if route is None else route.server

    async def __aenter__(self) -> ToolBox:
        for index, server in enumerate(self._servers):
            if server.transport not in SUPPORTED_TRANSPORTS:
                raise Failure(
                    "mcp_transport_unsupported",
                    f"spec.mcpServers[{index}] ('{server.name}'): transport '{server.transport}'"
                    f" is not supported by runtime.type 'openai' (supported:"
                    f" {', '.join(SUPPORTED_TRANSPORTS)})",
                )
        if self._servers:
            load_mcp()
        try:
            listed = []
            for server in self._servers:
                listed.append((server, await self._start(server)))
        except BaseException:
            await self._stack.aclose()
            raise
        self._name_tools(listed)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._stack.aclose()

    async def _start(self, server: MCPServer) -> tuple[ClientSession, list[Any]]:
        from mcp import ClientSession
        from mcp_types import PaginatedRequestParams

        what = f"MCP server '{server.name}' ({server.command})"
        try:
            # The process and the session live on in the stack: entered outside any
            # scope that ends before they do.
            read, write = await self._stack.enter_async_context(_stdio(server))
            session = await self._stack.enter_async_context(ClientSession(read, write))
            tools: list[Any] = []
            with anyio.fail_after(self._start_timeout):
                await session.initialize()
                cursor: str | None = None
                while True:
                    params = None if cursor is None else PaginatedRequestParams(cursor=cursor)
                    page = await session.list_tools(params=params)
                    tools += page.tools
                    cursor = page.next_cursor
                    if not cursor:
                        break
        except TimeoutError:
            raise Failure(
                "mcp_server_failed",
                f"{what} did not start within {self._start_timeout:g} s"
                " (runtime.options.mcpStartTimeoutMs); its stderr is in the adapter's",
            ) from None
        except OSError as exc:
            raise Failure(
                "mcp_server_failed",
                f"{what} could not be started: {exc.strerror or exc}; check"
                " spec.mcpServers[].command",
            ) from None
        except Exception as exc:
            raise Failure(
                "mcp_server_failed",
                f"{what} failed to start: {_describe(exc)}; check spec.mcpServers[] and the"
                " server's stderr",
            ) from None
        return session, tools

    def _name_tools(self, listed: list[tuple[MCPServer, tuple[ClientSession, list[Any]]]]) -> None:
        counts: dict[str, int] = {}
        for _, (_, tools) in listed:
            for tool in tools:
                counts[_NAME.sub("_", tool.name)] = counts.get(_NAME.sub("_", tool.name), 0) + 1
        for server, (session, tools) in listed:
            for tool in tools:
                name = _NAME.sub("_", tool.name)
                if counts[name] > 1:
                    name = _NAME.sub("_", f"{server.name}_{tool.name}")
                name = name[:64]
                while name in self._routes:
                    name = f"{name[:60]}_{len(self._routes)}"
                self._routes[name] = _Route(session, server.name, tool.name)
                parameters = tool.input_schema or {"type": "object", "properties": {}}
                function = {
                    "name": name,
                    "description": tool.description or "",
                    "parameters": parameters,
                }
                self.functions.append({"type": "function", "function": function})

    async def call(self, function: str, arguments: str) -> ToolResult:
        """Call a tool the model asked for; every failure is a result the model is told."""
        started = time.monotonic()
        result = await self._call(function, arguments)
        result.duration_ms = round((time.monotonic() - started) * 1000, 1)
        return result

    async def _call(self, function: str, arguments: str) -> ToolResult:
        route = self._routes.get(function)
        if route is None:
            known = ", ".join(self._routes) or "none"
            return _failed("unknown_tool", f"there is no tool '{function}' (tools: {known})")
        try:
            args = json.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            return _failed("invalid_arguments", f"the arguments are not JSON ({exc})")
        if not isinstance(args, dict):
            return _failed("invalid_arguments", "the arguments are not a JSON object")
        try:
            with anyio.move_on_after(self._call_timeout) as scope:
                result = await route.session.call_tool(route.tool, args)
        except Exception as exc:
            return _failed(
                "tool_error", f"the MCP server '{route.server}' failed: {_describe(exc)}"
            )
        if scope.cancelled_caught:
            return _failed(
                "tool_timeout",
                f"the tool did not answer within {self._call_timeout:g} s"
                " (runtime.options.toolTimeoutMs)",
            )
        return _result(result)


def _failed(reason: str, message: str) -> ToolResult:
    return ToolResult(f"error: {message}", (reason, message))


def _result(result: object) -> ToolResult:
    from mcp_types import CallToolResult

    if not isinstance(result, CallToolResult):
        return _failed("tool_error", f"the tool answered {type(result).__name__}, not a result")
    parts = [_block_text(block) for block in result.content]
    text = "\n".join(part for part in parts if part)
    if not text and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False)
    if len(text) > MAX_RESULT_CHARS:
        text = f"{text[:MAX_RESULT_CHARS]}… [cut: {len(text) - MAX_RESULT_CHARS} more characters]"
    if result.is_error:
        return ToolResult(text, ("tool_error", text or "the tool failed"))
    return ToolResult(text)


def _block_text(block: Any) -> str:
    kind = getattr(block, "type", "")
    if kind == "text":
        return str(block.text)
    if kind == "resource":
        contents = block.resource
        text = getattr(contents, "text", None)
        return str(text) if text is not None else f"[resource {contents.uri}: binary]"
    if kind == "resource_link":
        return f"[resource {block.uri}]"
    mime = getattr(block, "mime_type", "")
    return f"[{kind} {mime}]".replace(" ]", "]")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _describe(exc.exceptions[0])
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@asynccontextmanager
async def _stdio(
    server: MCPServer,
) -> AsyncIterator[tuple[Any, Any]]:
    """The server's process, in this process group, as the SDK's read and write streams."""
    from mcp.client.stdio import get_default_environment
    from mcp.shared.message import SessionMessage

    process = await anyio.open_process(
        [server.command or "", *(server.args or [])],
        env=get_default_environment() | (server.env or {}),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=None,
    )
    to_session, read = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write, from_session = anyio.create_memory_object_stream[SessionMessage](0)

    async def pump_out() -> None:
        assert process.stdout is not None
        buffer = b""
        async with to_session:
            with suppress(*_GONE):
                async for chunk in process.stdout:
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in filter(bytes.strip, lines):
                        await to_session.send(_message(line))

    async def pump_in() -> None:
        assert process.stdin is not None
        async with from_session:
            try:
                async for item in from_session:
                    data = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(data.encode() + b"\n")
            except _GONE:
                await to_session.aclose()  # the session sees the end, not a hang

    async with anyio.create_task_group() as tg:
        tg.start_soon(pump_out)
        tg.start_soon(pump_in)
        try:
            yield read, write
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process)
            tg.cancel_scope.cancel()


def _message(line: bytes) -> SessionMessage | Exception:
    """One line from the server: a JSON-RPC message, or the error the session reports."""
    import mcp_types
    from mcp.shared.message import SessionMessage

    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return exc


async def _stop(process: Any) -> None:
    """Close its stdin, give it :data:`STOP_GRACE` to exit, then kill it; reap it."""
    with suppress(*_GONE):
        await process.stdin.aclose()
    with anyio.move_on_after(STOP_GRACE):
        await process.wait()
    if process.returncode is None:
        with suppress(ProcessLookupError):
            process.kill()
        with anyio.move_on_after(STOP_GRACE):
            await process.wait()
