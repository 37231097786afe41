"""Fixtures only; the helpers tests call live in ``tests/helpers``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from helpers.cli import CLIServer, stop_all
from helpers.server import ServerFactory
from pgtest import fresh_schema


@pytest.fixture
async def start_server(
    nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[ServerFactory]:
    """Start real servers in the test's Trio run; each is drained and stopped at the end."""
    monkeypatch.setenv("TRIOSERVE_ECHO_STATE_DIR", str(tmp_path / "echo-state"))
    factory = ServerFactory(nursery, tmp_path)
    yield factory
    await factory.aclose()


@pytest.fixture
async def store_url() -> AsyncIterator[str]:
    """A fresh PostgreSQL schema's store URL, dropped afterwards (skips without a server)."""
    async with fresh_schema() as url:
        yield url


@pytest.fixture
async def launched(nursery: trio.Nursery) -> AsyncIterator[list[CLIServer]]:
    """The servers a test starts, stopped when it ends (also when it fails)."""
    servers: list[CLIServer] = []
    yield servers
    await stop_all(servers)
