"""Agent specs: ADL documents, their validation, the registry, the compiler, runtimes.

``load_agent`` reads and validates an Agent document, ``compile_agent``
makes its ``CompiledSpec`` (what an adapter reads on stdin), and the
runtimes resolve which command runs a runtime type.  The modules are
private; the names other layers use are exported here and load on first
use (``trioserve._lazy``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trioserve._lazy import lazy_exports

if TYPE_CHECKING:
    from trioserve.spec._compiler import CompiledSpec, check_agent, compile_agent
    from trioserve.spec._context import (
        HISTORY_EVENT_TYPES,
        ApprovalContext,
        HistoryEvent,
        HistoryTurn,
        Resume,
        TurnContext,
        approval_tools,
        split_globs,
    )
    from trioserve.spec._documents import AgentDocument, MCPServer, load_agent, load_document
    from trioserve.spec._runtimes import (
        OVERRIDE_ENV,
        WITH_APPROVALS,
        WITH_HISTORY,
        RuntimeResolutionError,
        command_problem,
        echo_command,
        openai_command,
        python_command,
        resolve_command,
        split_command,
    )

__all__ = [
    "HISTORY_EVENT_TYPES",
    "OVERRIDE_ENV",
    "WITH_APPROVALS",
    "WITH_HISTORY",
    "AgentDocument",
    "ApprovalContext",
    "CompiledSpec",
    "HistoryEvent",
    "HistoryTurn",
    "MCPServer",
    "Resume",
    "RuntimeResolutionError",
    "TurnContext",
    "approval_tools",
    "check_agent",
    "command_problem",
    "compile_agent",
    "echo_command",
    "load_agent",
    "load_document",
    "openai_command",
    "python_command",
    "resolve_command",
    "split_command",
    "split_globs",
]

#: The private modules and what each exports here (loaded on first use).
_NAMES = {
    "_compiler": ("CompiledSpec", "check_agent", "compile_agent"),
    "_context": (
        "HISTORY_EVENT_TYPES",
        "ApprovalContext",
        "HistoryEvent",
        "HistoryTurn",
        "Resume",
        "TurnContext",
        "approval_tools",
        "split_globs",
    ),
    "_documents": ("AgentDocument", "MCPServer", "load_agent", "load_document"),
    "_runtimes": (
        "OVERRIDE_ENV",
        "WITH_APPROVALS",
        "WITH_HISTORY",
        "RuntimeResolutionError",
        "command_problem",
        "echo_command",
        "openai_command",
        "python_command",
        "resolve_command",
        "split_command",
    ),
}

if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, _NAMES)
