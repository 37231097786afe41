"""Test helpers, imported as ``from helpers import ...`` (``tests/`` is on the path).

``tests/conftest.py`` keeps only fixtures; what tests call lives here:
``specs`` (the fake adapter's command, specs, ``script``), ``procs`` (pids),
``sse`` (reading event streams), ``server`` (a server started in the
test's Trio run), ``scripted`` (an adapter launcher that plays the fake
adapter's scripts in-process), ``raw`` (byte-exact HTTP/1.1 requests),
``cli`` (``trioserve run`` as a real subprocess).
"""

from helpers.cli import (
    STARTUP_URL,
    WORKER,
    CLIServer,
    cli_env,
    run_cli,
    start_cli_server,
    stop_all,
    write_spec,
)
from helpers.procs import SCRIPTED_PIDS, children, fake_adapters, pid_alive, wait_gone
from helpers.raw import RawResponse, raw_request
from helpers.scripted import ScriptedLauncher
from helpers.server import Server, ServerFactory
from helpers.specs import FAKE_ADAPTER, MINIMAL_AGENT, TESTS, compiled_spec, script, typed_spec
from helpers.sse import Frame, parse_sse, read_frames

__all__ = [
    "FAKE_ADAPTER",
    "MINIMAL_AGENT",
    "SCRIPTED_PIDS",
    "STARTUP_URL",
    "TESTS",
    "WORKER",
    "CLIServer",
    "Frame",
    "RawResponse",
    "ScriptedLauncher",
    "Server",
    "ServerFactory",
    "children",
    "cli_env",
    "compiled_spec",
    "fake_adapters",
    "parse_sse",
    "pid_alive",
    "raw_request",
    "read_frames",
    "run_cli",
    "script",
    "start_cli_server",
    "stop_all",
    "typed_spec",
    "wait_gone",
    "write_spec",
]
