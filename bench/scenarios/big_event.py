"""Scenario j: one 8 MiB event (``--max-event-bytes 16MiB``) through the stream, its
text compared byte for byte; time and server CPU per turn, RSS."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from typing import Any

import httpx

from bench import BenchError
from bench.adapter import adapter_command
from bench.client import create, stream_turn, wait_pool_full
from bench.procinfo import cpu_seconds, rss_mib
from bench.results import Result, ms
from bench.scenarios import scenario
from bench.server import Context


@dataclass(frozen=True)
class Sizes:
    bytes: int = 8 << 20  # the event's text
    max_event_bytes: str = "16MiB"
    runs: int = 3  # after one that warms up


def big_text(size: int) -> str:
    """The text ``tinyadapter big SIZE`` prints: ``00000000,00000001,...`` cut to SIZE."""
    return "".join([f"{k:08d}," for k in range(size // 9 + 1)])[:size]


#: What ``tinyadapter big`` prints around the text, on the event's one line.
BIG_LINE_HEAD = b'{"v":1,"type":"message","sessionId":"s_bench","data":{"role":"assistant","text":"'
BIG_LINE_TAIL = b'"}}'


@scenario("j", "big-event", full=Sizes(), quick=Sizes(runs=1))
def big_event(ctx: Context, p: Sizes) -> Result:
    """one 8 MiB event (--max-event-bytes 16MiB), checked byte for byte  [intact]

    One event of 8 MiB of text, streamed and compared byte for byte.
    """
    size = p.bytes
    line = len(BIG_LINE_HEAD) + size + len(BIG_LINE_TAIL)
    res = Result("j", f"one {size / 2**20:g} MiB event through the stream")
    expected = big_text(size)
    expected_bytes = expected.encode()
    flags = ["--in-memory", "--max-event-bytes", p.max_event_bytes]
    runs: list[dict[str, Any]] = []
    with (
        ctx.server("j", adapter_command("big", str(size)), flags) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as client,
    ):
        wait_pool_full(client)
        rss_idle = rss_mib(srv.pid)
        for i in range(1 + p.runs):  # the first run warms up
            sid = create(client)
            cpu0 = cpu_seconds(srv.pid)
            timing = stream_turn(client, sid)
            elapsed, body = timing.ended, timing.body
            cpu = cpu_seconds(srv.pid) - cpu0
            frame = body.split(b"\n\n")[1]
            head, _, rest = frame.partition(b"\ndata: ")
            data_line, _, id_line = rest.partition(b"\n")
            if head != b"event: message" or not id_line.startswith(b"id: "):
                raise BenchError(f"second frame is not a message: {frame[:200]!r}")
            event = json.loads(data_line)
            text = event["data"]["text"]
            if text != expected or text.encode() != expected_bytes:
                at = next(
                    (k for k, (a, b) in enumerate(zip(text, expected, strict=False)) if a != b),
                    min(len(text), size),
                )
                raise BenchError(f"the text differs ({len(text)} chars, first difference at {at})")
            if expected_bytes not in data_line:
                raise BenchError("the text is not in the SSE data line verbatim")
            if i == 0:
                continue
            runs.append(
                {
                    "seconds": round(elapsed, 4),
                    "mib_per_s": round(len(body) / elapsed / 2**20, 1),
                    "sse_bytes": len(body),
                    "data_line_bytes": len(data_line),
                    "server_cpu_s": round(cpu, 3),
                    "rss_after_mib": rss_mib(srv.pid),
                }
            )
        rss_after = rss_mib(srv.pid)
        rss_peak = rss_mib(srv.pid, "VmHWM")
    res.details = {
        "text_bytes": size,
        "adapter_line_bytes": line,
        "max_event_bytes": p.max_event_bytes,
        "runs": runs,
        "rss_idle_mib": rss_idle,
        "rss_after_mib": rss_after,
        "rss_peak_mib": rss_peak,
    }
    seconds = statistics.median(r["seconds"] for r in runs)
    res.add("intact (parsed, text byte for byte)", len(runs), f"of {len(runs)}", "all", True)
    res.add("  time, request to session.ended (median)", ms(seconds), "ms")
    res.add(
        "  server CPU per turn (median)", statistics.median(r["server_cpu_s"] for r in runs), "s"
    )
    res.add("  the event's line from the adapter", line, "bytes")
    res.add("  server RSS idle", rss_idle, "MiB")
    res.add("  server RSS peak (VmHWM)", rss_peak, "MiB")
    return res
