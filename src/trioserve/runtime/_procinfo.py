"""What Linux's /proc says about a starting adapter and about the machine.

The warm pool (``trioserve.runtime._pool``) asks two questions here:

- Has a process finished loading?  ``LoadWatch.check`` says yes once one of
  its threads is blocked reading the pipe on its stdin and its CPU time
  has stopped growing.  "Reading" is read from ``/proc/PID/task/TID/syscall``:
  a ``read``-family call on a descriptor that is that pipe, or an
  ``epoll_wait`` on an epoll set that watches it (the epoll's
  ``/proc/PID/fdinfo`` lists each watched file's inode: Node, Python's
  asyncio and Go wait this way).  A process that is not itself reading (a
  shell or ``npx`` running the real adapter as a child) is looked through:
  its descendants are checked the same way.  Where /proc says nothing (not
  Linux, no access, an architecture whose syscall numbers are not listed
  here, or a thread in ``poll``/``select``/``io_uring``, whose descriptors
  cannot be read from outside) the process counts as loaded once its CPU
  time has not grown for ``quiet`` seconds.  A process sleeping or
  waiting on anything else is still loading, however idle its CPU.
- How many cores are free?  ``CpuMeter.free_cores``: the cores this
  process may run on, less the machine's busy cores over the last moment
  (``/proc/stat``).

Every read is a small synchronous read of a /proc file (microseconds; /proc
never waits on a disk), and a vanished process reads as "nothing to say".
``set_nice`` sets the nice value of every thread of a process and its
descendants (on Linux nice is per thread; threads started later inherit it).
"""

from __future__ import annotations

import contextlib
import os
import platform
from dataclasses import dataclass
from typing import Final, Literal

#: Where a process is, as far as its stdin goes.
Verdict = Literal["reading", "busy", "unknown"]


@dataclass(frozen=True)
class _Syscalls:
    read: frozenset[int]  # read, pread64, readv, preadv, preadv2: fd first
    epoll: frozenset[int]  # epoll_wait, epoll_pwait, epoll_pwait2: epfd first
    opaque: frozenset[int]  # poll, ppoll, select, pselect6, io_uring_enter


_SYSCALLS: Final = {
    "x86_64": _Syscalls(
        frozenset({0, 17, 19, 295, 327}),
        frozenset({232, 281, 441}),
        frozenset({7, 23, 270, 271, 426}),
    ),
    "aarch64": _Syscalls(
        frozenset({63, 65, 67, 69, 286}),
        frozenset({22, 441}),
        frozenset({72, 73, 426}),
    ),
}
_TICK: Final = 1.0 / os.sysconf("SC_CLK_TCK")
_MAX_TREE: Final = 16  # processes looked at under one adapter


@dataclass(frozen=True)
class PipeId:
    """A pipe, as /proc names it: ``pipe:[INODE]`` and the epoll fdinfo's ``ino:``/``sdev:``."""

    ino: int
    dev: int  # the kernel's dev_t (MAJOR << 20 | MINOR), as fdinfo prints it

    @classmethod
    def of(cls, fd: int) -> PipeId:
        st = os.fstat(fd)
        return cls(st.st_ino, os.major(st.st_dev) << 20 | os.minor(st.st_dev))

    @property
    def link(self) -> str:
        return f"pipe:[{self.ino}]"


@dataclass(frozen=True)
class Stat:
    """The few fields of ``/proc/PID/stat`` the pool uses."""

    state: str
    cpu_ticks: int  # utime + stime of all its threads
    nice: int

    @property
    def cpu_seconds(self) -> float:
        return self.cpu_ticks * _TICK


def read_stat(pid: int) -> Stat | None:
    """``/proc/PID/stat``, or None (gone, or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rfind(b")") + 2 :].split()
    try:  # fields 3 (state), 14 and 15 (utime, stime), 19 (nice)
        return Stat(fields[0].decode(), int(fields[11]) + int(fields[12]), int(fields[16]))
    except (IndexError, ValueError):
        return None


def cpu_wanted(pid: int) -> float | None:
    """Seconds the process's main thread has run or waited to run (``/proc/PID/schedstat``).

    Compared with the wall time it tells CPU work (it wanted the CPU all
    along, whether or not it got it on a busy machine) from sleeping.
    """
    text = _read(f"/proc/{pid}/schedstat")
    if text is None:
        return None
    try:
        run, wait = (int(v) for v in text.split()[:2])
    except ValueError:
        return None
    return (run + wait) / 1e9


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def threads(pid: int) -> list[int]:
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except (OSError, ValueError):
        return []


def children(pid: int) -> list[int]:
    """The processes ``pid``'s threads started (``/proc/PID/task/TID/children``)."""
    found: list[int] = []
    for tid in threads(pid):
        text = _read(f"/proc/{pid}/task/{tid}/children")
        if text:
            found.extend(int(child) for child in text.split())
    return found


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants, breadth first, at most ``_MAX_TREE``."""
    found = [pid]
    for parent in found:
        found.extend(children(parent)[: _MAX_TREE - len(found)])
        if len(found) >= _MAX_TREE:
            break
    return found


def waits_on(pid: int, pipe: PipeId) -> Verdict:
    """Whether a thread of ``pid`` is blocked reading ``pipe``; see the module doc."""
    calls = _SYSCALLS.get(platform.machine())
    if calls is None:
        return "unknown"
    verdict: Verdict = "busy"
    for tid in threads(pid):
        text = _read(f"/proc/{pid}/task/{tid}/syscall")
        if text is None:
            verdict = "unknown"  # no access (or it just exited)
            continue
        parts = text.split()
        if not parts or not parts[0].isdigit():
            continue  # "running", or "-1 ..." (blocked outside a syscall)
        nr = int(parts[0])
        if nr in calls.opaque:
            verdict = "unknown"
        elif len(parts) > 1 and (nr in calls.read or nr in calls.epoll):
            fd = int(parts[1], 16)
            if nr in calls.read and _fd_link(pid, fd) == pipe.link:
                return "reading"
            if nr in calls.epoll and _epoll_watches(pid, fd, pipe):
                return "reading"
    return verdict


def _fd_link(pid: int, fd: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None


def _epoll_watches(pid: int, epfd: int, pipe: PipeId) -> bool:
    text = _read(f"/proc/{pid}/fdinfo/{epfd}")
    if text is None:
        return False
    wanted = (f"ino:{pipe.ino:x}", f"sdev:{pipe.dev:x}")
    for line in text.splitlines():
        if line.startswith("tfd:"):
            words = line.split()
            if wanted[0] in words and wanted[1] in words:
                return True
    return False


class LoadWatch:
    """Tells when one starting process has loaded: call ``check`` now and then.

    ``cpu_seconds`` is the CPU time the process (and what it started) has
    used so far, as of the last ``check``.
    """

    def __init__(self, pid: int, pipe: PipeId | None, *, quiet: float, now: float) -> None:
        self.pid = pid
        self.pipe = pipe
        self.quiet = quiet
        self.cpu_seconds = 0.0
        self._leader_ticks: int | None = None
        self._tree_ticks: int | None = None
        self._quiet_since = now

    def check(self, now: float) -> bool:
        """True once the process has loaded (then stop calling)."""
        stat = read_stat(self.pid)
        if stat is None:  # /proc says nothing: quiet since spawn is all we have
            return now - self._quiet_since >= self.quiet
        if stat.cpu_ticks != self._leader_ticks:  # the usual case while loading
            self._leader_ticks = stat.cpu_ticks
            self._quiet_since = now
            self.cpu_seconds = max(self.cpu_seconds, stat.cpu_seconds)
            return False
        verdict, ticks = self._scan(stat)
        self.cpu_seconds = ticks * _TICK
        if ticks != self._tree_ticks:
            self._tree_ticks = ticks
            self._quiet_since = now
            return False
        if verdict == "reading":
            return True
        return verdict == "unknown" and now - self._quiet_since >= self.quiet

    def reading(self) -> bool:
        """Whether the process is blocked reading its stdin pipe right now."""
        return self.pipe is not None and waits_on(self.pid, self.pipe) == "reading"

    def resumed(self, now: float) -> None:
        """The process was stopped (SIGSTOP) and runs again: its quiet time starts now."""
        self._quiet_since = now
        self._leader_ticks = self._tree_ticks = None

    def _scan(self, leader: Stat) -> tuple[Verdict, int]:
        """The verdict for the process or, if it is not reading, its descendants."""
        if self.pipe is None:
            return "unknown", leader.cpu_ticks
        verdict = waits_on(self.pid, self.pipe)
        ticks = leader.cpu_ticks
        if verdict == "reading":
            return verdict, ticks
        for pid in tree(self.pid)[1:]:
            stat = read_stat(pid)
            if stat is None:
                continue
            ticks += stat.cpu_ticks
            found = waits_on(pid, self.pipe)
            if found == "reading":
                return found, ticks
            if found == "unknown":
                verdict = "unknown"
        return verdict, ticks


def set_nice(pid: int, value: int) -> bool:
    """Give every thread of ``pid`` and its descendants nice ``value``.

    False if the server may not (raising a priority needs CAP_SYS_NICE or
    RLIMIT_NICE); a process that is gone counts as done.
    """
    for proc in tree(pid):
        for tid in threads(proc) or [proc]:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, value)
            except ProcessLookupError:
                continue
            except PermissionError:
                return False
    return True


def signal_group(pid: int, sig: int) -> bool:
    """Send ``sig`` to the process group of ``pid`` (it and what it started); False if it
    is gone."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


class CpuMeter:
    """Free cores: this process's CPUs less the machine's busy cores just now.

    Each reading covers the time since the previous one (at least
    ``min_window``; a reading sooner returns the last answer).
    """

    def __init__(self, cpus: int | None = None, *, min_window: float = 0.1) -> None:
        self.cpus = cpus if cpus is not None else len(os.sched_getaffinity(0))
        self._machine = os.cpu_count() or self.cpus
        self._min_window = min_window
        self._last: tuple[float, int, int] | None = None  # when, busy ticks, all ticks
        self._free = float(self.cpus)

    def free_cores(self, now: float) -> float:
        if self._last is not None and now - self._last[0] < self._min_window:
            return self._free
        sample = _cpu_ticks()
        if sample is None:
            return self._free
        if self._last is not None:
            busy, total = sample[0] - self._last[1], sample[1] - self._last[2]
            if total > 0:
                self._free = max(0.0, self.cpus - busy / total * self._machine)
        self._last = (now, *sample)
        return self._free


def _cpu_ticks() -> tuple[int, int] | None:
    """Busy and total ticks of all CPUs, from ``/proc/stat``'s ``cpu`` line."""
    text = _read("/proc/stat")
    if text is None or not text.startswith("cpu "):
        return None
    with contextlib.suppress(ValueError):
        values = [int(v) for v in text.split("\n", 1)[0].split()[1:9]]
        user, nice, system, idle, iowait, irq, softirq, steal = values
        busy = user + nice + system + irq + softirq + steal
        return busy, busy + idle + iowait
    return None
