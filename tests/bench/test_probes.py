"""The probe tools run a server with probes in it and print their report."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.helpers import ROOT


def run(module: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_trio_steps_counts_a_create_and_turn_s_steps_by_task() -> None:
    out = run("bench.trio_steps", "5")
    first, *rows = out.splitlines()
    match = re.fullmatch(r"([\d.]+) task steps a create \+ turn \(5 pairs after 20\):", first)
    assert match is not None and float(match.group(1)) > 10
    assert any("read_pipe" in row or "receive_stdout" in row for row in rows)  # the adapter's
    assert any("_serve" in row for row in rows)  # the connection's


def test_turn_timeline_times_a_turn_s_steps() -> None:
    out = run("bench.turn_timeline", "25")
    assert out.startswith("5 turns; median ms from start_turn:")
    assert "first frame to the socket" in out
