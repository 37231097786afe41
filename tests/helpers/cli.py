"""Run ``trioserve run`` as a real subprocess, the way an operator does."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from tests.helpers.procs import children
from tests.helpers.specs import FAKE_ADAPTER

#: Finds the URL in ``trioserve run``'s startup line.
STARTUP_URL = re.compile(r" on (http://\S+) ")


def write_spec(directory: Path, *, runtime: str = "exec", name: str = "cli-agent") -> Path:
    """An ADL spec whose runtime is the fake adapter (or the built-in echo)."""
    command = ", ".join(f'"{part}"' for part in FAKE_ADAPTER)
    runtime_block = (
        f"    type: exec\n    command: [{command}]\n" if runtime == "exec" else "    type: echo\n"
    )
    path = directory / f"{name}.yaml"
    path.write_text(
        "apiVersion: agent-controller.dev/v1alpha1\n"
        "kind: Agent\n"
        f"metadata:\n  name: {name}\n"
        "spec:\n"
        "  model:\n    provider: anthropic\n    name: claude-sonnet-4-20250514\n"
        "  task: Say hello.\n"
        "  tools: []\n"
        f"  runtime:\n{runtime_block}"
    )
    return path


@dataclass
class CLIServer:
    proc: trio.Process
    url: str = ""
    stderr: bytearray = field(default_factory=bytearray)
    #: Set once its stderr is read to the end: every process that held it has closed it.
    stderr_closed: trio.Event = field(default_factory=trio.Event)

    @property
    def startup_line(self) -> str:
        return next(line for line in self.log.splitlines() if " on http://" in line)

    @property
    def log(self) -> str:
        return self.stderr.decode(errors="replace")

    def signal(self, sig: signal.Signals = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    async def wait(self, within: float = 30) -> int:
        """Its exit status, once it exited and, for up to 5 s more, its stderr was read to
        the end: its exit can be seen before what it wrote last is read, and the processes
        it started that share its stderr (its reaper) go soon after it."""
        with trio.fail_after(within):
            code = await self.proc.wait()
        with trio.move_on_after(5):
            await self.stderr_closed.wait()
        return code

    async def whole_log(self, within: float = 30) -> str:
        """The log once every process writing to it is gone and all of it was read (a
        process's exit can be seen before what it wrote last is read)."""
        with trio.fail_after(within):
            await self.stderr_closed.wait()
        return self.log


def cli_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg-data")
    env["TRIOSERVE_ECHO_STATE_DIR"] = str(tmp_path / "echo-state")
    for name in ("TRIOSERVE_RUNTIME_COMMAND", "TRIOSERVE_API_KEYS_FILE", "TRIOSERVE_API_KEY"):
        env.pop(name, None)
    return env


async def start_cli_server(
    nursery: trio.Nursery,
    tmp_path: Path,
    spec: Path,
    *args: str,
    env: dict[str, str] | None = None,
    warm_pool: bool = False,
    **options: Any,
) -> CLIServer:
    """Start ``trioserve run SPEC --port 0 ARGS`` and wait for its startup line.

    The server runs without a warm pool (``--warm-adapters 0``: a warm adapter
    is a process a test pays for and rarely uses) unless the test passes
    ``warm_pool=True`` (the default pool) or its own ``--warm-adapters``.
    ``env`` is added to the environment; ``options`` go to ``subprocess.Popen``
    (``preexec_fn``, for one).
    """
    pool = [] if warm_pool or "--warm-adapters" in args else ["--warm-adapters", "0"]
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "trioserve", "run", str(spec), "--port", "0", *pool, *args],
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env={**cli_env(tmp_path), **(env or {})},
        cwd=tmp_path,
        **options,
    )
    server = CLIServer(proc)
    ready = trio.Event()

    async def pump() -> None:
        assert proc.stderr is not None
        try:
            while chunk := await proc.stderr.receive_some(65536):
                server.stderr += chunk
                if not ready.is_set() and (match := STARTUP_URL.search(server.log)):
                    server.url = match.group(1)
                    ready.set()
        finally:
            ready.set()
            server.stderr_closed.set()
            # The test is over (or failed) with the server still up: it must
            # not outlive its test.
            if proc.returncode is None:
                proc.kill()
                with trio.CancelScope(shield=True), trio.move_on_after(10):
                    await proc.wait()

    nursery.start_soon(pump)
    with trio.fail_after(60):  # a hang guard: a server starts in 1-2 s, 20+ s at load 16
        await ready.wait()
    if not server.url:
        raise AssertionError(f"server did not start:\n{server.log}")
    return server


def run_cli(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a short trioserve command to completion (``env`` is added to the environment)."""
    return subprocess.run(
        [sys.executable, "-m", "trioserve", *args],
        capture_output=True,
        text=True,
        env={**cli_env(tmp_path), **(env or {})},
        cwd=tmp_path,
        timeout=60,
    )


#: ``trioserve run`` in a command line (/proc/PID/cmdline): a supervisor's workers.
WORKER = b"trioserve\x00run\x00"


async def stop_all(servers: list[CLIServer], within: float = 10) -> None:
    """Stop the ``trioserve run`` processes a test started, however the test ended.

    Two SIGTERMs (drain, then stop now: a supervisor forwards both), then
    SIGKILL for what still runs after ``within`` seconds, a supervisor's
    workers included (on PostgreSQL their connections would stay open).
    """
    running = [s for s in servers if s.proc.returncode is None]
    workers = {pid for s in running for pid in children(s.proc.pid, WORKER)}
    for server in running:
        for _ in range(2):
            with contextlib.suppress(ProcessLookupError):
                server.signal(signal.SIGTERM)
    with trio.move_on_after(within):
        for server in running:
            await server.proc.wait()
    for server in running:
        if server.proc.returncode is None:
            server.proc.kill()
            await server.proc.wait()
    for pid in workers:  # a supervisor killed: its workers would drain on their own
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
