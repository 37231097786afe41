"""The fork server: a Python adapter imported once, a fresh child forked for each turn.

``trioserve run`` starts one per server process (``runtime._forker.ForkServer``)
for a runtime whose adapter is a Python function (the built-in ``echo`` and
``openai``).  It imports the adapter's modules, says ``ready`` on its control
socket, then waits there for turns.  Each request carries the turn's three
pipe ends (``SCM_RIGHTS``), its environment (what differs from the one the fork
server was started with) and working directory; the fork server forks a child
and answers its pid.

The child is forked with ``CLONE_PARENT``: its parent is the trioserve
process, not the fork server, so trioserve waits for it and learns its exit
status as it does for an adapter it exec'd, and a fork server that dies does
not take running turns with it.  The child starts a session of its own (its
own process group, SIGINT/SIGKILL to the group as for any adapter), gets
``PR_SET_PDEATHSIG`` SIGKILL (it dies with trioserve), puts its pipes on
0, 1 and 2 and closes every other descriptor, takes the turn's environment
and working directory, resets its signal handlers and mask, re-seeds
``random`` (Python's own after-fork hooks run), then calls the adapter's
function with fresh ``sys.std*`` objects and exits with what it returns,
as the interpreter would.  The fork server itself never runs a turn's code,
is single-threaded (checked before it says ready) and holds nothing but its
socket; it dies with trioserve (``PR_SET_PDEATHSIG``, and end-of-file on its
socket).

The raw ``clone`` (Python has no ``CLONE_PARENT``) skips what glibc's
``fork`` does besides the system call: its ``pthread_atfork`` handlers and
the reset of its internal locks in the child (harmless in a process with
one thread, which is checked: no lock can be held by another thread), the
child's robust-futex list (the kernel clears it; glibc would register it
again: a robust mutex in the child is not released if the child dies
holding it), and the child's thread id in ``struct pthread`` (kept here by
``CLONE_CHILD_SETTID`` at an offset found by a scan, checked by a probe
child at start: ``_Cloner``).  Where any of this cannot be checked, the
fork server says it is unsupported and the server execs its turns.

Run as ``python -m trioserve.runtime.forkserver FD TARGET [--preload MOD[:FUNC]]...
[-- ARGV...]``: ``FD`` is its end of the control socket (``AF_UNIX``,
``SOCK_SEQPACKET``), ``TARGET`` is ``pkg.mod:func``, ``ARGV`` the child's
``sys.argv[1:]``.  ``python -m trioserve.runtime.forkserver run TARGET`` calls
the adapter in its own process instead: a ``runtime.type: python`` turn that
is exec'd.  Standard library only, like the reaper.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import importlib
import io
import json
import os
import signal
import socket
import sys
import time
import traceback

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

#: The C module under ``signal``: its functions take and give plain ints, no enums.
_signal: Any = importlib.import_module("_signal")

_CLONE_PARENT = 0x00008000
_CLONE_CHILD_SETTID = 0x01000000
_SYS_CLONE = {"x86_64": 56, "aarch64": 220}
_SYS_GETTID = {"x86_64": 186, "aarch64": 178}
_PR_SET_PDEATHSIG = 1
_MAX_REQUEST = 1 << 20  # a request: the environment and working directory, as JSON
#: Exit status of a child whose set-up failed (before the adapter ran).
SETUP_FAILED = 71


class ForkError(Exception):
    """The fork server cannot serve (an import failed, a thread was started, no clone)."""


class Unsupported(ForkError):
    """This platform cannot fork turns this way (not Linux and glibc on x86-64 or arm64, no
    pidfd, or the raw clone failed its probe): turns exec their adapter instead."""


def unsupported() -> str | None:
    """Why this platform cannot run a fork server (``None``: it can, as far as can be told
    without trying; ``_Cloner``'s probe tries).  Standard library only: the server asks too."""
    if not sys.platform.startswith("linux"):
        return f"no fork server on {sys.platform}"
    machine = os.uname().machine
    if machine not in _SYS_CLONE:
        return f"no fork server on {machine}"
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):
        libc = None
    if not libc or not libc.startswith("glibc "):
        return "no fork server without glibc (its thread id is kept up to date by hand)"
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError) as exc:
        return f"no fork server without pidfd_open (Linux 5.3): {exc}"
    return None


def load(target: str) -> Callable[[], object]:
    """``pkg.mod:func`` imported; ``ForkError`` naming the module and the exception."""
    module_name, _, func_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except BaseException as exc:  # a module may raise anything, SystemExit included
        raise ForkError(f"cannot import {module_name}: {type(exc).__name__}: {exc}") from None
    if not func_name:
        return lambda: None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ForkError(f"{module_name} has no function {func_name!r}")
    return func  # type: ignore[no-any-return]


class _Cloner:
    """``clone(CLONE_PARENT)`` through libc's ``syscall``, with Python's fork hooks.

    The fragile part is glibc's own record of the thread id, which ``fork``
    keeps and a raw ``clone`` does not: it is found by a scan (below) and
    the whole path is tried once at start (``_probe``); anything off is
    ``Unsupported``, and the server's turns exec their adapter.
    """

    def __init__(self) -> None:
        reason = unsupported()
        if reason is not None:
            raise Unsupported(reason)
        machine = os.uname().machine
        self._nr = _SYS_CLONE[machine]
        self._arm = machine == "aarch64"
        # PyDLL: the call keeps the GIL, as os.fork does (the process is single-threaded).
        self._libc = ctypes.PyDLL(None, use_errno=True)
        self._libc.syscall.restype = ctypes.c_long
        self._libc.pthread_self.restype = ctypes.c_void_p
        self._tid = self._tid_address()
        self._probe()

    def _tid_address(self) -> int:
        """Where glibc keeps this thread's id (``struct pthread``'s ``tid``).

        ``fork`` has the kernel write the child's id there (``CLONE_CHILD_SETTID``);
        so does this, or what glibc does with it in the child (the owner of an
        error-checking or robust mutex, ``pthread_getcpuclockid``, older glibc's
        ``raise``) would name the fork server's thread.  glibc does not export
        the field's offset: the first int of ``struct pthread`` that holds
        this thread's id (the main thread's: the pid) is taken, and
        ``_probe`` checks it is the one glibc reads.
        """
        base = self._libc.pthread_self()
        me = os.getpid()  # the main thread of a single-threaded process: tid == pid
        if not base or _threads() != 1 or os.getpid() != _gettid(self._libc):
            raise Unsupported("not the only thread of the process: cannot find glibc's thread id")
        for offset in range(0, 1024, 4):
            if ctypes.c_int.from_address(base + offset).value == me:
                return int(base + offset)
        raise Unsupported("cannot find glibc's thread id in struct pthread")

    def _probe(self) -> None:
        """Clone a child (our own, not ``CLONE_PARENT``) that checks glibc's record of its
        thread id is its own: read back through a public call, ``pthread_getcpuclockid``
        (the clock id glibc makes of ``struct pthread``'s ``tid``), and the clock
        readable (the kernel refuses a thread clock of another process).  ``Unsupported``
        if not: the scan found the wrong field, or glibc keeps the id elsewhere."""
        try:
            pid = self.clone(parent=False)
        except OSError as exc:
            raise Unsupported(f"the raw clone failed: {exc}") from None
        if pid == 0:
            try:
                clock = time.pthread_getcpuclockid(self._libc.pthread_self())
                time.clock_gettime(clock)
                ok = ~(clock >> 3) == os.getpid()  # glibc: ((~tid) << 3) | flags
            except BaseException:
                ok = False
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise Unsupported(
                "a probe child's glibc thread id was not its own after the raw clone"
                f" (status {os.waitstatus_to_exitcode(status)})"
            )

    def clone(self, *, parent: bool = True) -> int:
        """Fork a child whose parent is this process's parent (``parent``; else ours):
        its pid here, 0 in it."""
        flags = _CLONE_CHILD_SETTID | signal.SIGCHLD | (_CLONE_PARENT if parent else 0)
        api = ctypes.pythonapi
        api.PyOS_BeforeFork()
        if self._arm:  # flags, stack, parent_tid, tls, child_tid
            pid = self._libc.syscall(self._nr, flags, None, None, None, ctypes.c_void_p(self._tid))
        else:  # flags, stack, parent_tid, child_tid, tls
            pid = self._libc.syscall(self._nr, flags, None, None, ctypes.c_void_p(self._tid), None)
        if pid == 0:
            api.PyOS_AfterFork_Child()
            return 0
        errno = ctypes.get_errno()
        api.PyOS_AfterFork_Parent()
        if pid < 0:
            raise OSError(errno, os.strerror(errno))
        return int(pid)


@functools.cache
def _prctl() -> Callable[..., int]:
    """libc's ``prctl``, looked up once: in the fork server, before its first child."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


def set_pdeathsig(sig: int) -> None:
    _prctl()(_PR_SET_PDEATHSIG, sig, 0, 0, 0)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _gettid(libc: ctypes.CDLL) -> int:
    """This thread's id, from the kernel."""
    return int(libc.syscall(_SYS_GETTID[os.uname().machine]))


def _send(sock: socket.socket, message: dict[str, object]) -> None:
    sock.send(json.dumps(message).encode())


def serve(
    sock: socket.socket,
    func: Callable[[], object],
    argv: list[str],
    cloner: _Cloner,
    resets: Resets = (),
) -> int:
    """Answer fork requests until the socket closes; see the module doc.  ``resets``:
    the signal handlers each child puts back (``handlers_to_reset``)."""
    owner = os.getppid()
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, _MAX_REQUEST, 3)
        except OSError:
            return 0
        if not data:
            for fd in fds:
                os.close(fd)
            return 0  # trioserve is gone (or closed us)
        try:
            request = json.loads(data)
            if len(fds) != 3:
                raise ValueError(f"expected 3 descriptors, got {len(fds)}")
            pid = cloner.clone()
        except (ValueError, OSError) as exc:
            for fd in fds:
                os.close(fd)
            _send(sock, {"error": str(exc)})
            continue
        if pid == 0:
            _child(request, fds, owner, func, argv, resets)  # never returns
        for fd in fds:
            os.close(fd)
        _send(sock, {"pid": pid})


def _child(
    request: dict[str, object],
    fds: list[int],
    owner: int,
    func: Callable[[], object],
    argv: list[str],
    resets: Resets,
) -> None:
    """The forked child: become a fresh adapter process, run ``func``, exit."""
    code = SETUP_FAILED
    try:
        os.setsid()
        set_pdeathsig(signal.SIGKILL)
        if os.getppid() != owner:  # trioserve died before the line above
            os._exit(SETUP_FAILED)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)  # dup2's copy is inheritable, as an exec'd adapter's stdio
        os.closerange(3, 1 << 20)
        _reset_signals(resets)
        _take_environment(request)
        cwd = request.get("cwd")
        if isinstance(cwd, str):
            os.chdir(cwd)
        _fresh_stdio()
        sys.argv = [sys.argv[0], *argv]
    except BaseException:
        with contextlib.suppress(Exception):
            traceback.print_exc()
        os._exit(code)
    os._exit(_run(func))


#: (signal number, handler) pairs: what a child sets back (raw ``_signal`` values).
Resets = tuple[tuple[int, object], ...]


def fresh_handlers() -> dict[int, object]:
    """Every signal's handler now, as ``_signal`` has it: at the fork server's start, what
    a fresh interpreter exec'd by trioserve has (signals ignored by trioserve included)."""
    return {int(sig): _signal.getsignal(sig) for sig in signal.valid_signals()}


def handlers_to_reset(fresh: dict[int, object]) -> Resets:
    """The signals whose handler differs now from ``fresh``, with the handler to put back.

    Worked out once, in the fork server, so that a child makes a call or two of the raw
    ``_signal`` module and not sixty of ``signal``'s, whose enum conversions run Python
    that writes to (and so copies) hundreds of KiB of the fork server's shared pages.
    A handler set from C (``None``) cannot be restored and is left as it is.
    """
    return tuple(
        (sig, handler)
        for sig, handler in fresh.items()
        if handler is not None and _signal.getsignal(sig) != handler
    )


def _take_environment(request: dict[str, object]) -> None:
    """The turn's environment: the request says what differs from ours (``env`` to set,
    ``unset`` to remove), as the fork server was started with it."""
    unset, env = request.get("unset"), request.get("env")
    for key in unset if isinstance(unset, list) else ():
        os.environ.pop(str(key), None)
    for key, value in env.items() if isinstance(env, dict) else ():
        os.environ[str(key)] = str(value)


def _reset_signals(resets: Resets) -> None:
    """Handlers and mask as a new interpreter has them."""
    for sig, handler in resets:
        with contextlib.suppress(OSError, ValueError):
            _signal.signal(sig, handler)
    _signal.pthread_sigmask(_signal.SIG_SETMASK, ())


def _fresh_stdio() -> None:
    """New ``sys.std*`` on descriptors 0-2, buffered as the interpreter buffers pipes."""
    streams = {
        "stdin": io.TextIOWrapper(open(0, "rb", closefd=False), encoding="utf-8"),  # noqa: SIM115
        "stdout": io.TextIOWrapper(open(1, "wb", closefd=False), encoding="utf-8"),  # noqa: SIM115
        "stderr": io.TextIOWrapper(
            open(2, "wb", closefd=False),  # noqa: SIM115
            encoding="utf-8",
            errors="backslashreplace",
            line_buffering=True,
        ),
    }
    for name, stream in streams.items():
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _run(func: Callable[[], object]) -> int:
    """Call the adapter as the interpreter runs a program: its exit status."""
    try:
        result = func()
        code = result if isinstance(result, int) else 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:
        _flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)  # dies of SIGINT, as CPython does
        code = 130
    except BaseException:
        with contextlib.suppress(Exception):
            traceback.print_exc()
        code = 1
    try:
        import atexit

        atexit._run_exitfuncs()
    except BaseException:
        pass
    if not _flush():
        code = code or 120
    return code & 0xFF


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def _flush() -> bool:
    ok = True
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            ok = False
    return ok


def run(target: str, argv: list[str]) -> int:
    """``run TARGET [ARGS]``: import the adapter and call it in this process (exec'd).

    What a turn runs when it is not forked (``--fork-server off``, or the fork
    server down): the same function, called the same way.
    """
    try:
        func = load(target)
    except ForkError as exc:
        print(f"adapter {exc}", file=sys.stderr)
        return 1
    sys.argv = [sys.argv[0], *argv]
    return _run(func)


def main(args: list[str]) -> int:
    if args[:1] == ["run"] and len(args) >= 2:
        return run(args[1], args[2:])
    fresh = fresh_handlers()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for trioserve, which stops us
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    set_pdeathsig(signal.SIGKILL)
    fd, target, rest = int(args[0]), args[1], args[2:]
    argv = rest[rest.index("--") + 1 :] if "--" in rest else []
    options = rest[: rest.index("--")] if "--" in rest else rest
    preload = [options[i + 1] for i, arg in enumerate(options) if arg == "--preload"]
    sock = socket.socket(fileno=fd)
    try:
        for name in preload:
            load(name)()
        func = load(target)
        if _threads() != 1:  # an exec'd turn runs it well: fall back to that
            raise Unsupported(f"{target}: a thread was started while importing; cannot fork")
        cloner = _Cloner()
    except Unsupported as exc:
        _send(sock, {"failed": str(exc), "unsupported": True})
        return 1
    except ForkError as exc:
        _send(sock, {"failed": str(exc)})
        return 1
    except BaseException as exc:
        _send(sock, {"failed": f"{target}: {type(exc).__name__}: {exc}"})
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    resets = handlers_to_reset(fresh)
    # What the imports made stays out of the collector's way: a child's collections do
    # not write to those pages, which it then keeps sharing with the fork server.
    gc.freeze()
    _send(sock, {"ready": os.getpid()})
    return serve(sock, func, argv, cloner, resets)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
