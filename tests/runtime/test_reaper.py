"""The reaper kills the adapters still registered when the server's pipe closes."""

from __future__ import annotations

import signal
import subprocess

import trio

from tests.helpers import pid_alive
from trioserve.runtime.reaper import Reaper


async def test_registered_groups_die_when_the_pipe_closes() -> None:
    leader = subprocess.Popen(["sh", "-c", "sleep 60 & exec sleep 60"], start_new_session=True)
    done = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        reaper = Reaper()
        reaper.start()
        reaper.add(leader.pid)
        reaper.add(done.pid)
        reaper.remove(done.pid)  # reaped by the server: the reaper leaves it alone
        await trio.sleep(0.2)
        assert pid_alive(leader.pid)
        await reaper.aclose()  # what the kernel does when the server dies
        leader.wait(timeout=5)
        assert leader.returncode == -9
        await trio.sleep(0.2)
        assert pid_alive(done.pid)
    finally:
        for proc in (leader, done):
            proc.kill()
            proc.wait()


def _ignores(pid: int, sig: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        mask = next(line for line in f if line.startswith("SigIgn:")).split()[1]
    return bool(int(mask, 16) & (1 << (sig - 1)))


async def test_reaper_ignores_sigint_meant_for_the_server() -> None:
    reaper = Reaper()
    reaper.start()
    assert reaper._proc is not None
    with trio.fail_after(10):  # until it has started and ignores SIGINT
        while not _ignores(reaper._proc.pid, signal.SIGINT):
            await trio.sleep(0.02)
    reaper._proc.send_signal(signal.SIGINT)
    await trio.sleep(0.2)
    assert reaper._proc.poll() is None
    await reaper.aclose()
