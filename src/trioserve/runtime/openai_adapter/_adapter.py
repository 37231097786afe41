"""A turn's run, from the spec on stdin to its last event and exit status.

The event loop is anyio on asyncio (the MCP SDK runs on anyio; asyncio
starts faster than trio here, and this is a process of its own).  The turn
runs in a cancel scope that SIGINT and SIGTERM cancel; the MCP servers are
stopped in a shielded cleanup either way.  Every way a turn can end prints
``session.ended`` once: ``completed`` (status 0), ``error`` after an
``error`` event (status 1; an unexpected exception too, its traceback on
stderr only), ``cancelled`` (status 130).
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import traceback
from typing import Any, Final

import anyio
import anyio.abc

from trioserve.errors import SpecError
from trioserve.runtime.openai_adapter._client import ModelClient
from trioserve.runtime.openai_adapter._events import Emitter, Failure
from trioserve.runtime.openai_adapter._mcp import ToolBox, load_mcp
from trioserve.runtime.openai_adapter._settings import settings_from
from trioserve.runtime.openai_adapter._turn import Parked, Turn
from trioserve.spec import CompiledSpec

BACKEND: Final = "asyncio"


def preload_mcp() -> None:
    """Load the MCP SDK now (a missing one is reported by the turn that needs it)."""
    with contextlib.suppress(Failure):
        load_mcp()


def warm_up() -> None:
    """Load now what a turn loads on first use: the event loop's modules, httpx's
    transports and the TLS context.  The fork server calls it once (issue 30), so
    each forked turn starts with them loaded; it leaves no thread or descriptor.
    """

    async def nothing() -> None:
        await ModelClient.warm_up()

    anyio.run(nothing, backend=BACKEND)


def run(raw: bytes) -> int:
    """Run the turn of the CompiledSpec ``raw``; the process's exit status."""
    pending: list[int] = []
    # From here a signal is the turn's to handle: kept until its receiver is open.
    signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    signal.signal(signal.SIGTERM, lambda signum, frame: pending.append(signum))
    try:
        decoded = json.loads(raw)
        emitter = Emitter(_session_id(decoded))
        try:
            spec = CompiledSpec.from_json_dict(decoded if isinstance(decoded, dict) else {})
        except SpecError as exc:
            emitter.failed(
                Failure("spec_invalid", f"the CompiledSpec on stdin is not valid: {exc}")
            )
            return 1
        return anyio.run(_run, spec, emitter, pending, backend=BACKEND)
    except ValueError as exc:
        Emitter("").failed(Failure("spec_invalid", f"the CompiledSpec on stdin is not JSON: {exc}"))
        return 1
    except BrokenPipeError:  # the server is gone: nobody to tell
        return 1


def _session_id(decoded: Any) -> str:
    session_id = decoded.get("sessionId") if isinstance(decoded, dict) else None
    return session_id if isinstance(session_id, str) else ""


async def _run(spec: CompiledSpec, emitter: Emitter, pending: list[int]) -> int:
    model = spec.model.model_dump(mode="json", exclude_none=True)
    emitter.started(spec.metadata.name, model)
    turn = Turn(spec, settings_from(spec.runtime.options or {}), emitter)
    async with anyio.create_task_group() as tg:
        work = anyio.CancelScope()
        await tg.start(_watch_signals, work, pending)
        status = 130
        with work:
            status = await _turn(turn, emitter)
        tg.cancel_scope.cancel()
    if work.cancelled_caught and not emitter.ended:
        emitter.emit("session.ended", {"reason": "cancelled"})
        return 130
    return status


async def _turn(turn: Turn, emitter: Emitter) -> int:
    settings = turn.settings
    try:
        tools = ToolBox(
            turn.spec,
            start_timeout=settings.mcp_start_timeout,
            call_timeout=settings.tool_timeout,
        )
        async with tools:
            return await _talk(turn, tools, emitter)
    except Failure as failure:  # the MCP servers did not start
        emitter.failed(failure)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        message = (
            f"the openai adapter failed: {type(exc).__name__}: {exc} (traceback on its stderr)"
        )
        emitter.failed(Failure("adapter_internal_error", message))
    return 1


async def _talk(turn: Turn, tools: ToolBox, emitter: Emitter) -> int:
    """The turn's rounds; its end is printed before the MCP servers stop (no need to wait)."""
    model = ModelClient(turn.settings, turn.spec.model.name)
    try:
        await turn.run(tools, model)
    except Parked:  # approval.requested was printed; the server runs the rest later
        emitter.emit("session.ended", {"reason": "waiting"})
        return 0
    except Failure as failure:
        emitter.failed(failure)
        return 1
    finally:
        with anyio.CancelScope(shield=True):
            await model.aclose()
    emitter.emit(
        "session.ended", {"reason": "completed", "rounds": turn.rounds, "usage": turn.usage}
    )
    return 0


async def _watch_signals(
    work: anyio.CancelScope,
    pending: list[int],
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        if pending:
            work.cancel()
        async for _ in signals:
            work.cancel()
