"""Store backends as a parameter of the tests: memory, SQLite and PostgreSQL.

A test that takes the ``backend`` fixture (directly or through
``backend_url``, a fresh store of that backend) runs once per backend:
``test_x[memory]``, ``test_x[sqlite]``, ``test_x[postgres]``.
``@pytest.mark.backends("sqlite", "postgres")`` narrows the list (a test that
restarts a server on the same store needs a durable one).  On a test that
does not take ``backend`` the marker names the backends it needs anyway (the
SQLite and PostgreSQL stores' own tests); a test that takes ``store_url`` (a
PostgreSQL schema, ``tests/conftest.py``) needs PostgreSQL.

``pytest --store postgres`` (or ``--store memory,sqlite``) runs only those
backends: the other backends' cells, and the tests that need only other
backends, are deselected.  ``-m backends`` keeps only the tests that run on a
store backend (with ``--store``: the quick loop of one backend, ``nox -s
"stores(backend='postgres')"``).  PostgreSQL's cells skip without a server,
and fail under ``CI=true`` (``tests.helpers.pg``).
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import pytest

from tests.helpers.pg import fresh_schema, fresh_schema_sync

BACKENDS = ("memory", "sqlite", "postgres")
DURABLE = ("sqlite", "postgres")
"""The backends whose sessions outlive the server (a restart finds them)."""

MARKER = "backends"
NEEDS_POSTGRES = "store_url"
"""The fixture of a test that needs PostgreSQL whatever it is parametrised over."""


def parse_backends(value: str) -> tuple[str, ...]:
    """``--store``'s value: backend names, comma-separated."""
    names = tuple(dict.fromkeys(name.strip() for name in value.split(",") if name.strip()))
    unknown = [name for name in names if name not in BACKENDS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"{value!r}: expected one or more of {', '.join(BACKENDS)}, comma-separated"
        )
    return names


def marked(node: pytest.Item | pytest.Function) -> tuple[str, ...] | None:
    """The backends a ``backends`` marker names (``None``: no marker)."""
    marker = node.get_closest_marker(MARKER)
    if marker is None:
        return None
    unknown = [name for name in marker.args if name not in BACKENDS]
    if unknown or not marker.args:
        raise pytest.UsageError(f"{node.nodeid}: @pytest.mark.backends{marker.args!r}")
    return tuple(marker.args)


def parametrize(metafunc: pytest.Metafunc, selected: Iterable[str]) -> None:
    """Run a test that takes ``backend`` once per backend it allows and ``--store`` selects.

    Module scope, so that a module-scoped fixture (a server shared by a
    module's tests) may take ``backend`` too.  When ``--store`` selects none of
    the test's backends, one ``deselected`` cell stands for the test and
    :func:`deselect` removes it.
    """
    if "backend" not in metafunc.fixturenames:
        return
    allowed = marked(metafunc.definition) or BACKENDS
    names = [name for name in allowed if name in selected] or ["deselected"]
    metafunc.parametrize("backend", names, scope="module")


def deselect(config: pytest.Config, items: list[pytest.Item], selected: Iterable[str]) -> None:
    """Mark store tests ``backends`` (for ``-m backends``); drop what ``--store`` leaves out."""
    chosen = set(selected)
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        callspec = getattr(item, "callspec", None)
        if "backend" in fixtures and callspec is not None:
            needs = {callspec.params["backend"]}
        elif (names := marked(item)) is not None:
            needs = set(names)
        elif NEEDS_POSTGRES in fixtures:
            needs = {"postgres"}
        else:
            kept.append(item)
            continue
        if not needs & chosen:
            dropped.append(item)
            continue
        if item.get_closest_marker(MARKER) is None:
            item.add_marker(pytest.mark.backends(*sorted(needs)))
        kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def local_store_url(backend: str, directory: Path) -> str:
    """The URL of a new memory store or of a SQLite file in ``directory``."""
    if backend == "sqlite":
        return f"sqlite:{directory / 'sessions.db'}"
    if backend == "memory":
        return "memory"
    raise ValueError(f"not a local store backend: {backend!r}")


@asynccontextmanager
async def fresh_store_url(backend: str, directory: Path) -> AsyncIterator[str]:
    """A new, empty store of ``backend``: ``memory``, a SQLite file in ``directory``, or a
    PostgreSQL schema of its own (dropped afterwards)."""
    if backend == "postgres":
        async with fresh_schema() as url:
            yield url
    else:
        yield local_store_url(backend, directory)


@contextmanager
def fresh_store_url_sync(backend: str, directory: Path) -> Iterator[str]:
    """:func:`fresh_store_url` outside Trio (a module-scoped fixture)."""
    if backend == "postgres":
        with fresh_schema_sync() as url:
            yield url
    else:
        yield local_store_url(backend, directory)
