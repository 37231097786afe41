"""Scenario fork-server-memory (issue 30): the memory of 500 open echo turns, forked from
the fork server against exec'd: the sum of the adapters' PSS (proportional set size, which
splits each shared page among the processes that map it).

Each turn is an echo turn that prints its first chunk, then waits 60 s before the next
(``chunkSize: 1``, ``delayMs: 60000``): every turn is open, its adapter alive, when the
children of the server are read (``/proc/PID/smaps_rollup``).  The fork server's own PSS
is counted with the forked turns.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import trio

from bench import BenchError
from bench.client import RawConn
from bench.procinfo import children_of
from bench.results import Result
from bench.scenarios import scenario
from bench.server import SPEC_YAML, Context

HANGING_ECHO = SPEC_YAML.replace(
    "runtime: {type: echo}", "runtime: {type: echo, options: {chunkSize: 1, delayMs: 60000}}"
)


@dataclass(frozen=True)
class Sizes:
    turns: int = 500


def pss_kib(pid: int) -> int:
    """The process's PSS in KiB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


async def open_turns(
    url: str, turns: int, opened: list[RawConn], until: bytes = b"event: message\n"
) -> None:
    """Start ``turns`` turns, each on its own session and connection, until each has sent
    ``until`` (its first message); the connections stay open (in ``opened``)."""
    creator = await RawConn.open(url)
    sids = [await creator.create_session() for _ in range(turns)]
    await creator.aclose()

    async def one(sid: str) -> None:
        conn = await RawConn.open(url)
        opened.append(conn)
        await conn.send_request("POST", f"/v1/sessions/{sid}/turns", b'{"input":"hang on"}')
        status, _ = await conn.read_head()
        if status != 200:
            raise BenchError(f"turn: HTTP {status}")
        await conn.read_until(until)

    limiter = trio.CapacityLimiter(32)  # starts at once: a burst of execs is the test's own

    async def limited(sid: str) -> None:
        async with limiter:
            await one(sid)

    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            for sid in sids:
                nursery.start_soon(limited, sid)


async def _measure(url: str, pid: int, turns: int) -> dict[str, Any]:
    opened: list[RawConn] = []
    try:
        t0 = time.perf_counter()
        await open_turns(url, turns, opened)
        open_s = time.perf_counter() - t0
        await trio.sleep(1.0)
        kids = children_of(pid)
        pss = sum(pss_kib(kid) for kid in kids)
        return {
            "open_seconds": round(open_s, 2),
            "children": len(kids),
            "children_pss_mib": round(pss / 1024, 1),
            "pss_kib_per_turn": round(pss / turns),
            "server_pss_mib": round(pss_kib(pid) / 1024, 1),
        }
    finally:
        for conn in opened:
            await conn.aclose()


@scenario("fork-server-memory", "fork-server-memory", full=Sizes(), quick=Sizes(turns=50))
def fork_server_memory(ctx: Context, p: Sizes) -> Result:
    """PSS of 500 open echo turns, forked against exec'd  [forked <= 0.3 x exec'd]"""
    res = Result("fork-server-memory", f"{p.turns} open echo turns: the adapters' PSS")
    details: dict[str, Any] = {}
    base = ["--in-memory", "--max-concurrent-turns", "0", "--max-sessions", "0"]
    exec_d = ["--fork-server", "off", "--warm-adapters", "0"]
    for mode, flags in (("exec", exec_d), ("fork", ["--fork-server", "auto"])):
        name = f"memory-{mode}"
        with ctx.server(name, "", [*base, *flags], spec_yaml=HANGING_ECHO) as srv:
            details[mode] = trio.run(_measure, srv.url, srv.pid, p.turns)
    exec_d, forked = details["exec"]["children_pss_mib"], details["fork"]["children_pss_mib"]
    ratio = round(forked / exec_d, 3) if exec_d else 0.0
    res.details = details
    res.add("exec'd: adapters' PSS", exec_d, "MiB")
    res.add("  exec'd: PSS per turn", details["exec"]["pss_kib_per_turn"], "KiB")
    res.add("forked: adapters' and fork server's PSS", forked, "MiB")
    res.add("  forked: PSS per turn", details["fork"]["pss_kib_per_turn"], "KiB")
    res.add("forked / exec'd", ratio, "x", "<= 0.3", ratio <= 0.3)
    return res
