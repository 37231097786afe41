"""A user's program calling every method is ``mypy --strict`` clean, and runs."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.server import Server
from tests.helpers.threaded import TrioHost

PROGRAM = Path(__file__).with_name("typed_program.py")
#: mypy's cache for this check alone (its options are not the project's), kept between runs.
MYPY = [sys.executable, "-m", "mypy", "--strict", "--config-file="]
CACHE = Path(__file__).resolve().parents[2] / ".mypy_cache" / "typed-program"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with TrioHost(tmp_path_factory.mktemp("host")) as host:
        yield host.server()


def test_a_program_using_every_method_type_checks_strictly(tmp_path: Path) -> None:
    """As a user's own project would check it: its file alone, ``--strict``, no config."""
    program = tmp_path / "program.py"
    program.write_text(PROGRAM.read_text())
    checked = subprocess.run(
        [*MYPY, f"--cache-dir={CACHE}", str(program)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Success: no issues found in 1 source file" in checked.stdout


def test_the_program_runs(server: Server) -> None:
    ran = subprocess.run(
        [sys.executable, str(PROGRAM), server.url], capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    expected = "True True 1 True completed True completed {n} no_turn True True"
    assert ran.stdout.splitlines() == [
        "async " + expected.format(n=6),
        "sync " + expected.format(n=6),
    ]
