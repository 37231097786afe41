"""The tree stays easy to find one's way in: files stay small."""

from __future__ import annotations

from tests.helpers import ROOT

LIMIT = 500  # lines; ~400 is the aim (CONTRIBUTING.md)


def test_no_source_file_under_src_or_bench_is_over_the_limit() -> None:
    sizes = {
        path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines())
        for folder in ("src", "bench")
        for path in (ROOT / folder).rglob("*")
        if path.suffix in (".py", ".c", ".js", ".css", ".html") and ".build" not in path.parts
    }
    assert len(sizes) > 50  # the walk found the tree
    assert {name: n for name, n in sizes.items() if n > LIMIT} == {}
