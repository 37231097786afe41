"""docs/design.md's map agrees with the tree and with the import contract.

- The drawing names every package and top-level module of ``trioserve``, in
  the order of the layers contract of ``pyproject.toml`` (names on one line,
  ``a · b`` or side by side, are siblings: ``a | b`` in the contract);
- every module the table names exists, and every module of the tree is named
  in the table (a name may be a glob, ``sqlite*.py``, or a folder,
  ``openai_adapter/``).
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

from tests.helpers import ROOT

PACKAGE = ROOT / "src" / "trioserve"
DESIGN = (ROOT / "docs" / "design.md").read_text()
MAP = DESIGN.split("## The map", 1)[1].split("\n## ", 1)[0]
NAME = re.compile(r"[a-z_]+/?")
# The root package and `python -m trioserve` (the table names the latter with cli's).
ROOT_ONLY = {"__init__.py", "__main__.py"}


def drawn_levels() -> list[set[str]]:
    """The drawing's names, top to bottom, one set per line that names any."""
    drawing = MAP.split("```", 2)[1]
    levels = []
    for line in drawing.splitlines():
        cleaned = re.sub(r"[│─┘▲]", " ", line)
        names: set[str] = set()
        for chunk in re.split(r"\s{2,}", cleaned.strip()):
            parts = [p.strip() for p in chunk.split("·")]
            if chunk and all(NAME.fullmatch(p) for p in parts):
                names.update(p.rstrip("/") for p in parts)
        if names:
            levels.append(names)
    return levels


def contract_levels() -> list[set[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c for c in config["contracts"] if c["type"] == "layers"]
    return [
        {name.strip().removeprefix("trioserve.") for name in layer.split("|")}
        for layer in layers["layers"]
    ]


def test_the_drawing_has_the_contracts_layers_in_order_and_every_package() -> None:
    drawn = drawn_levels()
    # The client sits apart, under the protocol it imports (its own contract).
    assert drawn[-1] == {"client"}
    assert drawn[:-1] == contract_levels()
    # Every package and public module of the root (``_lazy`` serves them all: no layer).
    top = {p.stem for p in PACKAGE.glob("*.py")} | {
        p.parent.name for p in PACKAGE.glob("*/__init__.py")
    }
    assert {name for name in top if not name.startswith("_")} == set().union(*drawn)


def table_names() -> list[str]:
    """Every module the table names, as a path under ``trioserve/`` (may be a glob)."""
    names = []
    for row in MAP.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[1].startswith("`"):
            continue
        if cells[0] not in ("", "—"):
            package = cells[0].strip("`")
        elif cells[0] == "—":
            package = ""
        names += [package + n for n in re.findall(r"`([^`]+)`", cells[1])]
    return names


def test_every_module_the_table_names_exists_and_every_module_is_named() -> None:
    names = table_names()
    assert len(names) > 80  # the parse found the table
    modules = sorted(
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*.py")
        if "__pycache__" not in p.parts
    )
    missing = [
        n
        for n in names
        if not any(matches(n, m) for m in modules)
        and not (n.endswith("/") and (PACKAGE / n).is_dir())  # a folder of package data
    ]
    assert missing == [], "named in docs/design.md, not in the tree"
    unnamed = [
        m
        for m in modules
        if m not in ROOT_ONLY
        and Path(m).name != "__init__.py"
        and not any(matches(n, m) for n in names)
    ]
    assert unnamed == [], "in the tree, not in docs/design.md's table"


def matches(name: str, module: str) -> bool:
    if name.endswith("/"):
        return module.startswith(name)
    return fnmatch.fnmatchcase(module, name)
