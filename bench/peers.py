"""What the peer servers' launchers share (``go_peer``, ``langgraph_peer``): a free port,
and a process started with its output in a log file and stopped on the way out."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def peer_process(
    argv: list[str], *, env: dict[str, str], cwd: Path, log: Path, stop: int = signal.SIGTERM
) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` running in ``cwd``, stdout and stderr in ``log``; ``stop``, then SIGKILL
    after 30 s, when the block ends."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
        )
    try:
        yield proc
    finally:
        proc.send_signal(stop)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
