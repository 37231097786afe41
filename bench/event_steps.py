"""What scenario b's three per-event steps cost alone, in-process, with no server around
them: decoding a pipe read's lines (``decode_lines``), numbering them for the log
(``logged_batch``) and framing them as SSE (``sse_frames``).

    python bench/event_steps.py [EVENTS]

Batches of 600 lines (a 64 KiB pipe read of the bench adapter's ~100-byte events),
the numbered events kept as a log keeps them; CPU time an event of each step, the
least of 5 runs, with the collector as a server settles it (``settle_collector``)
and with it off.
"""

from __future__ import annotations

import gc
import sys
import time

from trioserve.http._sse import sse_frames
from trioserve.runtime._wire import decode_lines
from trioserve.server import settle_collector
from trioserve.sessions._turns import logged_batch

BATCH = 600
LINE = b'{"v":1,"type":"message","sessionId":"s_1","data":{"text":"word %d","delta":true}}'


def steps(n: int) -> tuple[float, float, float]:
    """Seconds of CPU an event: decoding, numbering, framing (one run over ``n`` events)."""
    lines = [LINE % i for i in range(n)]
    log: list[object] = []
    spent = [0.0, 0.0, 0.0]
    for start in range(0, n, BATCH):
        t0 = time.process_time()
        events = decode_lines(lines[start : start + BATCH])
        t1 = time.process_time()
        if events is None:
            raise SystemExit("the bench's lines went line by line: not what b measures")
        logged, _ = logged_batch(events, start + 1, "t_1")
        t2 = time.process_time()
        sse_frames(logged)
        t3 = time.process_time()
        log.extend(logged)
        spent[0] += t1 - t0
        spent[1] += t2 - t1
        spent[2] += t3 - t2
    return spent[0] / n, spent[1] / n, spent[2] / n


def main(n: int) -> None:
    settle_collector()
    for label in ("collector settled", "collector off"):
        best = min((steps(n) for _ in range(5)), key=sum)
        each = ", ".join(f"{name} {s * 1e6:.2f}" for name, s in zip(NAMES, best, strict=True))
        print(f"{label}: {sum(best) * 1e6:.2f} us an event ({each})")
        gc.disable()


NAMES = ("decode", "number", "frame")

if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200_000)
