"""``trioserve validate`` and ``trioserve compile`` as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cliserver import run_cli

FIXTURES = Path(__file__).parent / "fixtures"
EXAMPLES = sorted((FIXTURES / "examples").glob("*.yaml"))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_reference_example_validates(example: Path, tmp_path: Path) -> None:
    result = run_cli(tmp_path, "validate", str(example))
    assert result.returncode == 0, result.stderr
    assert "valid" in result.stdout


def test_compile_prints_the_compiled_spec(tmp_path: Path) -> None:
    registry = FIXTURES / "registry"
    result = run_cli(
        tmp_path, "compile", str(FIXTURES / "examples" / "hello.yaml"), "--registry", str(registry)
    )
    assert result.returncode == 0, result.stderr
    compiled = json.loads(result.stdout)
    assert compiled["v"] == 1 and compiled["metadata"]["name"] == "hello"
    assert [t["name"] for t in compiled["tools"]] == ["get_time"]
    assert compiled["tools"][0]["entrypoint"].startswith(str(registry.resolve()))
    assert compiled["extensions"][0]["config"] == {"path": "./audit.log"}


def test_compile_without_registry_names_every_missing_entry(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "compile", str(FIXTURES / "examples" / "hello.yaml"))
    assert result.returncode == 2
    assert "3 problems" in result.stderr
    for name in ("get_time", "audit-log", "example-time-skill"):
        assert name in result.stderr
    assert "Traceback" not in result.stderr


def test_validate_lists_every_problem(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "validate", str(FIXTURES / "specs" / "many-problems.yaml"))
    assert result.returncode == 2
    problems = [line for line in result.stderr.splitlines() if line.startswith("  - ")]
    assert len(problems) >= 3
    assert any("spec.model.provider" in p for p in problems)
    assert "Traceback" not in result.stderr


def test_version_and_module_entry_point(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "--version")
    assert result.returncode == 0 and result.stdout.startswith("trioserve ")
