"""Fixtures, and the store backends as a test parameter; the helpers tests call live in
``tests/helpers``."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from tests.helpers import backends
from tests.helpers.pg import fresh_schema
from tests.helpers.server import ServerFactory

# The tests' HTTP clients (httpx, in the workers and in the CLI commands they run) speak
# plain HTTP to 127.0.0.1, yet httpx loads a CA bundle for every client it makes: 20 ms
# of CPU each for the system's (SSL_CERT_FILE), about 1,100 clients a run.  An empty
# SSL_CERT_FILE and a certificate directory that does not exist (looked in only when a
# certificate is verified) make that nothing; no test verifies a certificate against
# the system's authorities (they have no network to reach).
os.environ["SSL_CERT_FILE"] = ""
os.environ["SSL_CERT_DIR"] = str(Path(__file__).parent / "fixtures" / "no-certificates")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store",
        type=backends.parse_backends,
        default=backends.BACKENDS,
        metavar="NAME[,NAME]",
        help="run the store-dependent tests on these backends only "
        f"({', '.join(backends.BACKENDS)}; default: all); see tests/helpers/backends.py",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "backends(*names): the store backends the test runs on (tests/helpers/backends.py)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    backends.parametrize(metafunc, metafunc.config.getoption("store"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    backends.deselect(config, items, config.getoption("store"))


@pytest.fixture
async def start_server(
    nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[ServerFactory]:
    """Start real servers in the test's Trio run; each is drained and stopped at the end."""
    monkeypatch.setenv("TRIOSERVE_ECHO_STATE_DIR", str(tmp_path / "echo-state"))
    factory = ServerFactory(nursery, tmp_path)
    yield factory
    await factory.aclose()


@pytest.fixture(scope="module")
def backend() -> str:
    """The store backend of this cell: set by ``pytest_generate_tests`` (this never runs)."""
    raise AssertionError("backend is a parameter (tests/helpers/backends.py)")


@pytest.fixture
async def backend_url(backend: str, tmp_path: Path) -> AsyncIterator[str]:
    """A fresh store of this cell's backend: ``memory``, a SQLite file or a PostgreSQL schema."""
    async with backends.fresh_store_url(backend, tmp_path) as url:
        yield url


@pytest.fixture
async def store_url() -> AsyncIterator[str]:
    """A fresh PostgreSQL schema's store URL, dropped afterwards (skips without a server)."""
    async with fresh_schema() as url:
        yield url
