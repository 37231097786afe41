"""What the peer servers' launchers share (``go_peer``, ``langgraph_peer``): a free port,
a process started with its output in a log file and stopped on the way out, and the
wait until it answers."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from bench import BenchError


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


def wait_ok(
    name: str, proc: subprocess.Popen[bytes], port: int, path: str, log: Path, timeout: float
) -> None:
    """Until ``GET path`` on ``port`` answers 200; ``BenchError`` with the log's tail if the
    process exits first or ``timeout`` passes."""
    request = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"{name} exited ({proc.returncode}):\n{log.read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1) as s:
            s.sendall(request)
            if s.recv(64).startswith(b"HTTP/1.1 200"):
                return
        time.sleep(0.05)
    raise BenchError(f"{name} did not answer {path} in {timeout:g} s:\n{log.read_text()[-2000:]}")
