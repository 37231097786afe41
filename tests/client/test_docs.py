"""docs/client.md's opening examples run as pasted: a turn on asyncio, on Trio, blocking."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.server import Server
from tests.helpers.threaded import TrioHost

DOC = Path(__file__).resolve().parents[2] / "docs" / "client.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```\n", re.MULTILINE | re.DOTALL)


def opening_examples() -> list[str]:
    """The three examples before the first section of docs/client.md."""
    head = DOC.read_text().split("\n## ", 1)[0]
    return _BLOCK.findall(head)[:3]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with TrioHost(tmp_path_factory.mktemp("host")) as host:
        yield host.server()


def test_the_examples_are_short() -> None:
    examples = opening_examples()
    assert ["asyncio.run(main())" in examples[0], "trio.run(main)" in examples[1]] == [True] * 2
    assert "SyncClient" in examples[2] and "async" not in examples[2]
    for example in examples:
        assert len([line for line in example.splitlines() if line.strip()]) <= 10, example


@pytest.mark.parametrize("n", [0, 1, 2], ids=["asyncio", "trio", "blocking"])
def test_an_example_runs_a_turn(n: int, server: Server) -> None:
    code = opening_examples()[n].replace("http://127.0.0.1:8080", server.url)
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0].startswith("session.started {")
    assert lines[1] == "message {'role': 'assistant', 'text': 'echo: Hello!'}"
    assert lines[-1].startswith("session.ended {") and "'reason': 'completed'" in lines[-1]
