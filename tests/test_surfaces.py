"""Each package's public surface: its ``__all__`` names, loaded on first use."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers import ROOT

PACKAGES = ("spec", "runtime", "sessions", "observe", "http")


def package(name: str) -> ModuleType:
    return importlib.import_module(f"trioserve.{name}")


@pytest.mark.parametrize("name", PACKAGES)
def test_every_exported_name_is_the_object_of_its_private_module(name: str) -> None:
    pkg = package(name)
    names: dict[str, tuple[str, ...]] = pkg._NAMES
    modules: dict[str, str] = getattr(pkg, "_MODULES", {})
    where: dict[str, tuple[str, str | None]] = {
        n: (module, n) for module, exported in names.items() for n in exported
    }
    where |= {alias: (module, None) for alias, module in modules.items()}
    assert sorted(pkg.__all__) == sorted(where) and pkg.__all__
    for exported, (module_name, attribute) in where.items():
        assert module_name.startswith("_"), module_name  # the surface hides private modules
        module = importlib.import_module(f"trioserve.{name}.{module_name}")
        expected = module if attribute is None else getattr(module, attribute)
        assert getattr(pkg, exported) is expected, exported
        assert exported in dir(pkg)


@pytest.mark.parametrize("name", PACKAGES)
def test_the_type_checkers_names_are_the_exported_ones(name: str) -> None:
    """The ``TYPE_CHECKING`` imports of the ``__init__`` name what ``__all__`` does."""
    pkg = package(name)
    assert pkg.__file__ is not None
    tree = ast.parse(Path(pkg.__file__).read_text())
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        for stmt in node.body
        if isinstance(stmt, ast.ImportFrom)
        for alias in stmt.names
    }
    assert imported == set(pkg.__all__)


@pytest.mark.parametrize("name", PACKAGES)
def test_an_unknown_name_is_an_attribute_error(name: str) -> None:
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchName'"):
        _ = package(name).NoSuchName
    with pytest.raises(ImportError):
        exec(f"from trioserve.{name} import NoSuchName")


def loaded_after(code: str) -> list[str]:
    """The module names in ``sys.modules`` after ``code`` runs in a new interpreter."""
    program = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    )
    loaded: list[str] = json.loads(out.stdout)
    return loaded


def test_importing_the_packages_loads_none_of_their_modules() -> None:
    loaded = loaded_after("import " + ", ".join(f"trioserve.{name}" for name in PACKAGES))
    heavy = ("trio", "quart", "hypercorn", "pydantic", "prometheus_client", "opentelemetry")
    assert [m for m in loaded if m.split(".")[0] in heavy] == []
    ours = {m for m in loaded if m.startswith("trioserve.")}
    assert ours == {"trioserve._lazy", *(f"trioserve.{name}" for name in PACKAGES)}


def test_the_reaper_and_the_echo_adapter_start_without_trio() -> None:
    for program in ("reaper", "echo_adapter"):
        loaded = loaded_after(f"import trioserve.runtime.{program}")
        assert f"trioserve.runtime.{program}" in loaded
        assert [m for m in loaded if m.split(".")[0] == "trio"] == [], program


def test_a_name_loads_only_its_module() -> None:
    loaded = loaded_after("from trioserve.http import KeyRing")
    assert "trioserve.http._auth" in loaded
    assert [m for m in loaded if m.split(".")[0] in ("quart", "hypercorn")] == []


def test_other_packages_import_the_surface_not_private_modules() -> None:
    """``from trioserve.runtime import WarmPool``, not ``trioserve.runtime._pool``, outside it."""
    src = ROOT / "src"
    paths = sorted((src / "trioserve").rglob("*.py"))
    assert len(paths) > 50  # the tree is where this test expects it
    found = []
    for path in paths:
        own = path.relative_to(src / "trioserve").parts[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.module is None:
                continue
            parts = node.module.split(".")
            if parts[0] != "trioserve" or len(parts) < 2 or parts[1] not in PACKAGES:
                continue
            if parts[1] == own:
                continue  # inside a package, its modules import each other by path
            private = len(parts) > 2 and parts[2].startswith("_")
            private |= any(alias.name.startswith("_") for alias in node.names)
            if private:
                found.append(f"{path.relative_to(src)}:{node.lineno}: {node.module}")
    assert found == []
