"""Where the fork server cannot fork, turns exec their adapter: the guards of its raw clone.

The fork server forks with a raw ``clone(CLONE_PARENT)`` and keeps glibc's
record of the child's thread id itself (found by a scan of ``struct
pthread``); at start it tries the whole path on a probe child.  Anything
off -- not Linux and glibc on x86-64 or arm64, no pidfd, a thread started by
the adapter's import, a probe that finds glibc's thread id stale -- is
``Unsupported``: the server logs one line and execs its adapter.  Only a
module that does not import fails the start (tests/runtime/test_forkserver.py).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest
import trio

from tests.helpers import FIXTURES, ServerFactory, compiled_spec
from trioserve import server as server_module
from trioserve.runtime import forkserver
from trioserve.runtime._forker import ForkServer, ForkTarget
from trioserve.spec import echo_command

SAFETY = 60  # seconds: a hung test fails instead of hanging the suite


async def test_a_module_that_starts_a_thread_is_exec_d_not_forked(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(FIXTURES / "adapters"))
    server = ForkServer(ForkTarget("threaded_adapter:main"))
    with caplog.at_level(logging.WARNING, "trioserve.forkserver"), trio.fail_after(SAFETY):
        await nursery.start(server.run)  # started: no error, though it will not fork
    assert server.stats.state == "unsupported" and server.pid is None
    [line] = [r.getMessage() for r in caplog.records if "fork server off" in r.getMessage()]
    assert "threaded_adapter:main: a thread was started while importing" in line
    assert "turns exec their adapter" in line
    for _ in range(3):  # each turn execs; nothing more is logged
        assert await server.spawn(None) is None
    assert server.stats.fallbacks == 3
    assert len([r for r in caplog.records if "fork server" in r.getMessage()]) == 1


def probe(patch: str) -> subprocess.CompletedProcess[str]:
    """Build a ``_Cloner`` in a fresh, single-threaded interpreter, after ``patch``."""
    code = textwrap.dedent(
        """
        import ctypes
        from trioserve.runtime import forkserver as f
        {patch}
        try:
            f._Cloner()
        except f.Unsupported as exc:
            print("unsupported:", exc)
        else:
            print("supported")
        """
    ).format(patch=textwrap.dedent(patch))
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=SAFETY, check=True
    )


def test_the_probe_passes_here() -> None:
    assert probe("").stdout.strip() == "supported"


def test_a_wrong_thread_id_address_fails_the_probe() -> None:
    # The scan "finds" an int of ours that holds the pid: the kernel writes the probe
    # child's id there, glibc's own record stays the fork server's, raise(0) fails.
    done = probe(
        """
        import os
        decoy = ctypes.c_int(os.getpid())
        f._Cloner._tid_address = lambda self: ctypes.addressof(decoy)
        """
    )
    assert done.stdout.startswith("unsupported: a probe child's glibc thread id was not its own")


def test_a_failing_clone_is_unsupported() -> None:
    done = probe("f._SYS_CLONE = {k: 0xFFFF for k in f._SYS_CLONE}  # no such system call")
    assert done.stdout.startswith("unsupported: the raw clone failed")


@pytest.mark.parametrize(
    ("patch", "reason"),
    [
        (lambda m: m.setattr(sys, "platform", "darwin"), "no fork server on darwin"),
        (lambda m: m.setattr(os, "confstr", lambda name: None), "without glibc"),
        (lambda m: m.setattr(os, "pidfd_open", _no_pidfd), "without pidfd_open"),
    ],
)
def test_platforms_it_cannot_fork_on_are_named(
    monkeypatch: pytest.MonkeyPatch, patch: object, reason: str
) -> None:
    assert forkserver.unsupported() is None  # here: Linux, glibc, x86-64 or arm64
    patch(monkeypatch)  # type: ignore[operator]
    found = forkserver.unsupported()
    assert found is not None and reason in found


def _no_pidfd(pid: int) -> int:
    raise OSError(38, "Function not implemented")


async def test_on_a_platform_it_cannot_fork_on_the_warm_pool_serves(
    start_server: ServerFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """--fork-server auto (the default) where the server cannot fork: no fork server, one
    warning, and the echo adapter exec'd from the warm pool as with --fork-server off."""
    monkeypatch.setattr(server_module, "fork_unsupported", lambda: "no fork server on plan9")
    spec = compiled_spec(runtime="echo")
    with caplog.at_level(logging.WARNING, "trioserve.server"):
        server = await start_server(spec=spec, command=echo_command(), warm_adapters=1)
    assert any("fork server off: no fork server on plan9" in r.getMessage() for r in caplog.records)
    assert server.manager.forker is None
    with trio.fail_after(SAFETY):  # the pool loads its adapter
        while True:
            ready = await server.client.get("/readyz", headers={"Accept": "application/json"})
            body = ready.json()
            if body["warmAdapters"]["ready"] == 1:
                break
            await trio.sleep(0.05)
    assert body["forkServer"]["state"] == "off"
    sid = (await server.create())["id"]
    frames = await server.turn(sid, "hello")
    assert frames[-1].event == "session.ended"
