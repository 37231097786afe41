"""What Linux's ``/proc`` says about the servers and the machine: CPU time, RSS,
descriptors, child processes, how busy the CPUs are."""

from __future__ import annotations

import contextlib
import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field


def proc_status(pid: int) -> dict[str, str]:
    out = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def rss_mib(pid: int, key: str = "VmRSS") -> float:
    kib = int(proc_status(pid)[key].split()[0])
    return round(kib / 1024, 1)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` (all its threads, not its children)."""
    with open(f"/proc/{pid}/stat") as fh:
        stat = fh.read()
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """CPU time of ``pid``, of the children it reaped, and of its live children.

    Across an interval, the difference counts every process the server ran in
    it (adapters exec'd or forked, the fork server, the warm pool's).
    """
    with open(f"/proc/{pid}/stat") as fh:
        stat = fh.read()
    fields = stat[stat.rfind(")") + 2 :].split()
    total = sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    for child in children_of(pid):
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += cpu_seconds(child)
    return total


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def fd_limit(pid: int) -> str:
    with open(f"/proc/{pid}/limits") as fh:
        for line in fh:
            if line.startswith("Max open files"):
                return " ".join(line.split()[3:5])
    return "?"


def _is_reaper(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"trioserve.runtime.reaper" in fh.read()
    except OSError:
        return False


def children_of(pid: int) -> list[int]:
    """Adapter pids whose parent is ``pid`` (zombies included).

    The server's one reaper process (``trioserve.runtime.reaper``) is not an adapter
    and is left out.
    """
    return [kid for kid in _parents().get(pid, []) if not _is_reaper(str(kid))]


def cpu_busy(interval: float = 1.0) -> float:
    """Fraction of all CPUs busy (anyone's work) over ``interval`` seconds."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields), idle

    total0, idle0 = sample()
    time.sleep(interval)
    total1, idle1 = sample()
    spent = total1 - total0
    return round(1 - (idle1 - idle0) / spent, 3) if spent else 0.0


def wait_for_quiet(limit: float, budget: float) -> float:
    """Wait up to ``budget`` s for other load to drop below ``limit``; the last reading."""
    deadline = time.monotonic() + budget
    busy = cpu_busy()
    while busy > limit and time.monotonic() < deadline:
        busy = cpu_busy()
    return busy


def raise_fd_limit(wanted: int = 65536) -> tuple[int, int]:
    """Raise RLIMIT_NOFILE's soft limit (servers started later inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def _parents() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
                kids.setdefault(ppid, []).append(int(entry))
    return kids


def _cmdline(pid: int) -> bytes:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as fh:
        return fh.read()
    return b""


def server_tree(pid: int) -> list[int]:
    """``pid`` and its descendants that are trioserve processes: a supervisor's workers,
    reapers; not adapters (scenario c does not count those either)."""
    kids, out, todo = _parents(), [pid], [pid]
    while todo:
        for kid in kids.get(todo.pop(), []):
            if b"trioserve" in _cmdline(kid):
                out.append(kid)
                todo.append(kid)
    return out


def server_workers(pid: int) -> list[int]:
    """The processes that serve: ``pid`` itself, or a supervisor's ``trioserve run`` children."""
    kids = [p for p in server_tree(pid)[1:] if b"trioserve\x00run\x00" in _cmdline(p)]
    return kids or [pid]


@dataclass
class Meter:
    """User + system CPU seconds of a changing set of processes (each one's last reading)."""

    pids: Callable[[], list[int]]
    seen: dict[int, float] = field(default_factory=dict)

    def __call__(self) -> float:
        for pid in self.pids():
            with contextlib.suppress(OSError):
                self.seen[pid] = cpu_seconds(pid)
        return sum(self.seen.values())


def tree_meter(*pids: int) -> Meter:
    """The CPU of each of ``pids`` and its trioserve descendants (``server_tree``)."""
    return Meter(lambda: [p for pid in pids for p in server_tree(pid)])
