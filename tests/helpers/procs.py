"""Processes as the tests see them: alive, gone, the fake adapters running."""

from __future__ import annotations

import os

import trio

#: The pids a scripted adapter reports (``helpers.scripted``): above the kernel's
#: largest (``pid_max`` is at most 2**22), so no process ever has one.
SCRIPTED_PIDS = 2**22 + 1


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie.

    A scripted adapter's pid is refused: a test that looks at processes must
    run them (``start_server(processes=True)``), or its checks could not fail.
    """
    assert pid < SCRIPTED_PIDS, f"pid {pid} is a scripted adapter's: the test needs processes"
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def children(pid: int, needle: bytes) -> set[int]:
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


def fake_adapters() -> set[int]:
    """The fake adapters this test process runs, alive (servers run in-process)."""
    return children(os.getpid(), b"fakeadapter.py")


async def wait_gone(pid: int, within: float = 10.0) -> None:
    """Wait until ``pid`` has exited and been reaped; fail after ``within`` seconds.

    The deadline is a safety net, not a measurement (speed is the benchmarks' job): on a
    loaded machine a process that is sent SIGINT may take a second or more to unwind."""
    with trio.fail_after(within):
        while pid_alive(pid):
            await trio.sleep(0.01)
