"""Which command runs a spec's runtime adapter.

Precedence, first match wins:

1. ``--runtime-command "CMD ARGS"`` (``override``),
2. the environment variable ``TRIOSERVE_RUNTIME_COMMAND``,
3. ``runtime.type``:

   - ``local`` / ``local-pi``, ``local-opencode``, ``local-codex``,
     ``local-claude``: ``node <adapter-dir>/dist/index.js`` as the reference
     does, the adapter directory relative to the working directory; the
     environment variable ``AGENT_CONTROLLER_RUNTIME`` replaces the script;
   - ``exec`` (trioserve extension): ``runtime.command`` as given;
   - ``python`` (trioserve extension): ``runtime.module`` (``package.module:function``)
     called by ``python -m trioserve.runtime.forkserver run MODULE``, or forked
     from the fork server that imported it (``--fork-server auto``);
   - ``echo`` (trioserve extension): the built-in echo adapter;
   - ``openai`` (trioserve extension): the built-in adapter for model servers
     that speak the OpenAI Chat Completions API, told with ``--preload-mcp``
     to load the MCP client before it reads its stdin when the spec declares
     MCP servers (a warm adapter then has it loaded).

The ``openai`` adapter is given the session's earlier turns with each turn
(:data:`WITH_HISTORY`; ``sessions`` reads them from the event log).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

ADAPTER_DIRS: Final = {
    "local": "runtime",
    "local-pi": "runtime",
    "local-opencode": "runtime-opencode",
    "local-codex": "runtime-codex",
    "local-claude": "runtime-claude",
}
EXTENSION_TYPES: Final = ("exec", "python", "echo", "openai")
#: The runtime types whose adapter gets the session's earlier turns in its
#: CompiledSpec (``trioserve.history``); no other adapter sees the key.
WITH_HISTORY: Final = frozenset({"openai"})
#: The runtime types whose adapter may be asked to wait for approvals
#: (``trioserve.approval``, docs/wire-protocol.md), when the spec or the server asks.
WITH_APPROVALS: Final = frozenset({"openai", "exec", "python"})
RUNTIME_TYPES: Final = (*ADAPTER_DIRS, *EXTENSION_TYPES)

_INTERPRETER: Final = re.compile(r"node|nodejs|python[0-9.]*|pypy[0-9.]*")
OVERRIDE_ENV: Final = "TRIOSERVE_RUNTIME_COMMAND"
SCRIPT_ENV: Final = "AGENT_CONTROLLER_RUNTIME"


class RuntimeResolutionError(ValueError):
    """The runtime type has no command (an unknown type, or ``exec`` without one)."""


def split_command(text: str) -> list[str]:
    """Split ``"CMD ARGS"`` the way a POSIX shell would (no expansion)."""
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise RuntimeResolutionError(f"cannot parse runtime command {text!r}: {exc}") from None
    if not argv:
        raise RuntimeResolutionError("runtime command is empty")
    return argv


def python_command(module: str) -> list[str]:
    """A Python adapter, ``package.module:function``, exec'd (see ``runtime.forkserver``)."""
    return [sys.executable, "-m", "trioserve.runtime.forkserver", "run", module]


def echo_command() -> list[str]:
    return [sys.executable, "-m", "trioserve.runtime.echo_adapter"]


def openai_command(*, preload_mcp: bool = False) -> list[str]:
    argv = [sys.executable, "-m", "trioserve.runtime.openai_adapter"]
    return [*argv, "--preload-mcp"] if preload_mcp else argv


def resolve_command(
    runtime_type: str,
    spec_command: Sequence[str] | None = None,
    *,
    override: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    mcp_servers: bool = False,
    module: str | None = None,
) -> list[str]:
    """Return the argv that starts the adapter for ``runtime_type``.

    ``mcp_servers``: the spec declares MCP servers (the ``openai`` adapter
    then loads its MCP client ahead of the turn); ``module``: ``runtime.module``.
    """
    environ = os.environ if env is None else env
    if override:
        return list(override)
    if environ.get(OVERRIDE_ENV, "").strip():
        return split_command(environ[OVERRIDE_ENV])
    if runtime_type in ADAPTER_DIRS:
        script = environ.get(SCRIPT_ENV, "").strip()
        if not script:
            base = cwd if cwd is not None else Path.cwd()
            script = str(base / ADAPTER_DIRS[runtime_type] / "dist" / "index.js")
        return ["node", script]
    if runtime_type == "exec":
        if not spec_command:
            raise RuntimeResolutionError("runtime.type 'exec' needs runtime.command")
        return list(spec_command)
    if runtime_type == "python":
        if not module:
            raise RuntimeResolutionError("runtime.type 'python' needs runtime.module")
        return python_command(module)
    if runtime_type == "echo":
        return echo_command()
    if runtime_type == "openai":
        return openai_command(preload_mcp=mcp_servers)
    valid = ", ".join(RUNTIME_TYPES)
    raise RuntimeResolutionError(f"unknown runtime.type {runtime_type!r}: expected one of {valid}")


def command_problem(argv: Sequence[str]) -> str | None:
    """A warning when the adapter command cannot run as it stands, else None.

    Checked once at start-up, so the operator learns of a missing ``node`` or
    adapter script before the first turn fails on it.
    """
    program = argv[0]
    if shutil.which(program) is None:
        return f"adapter program {program!r} not found on PATH"
    if _INTERPRETER.fullmatch(Path(program).name) and len(argv) > 1:
        script = argv[1]
        if not script.startswith("-") and not Path(script).exists():
            return f"adapter script {script} does not exist"
    return None
