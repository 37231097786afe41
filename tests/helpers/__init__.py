"""Test helpers, imported as ``from tests.helpers import ...``.

``tests/conftest.py`` keeps only fixtures; what tests call lives here:
``specs`` (the fake adapter's command, specs, ``script``), ``procs`` (pids),
``sse`` (reading event streams), ``server`` (a server started in the
test's Trio run), ``scripted`` (an adapter launcher that plays the fake
adapter's scripts in-process), ``raw`` (byte-exact HTTP/1.1 requests
and connections), ``keys`` (two tenants' API keys),
``cli`` (``trioserve run`` as a real subprocess), ``proxy`` (a TCP proxy
that cuts a stream), ``responder`` (scripted raw HTTP answers), ``receiver`` (a webhook receiver),
``threaded`` (servers on a Trio run in a thread), ``loops`` (one client
test run on Trio, asyncio and the blocking client).
"""

from tests.helpers.cli import (
    STARTUP_URL,
    WORKER,
    CLIServer,
    cli_env,
    run_cli,
    start_cli_server,
    stop_all,
    write_spec,
)
from tests.helpers.keys import KEY_A, KEY_B, auth, key_line, two_tenants
from tests.helpers.procs import SCRIPTED_PIDS, children, fake_adapters, pid_alive, wait_gone
from tests.helpers.proxy import CuttingProxy
from tests.helpers.raw import GUARD, Raw, RawResponse, Reply, parse_reply, raw_request
from tests.helpers.receiver import Received, Receiver, verify
from tests.helpers.scripted import ScriptedLauncher
from tests.helpers.server import Server, ServerFactory
from tests.helpers.specs import (
    APPROVAL_ADAPTER,
    FAKE_ADAPTER,
    FIXTURES,
    MINIMAL_AGENT,
    ROOT,
    TESTS,
    compiled_spec,
    script,
    typed_spec,
)
from tests.helpers.sse import Frame, parse_sse, read_frames

__all__ = [
    "APPROVAL_ADAPTER",
    "FAKE_ADAPTER",
    "FIXTURES",
    "GUARD",
    "KEY_A",
    "KEY_B",
    "MINIMAL_AGENT",
    "ROOT",
    "SCRIPTED_PIDS",
    "STARTUP_URL",
    "TESTS",
    "WORKER",
    "CLIServer",
    "CuttingProxy",
    "Frame",
    "Raw",
    "RawResponse",
    "Received",
    "Receiver",
    "Reply",
    "ScriptedLauncher",
    "Server",
    "ServerFactory",
    "auth",
    "children",
    "cli_env",
    "compiled_spec",
    "fake_adapters",
    "key_line",
    "parse_reply",
    "parse_sse",
    "pid_alive",
    "raw_request",
    "read_frames",
    "run_cli",
    "script",
    "start_cli_server",
    "stop_all",
    "two_tenants",
    "typed_spec",
    "verify",
    "wait_gone",
    "write_spec",
]
