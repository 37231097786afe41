"""The bench command line finds every scenario module and lists each scenario on one line."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

from bench.scenarios import in_module, registry
from tests.helpers import ROOT


def test_the_list_has_one_line_per_scenario_of_every_module() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "--list"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    lines = out.splitlines()
    found = registry()
    assert [line.split()[:2] for line in lines] == [[k, s.name] for k, s in found.items()]
    assert all(len(line.split()) > 2 for line in lines)  # each says what it measures
    # Every module in bench/scenarios/ contributes (a module without a scenario is a mistake).
    scenarios_dir = ROOT / "bench" / "scenarios"
    for info in pkgutil.iter_modules([str(scenarios_dir)]):
        module = importlib.import_module(f"bench.scenarios.{info.name}")
        keys = [s.key for s in in_module(module)]
        assert keys and all(k in found for k in keys), info.name
    # The scenarios of the first rounds keep their letters.
    assert set("abcdefghijklmn") | {"floor"} <= set(found)


def test_a_scenario_is_chosen_by_its_letter_or_its_name_and_unknown_ones_are_refused() -> None:
    from bench.cli import parse_args

    args = parse_args(registry(), ["--only", "a,stream-rate-sqlite,floor"])
    assert args.scenarios == ["a", "f", "floor"]
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--only", "a,nope"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "unknown scenario(s): nope" in done.stderr
