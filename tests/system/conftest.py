"""Fixtures of the tests that start whole ``trioserve run`` processes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio

from tests.helpers.cli import CLIServer, stop_all


@pytest.fixture
async def launched(nursery: trio.Nursery) -> AsyncIterator[list[CLIServer]]:
    """The servers a test starts, stopped when it ends (also when it fails)."""
    servers: list[CLIServer] = []
    yield servers
    await stop_all(servers)
