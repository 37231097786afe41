"""The fake adapter's command, specs for tests, and scripted turn inputs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from trioserve.spec._compiler import CompiledSpec

#: ``tests/``, its data files (``tests/fixtures``) and the repository's root.
TESTS = Path(__file__).parent.parent
FIXTURES = TESTS / "fixtures"
ROOT = TESTS.parent
#: ``tests/helpers/fakeadapter.py`` as a command (see its docstring for the steps a script runs).
FAKE_ADAPTER = [sys.executable, str(Path(__file__).parent / "fakeadapter.py")]
#: An adapter that asks for an approval before its ``deploy`` tool runs (approval_adapter.py).
APPROVAL_ADAPTER = [sys.executable, str(Path(__file__).parent / "approval_adapter.py")]


#: The smallest valid ADL Agent document, for tests that change one field of it.
MINIMAL_AGENT: dict[str, Any] = {
    "apiVersion": "agent-controller.dev/v1alpha1",
    "kind": "Agent",
    "metadata": {"name": "t"},
    "spec": {
        "model": {"provider": "anthropic", "name": "claude-sonnet-4-20250514"},
        "task": "Go.",
        "tools": [],
        "runtime": {"type": "local"},
    },
}


def compiled_spec(task: str = "Say hello.", runtime: str = "exec") -> dict[str, Any]:
    """A CompiledSpec's wire form (as ``to_json_dict`` gives it), for a tiny test agent."""
    command = {"command": FAKE_ADAPTER} if runtime == "exec" else {}
    return {
        "v": 1,
        "metadata": {"name": "test-agent"},
        "model": {"provider": "anthropic", "name": "claude-sonnet-4-20250514"},
        "task": task,
        "tools": [],
        "extensions": [],
        "skills": [],
        "runtime": {"type": runtime, **command},
    }


def typed_spec(task: str = "Say hello.", runtime: str = "exec") -> CompiledSpec:
    """:func:`compiled_spec` as the typed CompiledSpec the server and manager take."""
    return CompiledSpec.from_json_dict(compiled_spec(task, runtime))


def script(*steps: dict[str, Any]) -> str:
    """A turn input that makes the fake adapter run ``steps``."""
    return "script:" + json.dumps(list(steps))
