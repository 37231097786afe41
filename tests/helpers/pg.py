"""PostgreSQL for tests: the server's URL, a fresh schema per test, skip or fail when it is down.

``TRIOSERVE_TEST_PG_URL`` names the server (default
``postgresql://postgres@127.0.0.1:5432/test``).  When it cannot be reached
the tests that need it are skipped, saying why, except under ``CI=true``,
where they fail: CI must run them.
"""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from urllib.parse import urlsplit, urlunsplit

import pytest
import trio

PG_URL = os.environ.get("TRIOSERVE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


@functools.cache
def _unreachable() -> str | None:
    """Why PostgreSQL can't be used (``None``: it can)."""
    try:
        import psycopg
    except ImportError as exc:
        return f"psycopg is not installed ({exc})"
    try:
        psycopg.connect(PG_URL, connect_timeout=3).close()
    except psycopg.Error as exc:
        return f"cannot connect: {exc}".strip()
    return None


def require_pg() -> str:
    """The server's URL; skip the test (fail it under ``CI=true``) if it is unreachable."""
    reason = _unreachable()
    if reason is not None:
        message = f"PostgreSQL at {PG_URL} (TRIOSERVE_TEST_PG_URL) is not reachable: {reason}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: {message}")
        pytest.skip(message)
    return PG_URL


def with_schema(url: str, schema: str) -> str:
    parts = urlsplit(url)
    query = f"{parts.query}&schema={schema}" if parts.query else f"schema={schema}"
    return urlunsplit(parts._replace(query=query))


def _drop(schema: str) -> None:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _new_schema() -> tuple[str, str]:
    """A schema name of its own (``pgstore_<uuid>``) and its store URL (skips without a server)."""
    url = require_pg()
    schema = f"pgstore_{uuid.uuid4().hex}"
    return schema, with_schema(url, schema)


@asynccontextmanager
async def fresh_schema() -> AsyncIterator[str]:
    """A store URL on a schema of its own (``pgstore_<uuid>``), dropped afterwards."""
    schema, url = _new_schema()
    try:
        yield url
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(_drop, schema)


@contextmanager
def fresh_schema_sync() -> Iterator[str]:
    """:func:`fresh_schema` outside Trio (a module's server in a subprocess)."""
    schema, url = _new_schema()
    try:
        yield url
    finally:
        _drop(schema)
