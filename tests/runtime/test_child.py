"""An adapter process started on the Trio thread: its pipes, its exit, its failures."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import trio

from trioserve.runtime import _child
from trioserve.runtime._child import exec_process

PYTHON = sys.executable


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


async def test_a_child_reads_its_stdin_and_its_output_and_exit_come_back() -> None:
    code = "import sys; d = sys.stdin.read(); print(d.upper()); sys.stderr.write('e'); exit(3)"
    proc = exec_process([PYTHON, "-c", code])
    assert proc.returncode is None
    await proc.stdin.send_all(b"spec")
    await proc.stdin.aclose()
    out = b""
    while chunk := await proc.stdout.receive_some():
        out += chunk
    assert out == b"SPEC\n"
    assert await proc.stderr.receive_some() == b"e"
    assert await proc.wait() == 3
    assert proc.returncode == 3


async def test_a_child_leads_a_process_group_of_its_own() -> None:
    proc = exec_process([PYTHON, "-c", "import time; time.sleep(30)"])
    try:
        assert os.getpgid(proc.pid) == proc.pid != os.getpgid(0)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        assert await proc.wait() == -signal.SIGKILL


@pytest.mark.parametrize(
    ("command", "cwd"),
    [
        (["/nonexistent/adapter"], None),
        ([PYTHON, "-c", "pass"], Path("/nonexistent/dir")),
        (["/etc/hostname"], None),  # not executable
    ],
)
async def test_a_child_that_cannot_start_raises_and_leaves_no_pipe_open(
    command: list[str], cwd: Path | None
) -> None:
    before = open_fds()
    with pytest.raises(OSError):
        exec_process(command, cwd=cwd)
    assert open_fds() == before


async def test_a_child_reaped_by_a_look_at_its_code_ends_a_wait_under_way() -> None:
    # stop_process looks at returncode while run_adapter's watch task is in wait():
    # the look reaps it; the wait returns the same code.
    proc = exec_process([PYTHON, "-c", "import time; time.sleep(0.2)"])
    codes: list[int] = []

    async def waiter() -> None:
        codes.append(await proc.wait())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        with trio.fail_after(30):
            while proc.returncode is None:
                await trio.sleep(0.01)
    assert codes == [0]


async def test_popen_knows_of_the_end_so_subprocess_never_reaps_the_pid_later() -> None:
    proc = exec_process([PYTHON, "-c", "pass"])
    assert await proc.wait() == 0
    assert proc._popen.returncode == 0  # else Popen.__del__ would queue it for a waitpid


async def test_the_environment_and_the_working_directory_are_the_child_s(tmp_path: Path) -> None:
    code = "import os; print(os.environ['ONLY'], os.getcwd(), 'PATH' in os.environ)"
    proc = exec_process([PYTHON, "-c", code], env={"ONLY": "x"}, cwd=tmp_path)
    await proc.stdin.aclose()
    out = b""
    while chunk := await proc.stdout.receive_some():
        out += chunk
    assert out.decode().split() == ["x", str(tmp_path), "False"]
    assert await proc.wait() == 0


@pytest.mark.parametrize("waitid", [True, False], ids=["waitid-thread", "polled"])
async def test_without_a_pidfd_a_wait_still_ends_and_a_cancelled_one_changes_nothing(
    monkeypatch: pytest.MonkeyPatch, waitid: bool
) -> None:
    # Before Linux 5.3, and under valgrind, there is no pidfd_open.
    monkeypatch.setattr(_child, "_pidfd_open", lambda pid: None)
    if not waitid:
        monkeypatch.delattr(os, "waitid")
    proc = exec_process([PYTHON, "-c", "import sys; sys.stdin.read(); exit(4)"])
    with trio.move_on_after(0.2) as early:
        await proc.wait()
    assert early.cancelled_caught and proc.returncode is None
    await proc.stdin.aclose()
    with trio.fail_after(30):
        assert await proc.wait() == 4


async def test_waits_at_once_all_end_with_the_code_even_when_the_first_waiter_leaves() -> None:
    # run_adapter's exit watch and stop_process both wait; one waits for the exit, the
    # others for that one.
    proc = exec_process([PYTHON, "-c", "import sys; sys.stdin.read(); exit(5)"])
    codes: list[int] = []

    async def waiter() -> None:
        codes.append(await proc.wait())

    async with trio.open_nursery() as nursery:
        async with trio.open_nursery() as first:
            first.start_soon(waiter)
            await trio.sleep(0.05)  # it waits for the exit
            nursery.start_soon(waiter)
            nursery.start_soon(waiter)
            await trio.sleep(0.05)  # they wait for it
            first.cancel_scope.cancel()
        await trio.sleep(0.05)
        assert codes == [] and proc.returncode is None
        await proc.stdin.aclose()
    assert codes == [5, 5]
