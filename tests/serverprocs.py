"""Stopping the ``trioserve run`` processes a test started, however the test ended.

A test that fails half-way leaves its servers running (and, on PostgreSQL,
their connections open); ``stop_all`` in a fixture's teardown ends them:
two SIGTERMs (drain, then stop now: a supervisor forwards both), then
SIGKILL for what is still running after ``within`` seconds, workers of a
supervisor included.
"""

from __future__ import annotations

import contextlib
import os
import signal

import trio

from helpers import CLIServer

WORKER = b"trioserve\x00run\x00"  # in a command line (/proc/PID/cmdline)


def children(pid: int, needle: bytes = WORKER) -> set[int]:
    """The live child processes of ``pid`` whose command line has ``needle``."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read()
        except OSError:
            continue
        if int(ppid) == pid and state != "Z" and needle in command:
            found.add(int(entry))
    return found


async def stop_all(servers: list[CLIServer], within: float = 10) -> None:
    running = [s for s in servers if s.proc.returncode is None]
    workers = {pid for s in running for pid in children(s.proc.pid)}
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
