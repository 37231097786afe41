"""The test matrix's own promises: one list of supported Pythons, and ``--store`` selection.

noxfile.py reads the supported Pythons from pyproject.toml's classifiers (a
``tests-3.X`` cell each); here the other places that name the oldest one
must agree with them.  The store backends are a parameter of the tests
(tests/helpers/backends.py): ``--store`` and ``-m backends`` pick cells, tried
here on a module of its own (pytester, in-process).
"""

from __future__ import annotations

import argparse
import sys
import tomllib

import pytest

from tests.helpers import ROOT
from tests.helpers.backends import parse_backends

pytest_plugins = ["pytester"]

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def supported() -> list[tuple[int, int]]:
    prefix = "Programming Language :: Python :: 3."
    classifiers = PYPROJECT["project"]["classifiers"]
    return sorted((3, int(c.removeprefix(prefix))) for c in classifiers if c.startswith(prefix))


def test_the_supported_pythons_agree_everywhere() -> None:
    versions = supported()
    oldest = versions[0]
    assert versions == [(3, minor) for minor in range(oldest[1], versions[-1][1] + 1)], versions
    assert PYPROJECT["project"]["requires-python"] == f">={oldest[0]}.{oldest[1]}"
    assert PYPROJECT["tool"]["mypy"]["python_version"] == f"{oldest[0]}.{oldest[1]}"
    assert PYPROJECT["tool"]["ruff"]["target-version"] == f"py{oldest[0]}{oldest[1]}"
    assert sys.version_info[:2] in versions, "this Python is not one the package supports"


SYNTHETIC = """
    import pytest

    def test_contract(backend):
        assert backend in ("memory", "sqlite", "postgres")

    @pytest.mark.backends("sqlite", "postgres")
    async def test_durable(backend_url):
        assert backend_url != "memory"

    @pytest.mark.backends("postgres")
    def test_postgres_only():
        pass

    def test_needs_a_schema(store_url):
        pass

    def test_no_store():
        pass
"""


@pytest.fixture
def synthetic(pytester: pytest.Pytester) -> pytest.Pytester:
    """A test module using the backends parameter, with this suite's conftest."""
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    pytester.makeconftest("from tests.conftest import *  # noqa: F403")
    pytester.makepyfile(test_synthetic=SYNTHETIC)
    return pytester


def collected(pytester: pytest.Pytester, *args: str) -> list[str]:
    result = pytester.runpytest_inprocess("--collect-only", "-q", "-p", "no:cacheprovider", *args)
    assert result.ret in (0, 5), result.outlines
    return sorted(line.split("::")[1] for line in result.outlines if "::" in line)


def test_store_tests_run_once_per_backend_they_allow(synthetic: pytest.Pytester) -> None:
    assert collected(synthetic) == [
        "test_contract[memory]",
        "test_contract[postgres]",
        "test_contract[sqlite]",
        "test_durable[postgres]",
        "test_durable[sqlite]",
        "test_needs_a_schema",
        "test_no_store",
        "test_postgres_only",
    ]


def test_store_selects_backends_and_m_backends_only_the_store_tests(
    synthetic: pytest.Pytester,
) -> None:
    assert collected(synthetic, "--store", "memory") == ["test_contract[memory]", "test_no_store"]
    assert collected(synthetic, "--store", "sqlite,memory", "-m", "backends") == [
        "test_contract[memory]",
        "test_contract[sqlite]",
        "test_durable[sqlite]",
    ]
    assert collected(synthetic, "--store", "postgres", "-m", "backends") == [
        "test_contract[postgres]",
        "test_durable[postgres]",
        "test_needs_a_schema",
        "test_postgres_only",
    ]


def test_the_cells_run(synthetic: pytest.Pytester) -> None:
    """The cells of the backends left out are not made; the tests that need only those go."""
    result = synthetic.runpytest_inprocess("-p", "no:cacheprovider", "--store", "memory,sqlite")
    result.assert_outcomes(passed=4, deselected=2)


@pytest.mark.parametrize("value", ["mysql", "", "memory,nope"])
def test_an_unknown_backend_is_a_usage_error(value: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected one or more of memory, sqlite"):
        parse_backends(value)
