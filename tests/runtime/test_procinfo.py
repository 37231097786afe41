"""What /proc says about real starting processes: loaded or not, through a
read, an epoll set, a wrapper shell; the fallback; nice on every thread."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from tests.helpers import FAKE_ADAPTER
from trioserve.runtime._procinfo import LoadWatch, PipeId, read_stat, set_nice, threads, waits_on

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

ASYNCIO_READER = """
import asyncio, sys
async def main():
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    await reader.read()
asyncio.run(main())
"""
NODE_READER = (
    "let d = ''; process.stdin.on('data', c => d += c); process.stdin.on('end', () => {});"
)


class Child:
    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True
        )
        assert self.proc.stdin is not None
        self.pipe = PipeId.of(self.proc.stdin.fileno())

    def watch(self, *, pipe: bool = True) -> LoadWatch:
        return LoadWatch(self.proc.pid, self.pipe if pipe else None, quiet=0.25, now=now())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def children() -> Iterator[list[Child]]:
    started: list[Child] = []
    yield started
    for child in started:
        child.close()


def now() -> float:
    return time.monotonic()


async def until_loaded(watch: LoadWatch, mark: Path | None = None) -> None:
    """Check every 20 ms until loaded; with ``mark``, loaded must never come before it."""
    with trio.fail_after(30):
        while True:
            await trio.sleep(0.02)
            loaded = watch.check(now())
            if mark is not None:
                assert not loaded or await trio.Path(mark).exists(), "loaded too soon"
            if loaded:
                return


async def test_a_process_is_loaded_only_once_it_reads_its_stdin(
    children: list[Child], tmp_path: Path
) -> None:
    mark = tmp_path / "loaded"
    child = Child([*FAKE_ADAPTER, "--startup-burn", "0.3", "--startup-mark", str(mark)])
    children.append(child)
    watch = child.watch()
    await until_loaded(watch, mark)
    assert waits_on(child.proc.pid, child.pipe) == "reading"
    assert watch.cpu_seconds >= 0.3  # the burn, as /proc counts it


async def test_sleeping_before_reading_is_still_loading(
    children: list[Child], tmp_path: Path
) -> None:
    mark = tmp_path / "loaded"
    child = Child([*FAKE_ADAPTER, "--startup-sleep", "1.5", "--startup-mark", str(mark)])
    children.append(child)
    watch = child.watch()
    seen_busy = False
    with trio.fail_after(30):
        while not watch.check(now()):
            verdict = waits_on(child.proc.pid, child.pipe)
            if not await trio.Path(mark).exists():
                assert verdict == "busy"  # asleep (or starting): no CPU, not reading
                seen_busy = True
            await trio.sleep(0.05)
    assert await trio.Path(mark).exists() and seen_busy


async def test_an_epoll_reader_is_loaded(children: list[Child]) -> None:
    child = Child([sys.executable, "-c", ASYNCIO_READER])
    children.append(child)
    await until_loaded(child.watch())
    assert waits_on(child.proc.pid, child.pipe) == "reading"


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node")
async def test_a_node_reader_is_loaded(children: list[Child]) -> None:
    child = Child(["node", "-e", NODE_READER])
    children.append(child)
    await until_loaded(child.watch())
    assert waits_on(child.proc.pid, child.pipe) == "reading"


async def test_a_wrapper_is_looked_through_to_the_reader(
    children: list[Child], tmp_path: Path
) -> None:
    mark = tmp_path / "loaded"
    inner = " ".join([*FAKE_ADAPTER, "--startup-burn", "0.2", "--startup-mark", str(mark)])
    child = Child(["sh", "-c", f"{inner}; echo wrapper-done"])  # sh waits for python
    children.append(child)
    await until_loaded(child.watch(), mark)
    assert waits_on(child.proc.pid, child.pipe) == "busy"  # sh itself waits for its child


async def test_where_proc_says_nothing_quiet_cpu_means_loaded(children: list[Child]) -> None:
    # Without the pipe to look for, a sleeper counts as loaded once its CPU is quiet.
    child = Child([sys.executable, "-c", "import time; time.sleep(60)"])
    children.append(child)
    await until_loaded(child.watch(pipe=False))
    # With it, /proc says it sleeps: it is not loaded, however quiet.
    watch = child.watch()
    for _ in range(20):
        assert not watch.check(now())
        await trio.sleep(0.03)


async def test_set_nice_reaches_every_thread(children: list[Child]) -> None:
    code = (
        "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start();"
        " time.sleep(60)"
    )
    child = Child([sys.executable, "-c", code])
    children.append(child)
    pid = child.proc.pid
    with trio.fail_after(10):
        while len(threads(pid)) < 2:
            await trio.sleep(0.01)
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert set_nice(pid, base + 7)
    stat = read_stat(pid)
    assert stat is not None and stat.nice == base + 7
    for tid in threads(pid):
        assert os.getpriority(os.PRIO_PROCESS, tid) == base + 7
