"""Scenario fork-server (issue 30): the built-in Python adapters exec'd, from the warm
pool, and forked from the fork server (``--fork-server auto``): turn start latency and
back-to-back turns, and 64 sessions x 5 turns against the bench's C adapter.

Sequential: each turn on a session of its own (created first), sent as soon as
the last one ended; ``first event`` is the time from sending the request to its
first SSE frame whole (``session.started``).  ``CPU per turn`` is the server's,
its reaped children's and its live children's (the fork server, the pool) over
the run (``procinfo.tree_cpu_seconds``).  The ``openai`` runtime talks to a fake
model server in the bench process (``bench/fake_model.py``).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
import trio

from bench import BenchError
from bench.adapter import adapter_command
from bench.client import JSON_HEADERS, check_sse, create
from bench.fake_model import fake_model
from bench.procinfo import tree_cpu_seconds
from bench.results import Result, latency_summary
from bench.scenarios import scenario
from bench.scenarios.concurrent_turns import run_rounds
from bench.server import SPEC_YAML, Context

OPENAI_SPEC = SPEC_YAML.replace("runtime: {type: echo}", "runtime: {type: openai}").replace(
    "provider: anthropic", "provider: openai"
)
#: How each mode runs the spec's adapter.
MODES: dict[str, list[str]] = {
    "exec": ["--fork-server", "off", "--warm-adapters", "0"],
    "warm": ["--fork-server", "off", "--warm-adapters", "1"],
    "fork": ["--fork-server", "auto"],
}


@dataclass(frozen=True)
class Sizes:
    turns: int = 100  # back to back, per runtime and mode
    openai_turns: int = 40
    sessions: int = 64
    turns_each: int = 5
    rounds: int = 3


def _turn(client: httpx.Client, sid: str) -> tuple[float, float]:
    """One streamed turn: seconds to its first frame and to its end."""
    chunks: list[bytes] = []
    first = None
    t0 = time.perf_counter()
    with client.stream(
        "POST", f"/v1/sessions/{sid}/turns", content=b'{"input":"hi"}', headers=JSON_HEADERS
    ) as resp:
        if resp.status_code != 200:
            resp.read()
            raise BenchError(f"turn: HTTP {resp.status_code} {resp.text[:200]}")
        for chunk in resp.iter_raw():
            chunks.append(chunk)
            if first is None and b"\n\n" in b"".join(chunks):
                first = time.perf_counter() - t0
    end = time.perf_counter() - t0
    check_sse(b"".join(chunks))
    return first or end, end


def _sequential(
    ctx: Context,
    name: str,
    spec: str,
    flags: list[str],
    turns: int,
    env: dict[str, str],
    command: str = "",
) -> dict[str, Any]:
    with (
        ctx.server(name, command, ["--in-memory", *flags], spec_yaml=spec, env=env) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as client,
    ):
        sids = [create(client) for _ in range(turns + 3)]
        for sid in sids[:3]:  # warm-up: the pool's first load, the fork server's pages
            _turn(client, sid)
        time.sleep(0.5)
        cpu0 = tree_cpu_seconds(srv.pid)
        firsts, totals = [], []
        for sid in sids[3:]:
            first, total = _turn(client, sid)
            firsts.append(first)
            totals.append(total)
        cpu = tree_cpu_seconds(srv.pid) - cpu0
        paths = srv.log_mentions("turn ended")
    counts = {p: sum(f"adapter={p}" in line for line in paths) for p in ("fork", "warm", "cold")}
    return {
        "flags": flags,
        "first_event": latency_summary(firsts),
        "turn": latency_summary(totals),
        "cpu_ms_per_turn": round(cpu / turns * 1000, 2),
        "adapter_paths": counts,
    }


def _concurrent(
    ctx: Context, p: Sizes, name: str, command: str, flags: list[str]
) -> dict[str, Any]:
    s = p.sessions
    flags = ["--in-memory", "--max-concurrent-turns", str(s), "--max-sessions", "0", *flags]
    with ctx.server(name, command, flags) as srv:
        rounds = trio.run(
            run_rounds, [srv.url], s, p.turns_each, p.rounds, partial(tree_cpu_seconds, srv.pid)
        )
    return {
        "flags": flags,
        "wall_s_median": statistics.median(r["wall_s"] for r in rounds),
        "cpu_ms_per_turn": statistics.median(r["server_cpu_ms_per_turn"] for r in rounds),
        "rounds": rounds,
    }


@scenario(
    "fork-server",
    "fork-server",
    full=Sizes(),
    quick=Sizes(turns=20, openai_turns=10, rounds=1),
)
def fork_server(ctx: Context, p: Sizes) -> Result:
    """echo, openai exec'd, warm, forked: first event, back to back, 64x5
    [fork: first event p50 <= 3 ms echo, <= 20 ms openai; 64x5 <= 1.3 x C]
    """
    res = Result("fork-server", "built-in Python adapters: exec'd, warm pool, fork server")
    details: dict[str, Any] = {"sequential": {}, "concurrent": {}}
    with fake_model() as model_url:
        env = {"TRIOSERVE_OPENAI_BASE_URL": model_url}
        for runtime, spec, turns in (
            ("echo", SPEC_YAML, p.turns),
            ("openai", OPENAI_SPEC, p.openai_turns),
        ):
            for mode, flags in MODES.items():
                row = _sequential(ctx, f"{runtime}-{mode}", spec, flags, turns, env)
                details["sequential"][f"{runtime} {mode}"] = row
                first, turn = row["first_event"]["p50_ms"], row["turn"]["p50_ms"]
                label = f"{runtime} {mode}: first event p50"
                if mode == "fork":
                    target = 3.0 if runtime == "echo" else 20.0
                    res.add(label, first, "ms", f"<= {target:g} ms", first <= target)
                else:
                    res.add(label, first, "ms")
                res.add(f"  {runtime} {mode}: turn p50", turn, "ms")
                res.add(f"  {runtime} {mode}: CPU per turn", row["cpu_ms_per_turn"], "ms")
    # The floor of the sequential figures: the same loop with the C adapter exec'd (the
    # server's own turn, and a spawn that costs the adapter almost nothing).
    row = _sequential(ctx, "c-exec", SPEC_YAML, MODES["exec"], p.turns, {}, adapter_command("1"))
    details["sequential"]["C adapter exec"] = row
    res.add("C adapter exec: first event p50", row["first_event"]["p50_ms"], "ms")
    res.add("  C adapter exec: turn p50", row["turn"]["p50_ms"], "ms")
    res.add("  C adapter exec: CPU per turn", row["cpu_ms_per_turn"], "ms")
    c_row = _concurrent(ctx, p, "c-adapter", adapter_command("1"), [])
    details["concurrent"]["C adapter"] = c_row
    res.add("64x5 C adapter (exec'd): wall", c_row["wall_s_median"], "s")
    for mode in ("exec", "warm", "fork"):
        row = _concurrent(ctx, p, f"echo-64x5-{mode}", "", MODES[mode])
        details["concurrent"][f"echo {mode}"] = row
        wall = row["wall_s_median"]
        ratio = round(wall / c_row["wall_s_median"], 2)
        if mode == "fork":
            res.add("64x5 echo fork: wall", wall, "s", "<= 1.3 x C", ratio <= 1.3)
        else:
            res.add(f"64x5 echo {mode}: wall", wall, "s")
        res.add(f"  64x5 echo {mode}: x C adapter", ratio, "x")
        res.add(f"  64x5 echo {mode}: CPU per turn", row["cpu_ms_per_turn"], "ms")
    res.details = details
    return res
