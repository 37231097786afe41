"""Scenario startup: what a ``trioserve run`` costs before it serves, and idle.

Each of N starts runs ``trioserve run`` on the bench's spec (the C adapter), once with
``--in-memory`` and once on its default SQLite store, both with the default warm pool.
Figures, median of the starts: the wall time from ``exec`` to the ``serving`` line, the
server's CPU time at that line (``utime + stime``, the server process only; most of
it is imports), and its RSS one second later, idle.

The package's bytecode is compiled first (``compileall``), as ``pip install`` does: a
checkout run with ``PYTHONDONTWRITEBYTECODE`` set would otherwise compile every module
at every start, about 0.1 s more.
"""

from __future__ import annotations

import compileall
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trioserve
from bench.adapter import adapter_command
from bench.procinfo import cpu_seconds, rss_mib
from bench.results import Result
from bench.scenarios import scenario
from bench.server import Context, Server

STORES = {"memory": ["--in-memory"], "sqlite": []}


@dataclass(frozen=True)
class Sizes:
    starts: int = 10  # a store


def _once(ctx: Context, name: str, flags: list[str]) -> dict[str, float]:
    workdir = ctx.tmp / name
    workdir.mkdir(parents=True, exist_ok=True)
    srv = Server(name, workdir, adapter_command("1"), flags)
    t0 = time.perf_counter()
    srv.start()
    try:
        wall = time.perf_counter() - t0
        cpu = cpu_seconds(srv.pid)
        time.sleep(1.0)
        return {"wall_ms": wall * 1000, "cpu_ms": cpu * 1000, "rss_idle_mib": rss_mib(srv.pid)}
    finally:
        srv.stop()


@scenario("startup", "startup", full=Sizes(), quick=Sizes(starts=3))
def startup(ctx: Context, p: Sizes) -> Result:
    """trioserve run to its serving line: wall, CPU, idle RSS; in memory and on SQLite"""
    compileall.compile_dir(str(Path(trioserve.__file__).parent), quiet=1)
    res = Result("startup", "trioserve run to its serving line, then idle")
    details: dict[str, Any] = {}
    for store, flags in STORES.items():
        runs = [_once(ctx, f"startup-{store}-{i}", flags) for i in range(p.starts)]
        details[store] = runs
        for key, label, unit in (
            ("wall_ms", "exec to serving", "ms"),
            ("cpu_ms", "CPU before serving", "ms"),
            ("rss_idle_mib", "RSS idle", "MiB"),
        ):
            res.add(f"{store}: {label}", round(statistics.median(r[key] for r in runs), 1), unit)
    res.details = details
    return res
