"""``python -m bench``: list the scenarios, run some or all against a real ``trioserve run``.

    python -m bench --list                # every scenario, one line each
    python -m bench                       # every scenario, full sizes (several minutes)
    python -m bench --quick               # reduced sizes, a smoke run
    python -m bench --wait-quiet 180      # on a shared machine: wait for it to be idle
    python -m bench --only a,b --json out.json
    python -m bench --only a --profile pyspy   # py-spy samples of the server

Every scenario starts its own server subprocess (``trioserve run SPEC --port 0`` with
its flags), drives it over 127.0.0.1 only, and stops it with SIGTERM; a server that
exits non-zero, or a scenario whose check fails, fails the run (a missed target does
not: it is a result).  Turns run ``bench/.build/tinyadapter``, a tiny C adapter
compiled here with gcc, so the figures measure the server rather than an adapter.
docs/benchmarks.md has the figures and what bounds them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.adapter import BENCH, BUILD, build_adapter
from bench.procinfo import cpu_busy, raise_fd_limit, wait_for_quiet
from bench.profiling import Profiler
from bench.results import Result
from bench.scenarios import Scenario, registry
from bench.server import Context


def machine_info() -> dict[str, Any]:
    cpu = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions: dict[str, str | None] = {}
    packages = ("trioserve", "trio", "hypercorn", "quart", "quart-trio", "httpx", "h11", "pydantic")
    for pkg in packages:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    git = ["git", "-C", str(BENCH.parent)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "src"], capture_output=True)
    gcc = shutil.which("gcc") or shutil.which("cc")
    cc = subprocess.run([gcc, "--version"], capture_output=True, text=True) if gcc else None
    return {
        "trioserve_commit": head.stdout.strip() + (" (src modified)" if dirty.stdout else ""),
        "gcc": cc.stdout.splitlines()[0] if cc and cc.stdout else None,
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": cpu,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "packages": versions,
    }


def fmt(value: float) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"


def print_table(results: list[Result]) -> None:
    rows = [("scenario", "metric", "value", "unit", "target", "met")]
    for res in results:
        for m in res.metrics:
            met = "" if m.met is None else ("met" if m.met else "NOT MET")
            rows.append((res.scenario, m.name, fmt(m.value), m.unit, m.target, met))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for i, row in enumerate(rows):
        cells = [
            c.rjust(w) if j == 2 else c.ljust(w)
            for j, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        print("  ".join(cells).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))


def describe(exc: BaseException) -> str:
    """``Type: message``; an exception group's own exceptions too, in brackets."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, BaseExceptionGroup):
        text += " [" + "; ".join(describe(sub) for sub in exc.exceptions) + "]"
    return text


def list_scenarios(scenarios: dict[str, Scenario[Any]]) -> None:
    keys = max(map(len, scenarios))
    names = max(len(s.name) for s in scenarios.values())
    for key, scenario in scenarios.items():
        print(f"{key:{keys}}  {scenario.name:{names}}  {scenario.summary}")


def parse_args(scenarios: dict[str, Scenario[Any]], argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__.split("\n\n", 1)[0] if __doc__ else None,
    )
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--quick", action="store_true", help="reduced sizes for a smoke run")
    parser.add_argument(
        "--only", default="", help="comma-separated scenarios, by key or name (default: all)"
    )
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write results")
    parser.add_argument(
        "--profile",
        choices=["none", "pyspy", "cprofile"],
        default="none",
        help="profile each server (py-spy attached, or run under cProfile)",
    )
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each scenario, wait up to SECONDS for the machine to be < 25%% busy",
    )
    parser.add_argument(
        "--profile-dir", type=Path, default=BUILD / "profiles", help="where profiles go"
    )
    for scenario in scenarios.values():
        if scenario.options is not None:
            scenario.options(parser)
    args = parser.parse_args(argv)
    by_name = {s.name: key for key, s in scenarios.items()}
    chosen = [s.strip() for s in args.only.split(",") if s.strip()] or list(scenarios)
    unknown = [s for s in chosen if s not in scenarios and s not in by_name]
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(unknown)} (python -m bench --list)")
    args.scenarios = [by_name.get(s, s) for s in chosen]
    return args


def main(argv: list[str] | None = None) -> int:
    scenarios = registry()
    args = parse_args(scenarios, argv)
    if args.list:
        list_scenarios(scenarios)
        return 0
    soft, hard = raise_fd_limit()
    build_adapter()
    if args.profile != "none":
        args.profile_dir.mkdir(parents=True, exist_ok=True)
    info = machine_info()
    info["loadavg_at_start"] = os.getloadavg()
    print(
        f"trioserve bench: {info['nproc']} cpu(s), {info['cpu_model']}, "
        f"python {info['python']}, {'quick' if args.quick else 'full'} run, "
        f"RLIMIT_NOFILE {soft}/{hard}, load average {info['loadavg_at_start'][0]:.2f}",
        flush=True,
    )
    results: list[Result] = []
    failures: dict[str, str] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="trioserve-bench-") as tmp:
        ctx = Context(args.quick, args, Profiler(args.profile, args.profile_dir), Path(tmp))
        for key in args.scenarios:
            scenario = scenarios[key]
            busy = wait_for_quiet(0.25, args.wait_quiet) if args.wait_quiet else cpu_busy()
            print(f"[{key}] running (machine {100 * busy:.0f}% busy before) ...", flush=True)
            load_before = os.getloadavg()[0]
            t0 = time.perf_counter()
            try:
                res = scenario.run(ctx, scenario.sizes(args.quick))
            except Exception as exc:  # report it, go on with the other scenarios
                failures[key] = describe(exc)
                print(f"[{key}] FAILED: {failures[key]}", flush=True)
                continue
            res.details["scenario_seconds"] = round(time.perf_counter() - t0, 2)
            res.details["loadavg_1min_before_after"] = [load_before, os.getloadavg()[0]]
            res.details["cpu_busy_before"] = busy
            results.append(res)
            print(f"[{key}] done in {res.details['scenario_seconds']} s", flush=True)
    print()
    print_table(results)
    for name, server in ctx.servers.items():
        if server["exit_code"] != 0 or server["log_errors"]:
            print(f"\nserver {name}: exit {server['exit_code']}; log: {server['log_errors'][:3]}")
    for name, report in ctx.profiler.reports.items():
        print(f"\n== profile of server {name} ==\n{report}")
    doc = {
        "machine": info,
        "quick": args.quick,
        "params": {key: asdict(scenarios[key].sizes(args.quick)) for key in args.scenarios},
        "total_seconds": round(time.perf_counter() - started, 1),
        "scenarios": {r.scenario: r.as_dict() for r in results},
        "servers": ctx.servers,
        "failures": failures,
    }
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        print(f"\nresults written to {args.json}")
    bad_exits = [n for n, srv in ctx.servers.items() if srv["exit_code"] != 0]
    # Missed targets are results, not errors: only a failed check or server fails the run.
    return 1 if failures or bad_exits else 0
