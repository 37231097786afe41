"""Fixtures only; the helpers tests call live in ``tests/helpers``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from helpers.server import ServerFactory


@pytest.fixture
async def start_server(
    nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[ServerFactory]:
    """Start real servers in the test's Trio run; each is drained and stopped at the end."""
    monkeypatch.setenv("TRIOSERVE_ECHO_STATE_DIR", str(tmp_path / "echo-state"))
    factory = ServerFactory(nursery, tmp_path)
    yield factory
    await factory.aclose()
