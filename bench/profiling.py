"""Profiles of the servers a run starts: py-spy attached, or cProfile wrapping."""

from __future__ import annotations

import io
import pstats
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bench import BenchError


@dataclass
class Profiler:
    """Optional profiling of each server: py-spy (attached) or cProfile (wrapping)."""

    mode: str  # "none" | "pyspy" | "cprofile"
    directory: Path
    _spy: subprocess.Popen[bytes] | None = None
    reports: dict[str, str] = field(default_factory=dict)

    def prefix(self, name: str) -> list[str] | None:
        if self.mode != "cprofile":
            return None
        out = self.directory / f"{name}.prof"
        return [sys.executable, "-m", "cProfile", "-o", str(out), "-m", "trioserve"]

    def attach(self, name: str, pid: int) -> None:
        if self.mode != "pyspy":
            return
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        out = self.directory / f"{name}.txt"
        argv = [spy, "record", "--pid", str(pid), "--rate", "1000"]
        argv += ["--format", "raw", "--nolineno", "--output", str(out), "--nonblocking"]
        self._spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)  # let py-spy attach before the traffic starts
        if self._spy.poll() is not None:
            err = self._spy.stderr.read().decode() if self._spy.stderr else ""
            raise BenchError(f"py-spy failed: {err.strip()}")

    def detach(self, name: str) -> None:
        if self._spy is None:
            return
        self._spy.send_signal(signal.SIGINT)
        try:
            self._spy.wait(30)
        except subprocess.TimeoutExpired:
            self._spy.kill()
            self._spy.wait(10)
        self._spy = None
        self.reports[f"{name} (py-spy)"] = summarize_collapsed(self.directory / f"{name}.txt")

    def after_exit(self, name: str) -> None:
        if self.mode != "cprofile":
            return
        out = io.StringIO()
        stats = pstats.Stats(str(self.directory / f"{name}.prof"), stream=out)
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(25)
        self.reports[f"{name} (cProfile)"] = out.getvalue()


#: Leaf frames that mean "waiting", not working: the event loop's epoll wait and
#: trio's idle worker threads.
IDLE_LEAVES = ("EpollIOManager.get_events", "WorkerThread._work")


def summarize_collapsed(path: Path, top: int = 25) -> str:
    """Top functions of a py-spy ``raw`` file, as shares of the non-idle samples."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = idle = 0
    if not path.exists():
        return f"(no samples: {path} missing)"
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        if frames[-1].startswith(IDLE_LEAVES):
            idle += count
            continue
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    busy = total - idle
    if busy <= 0:
        return "(no busy samples)"
    lines = [f"{total} samples, {idle} idle; shares of the {busy} busy samples", "-- self --"]
    lines += [f"{100 * n / busy:5.1f}%  {f}" for f, n in own.most_common(top)]
    lines.append("-- inclusive --")
    lines += [f"{100 * n / busy:5.1f}%  {f}" for f, n in inclusive.most_common(top)]
    return "\n".join(lines)
