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
   - ``echo`` (trioserve extension): the built-in echo adapter.
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
EXTENSION_TYPES: Final = ("exec", "echo")
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


def echo_command() -> list[str]:
    return [sys.executable, "-m", "trioserve.runtime.echo_adapter"]


def resolve_command(
    runtime_type: str,
    spec_command: Sequence[str] | None = None,
    *,
    override: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> list[str]:
    """Return the argv that starts the adapter for ``runtime_type``."""
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
    if runtime_type == "echo":
        return echo_command()
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
