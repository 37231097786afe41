"""The floor under scenario b: what moving the C adapter's events to a socket costs a
bare trio program, with no server in between (no decoding, numbering or storing).

``pipe_floor(n)`` runs ``tinyadapter n``, reads its stdout in trio and writes each line
to a socket as an SSE frame (``event: message`` / ``data:`` / blank line), a thread
draining the other end; it returns the trio thread's CPU time an event, user and system
(``time.thread_time``): the least of a few runs.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time

import trio

from bench.adapter import build_adapter


def _drain(sock: socket.socket) -> None:
    """Read ``sock`` to its end, then close it (its other end closed first)."""
    with sock:
        while sock.recv(1 << 18):
            pass


async def _once(n: int) -> float:
    ours, theirs = socket.socketpair()
    threading.Thread(target=_drain, args=(theirs,), daemon=True).start()
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
    argv = [str(build_adapter()), str(n)]
    proc = await trio.lowlevel.open_process(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    start, rest, lines = time.thread_time(), b"", 0
    while chunk := await proc.stdout.receive_some(1 << 18):
        *complete, rest = (rest + chunk).split(b"\n")
        lines += len(complete)
        await stream.send_all(b"".join([b"event: message\ndata: %b\n\n" % x for x in complete]))
    cpu = time.thread_time() - start
    await proc.wait()
    await stream.aclose()  # the drain thread reads to the end and closes its side
    return cpu / max(lines, 1)


def pipe_floor(n: int, runs: int = 3) -> float:
    """Seconds of CPU an event (the least of ``runs``)."""
    return min(trio.run(_once, n) for _ in range(runs))
