"""Session stores: the ``Store`` contract and its backends, chosen by a store URL.

Store URLs (``open_store``):

- ``memory``: a ``MemoryStore``; sessions last as long as the process.
- ``sqlite``: a ``SQLiteStore`` at ``default_sqlite_path()``.
- ``sqlite:PATH``: a ``SQLiteStore`` at ``PATH`` (``~`` is expanded; relative
  paths are taken from the current directory).
- ``postgresql://...`` (or ``postgres://...``): a ``PostgresStore``; a libpq
  URI, with an optional ``schema=NAME`` query parameter (the PostgreSQL
  schema to keep the tables in).  Needs the ``postgres`` extra
  (``pip install 'trioserve[postgres]'``: psycopg 3 and psycopg_pool).

Backends are imported on use: ``import trioserve.stores`` loads neither
``sqlite3`` nor a database driver; ``MemoryStore`` and ``SQLiteStore`` (and
the backend modules) are loaded when first named, and ``open_store`` loads
only the backend its URL names.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trioserve.errors import StoreError
from trioserve.stores.base import (
    TERMINAL_STATUSES,
    UNSET,
    LogBounds,
    LoggedEvent,
    Session,
    SessionKey,
    SessionStatus,
    Store,
    TurnEnd,
    TurnRecord,
    TurnStatus,
    utcnow,
)
from trioserve.stores.records import (
    IdempotencyClaim,
    IdempotencyKeyBound,
    IdempotencyRecord,
    TurnBatch,
)

if TYPE_CHECKING:
    from trioserve.stores.memory import MemoryStore
    from trioserve.stores.postgres import PostgresStore
    from trioserve.stores.sqlite import SQLiteStore

__all__ = [
    "TERMINAL_STATUSES",
    "UNSET",
    "IdempotencyClaim",
    "IdempotencyKeyBound",
    "IdempotencyRecord",
    "LogBounds",
    "LoggedEvent",
    "MemoryStore",
    "PostgresStore",
    "SQLiteStore",
    "Session",
    "SessionKey",
    "SessionStatus",
    "Store",
    "TurnBatch",
    "TurnEnd",
    "TurnRecord",
    "TurnStatus",
    "default_sqlite_path",
    "missing_support",
    "open_store",
    "utcnow",
]

#: The backends ``from trioserve.stores import X`` loads on first use.
_LAZY: dict[str, tuple[str, str]] = {
    "MemoryStore": ("trioserve.stores.memory", "MemoryStore"),
    "SQLiteStore": ("trioserve.stores.sqlite", "SQLiteStore"),
    "PostgresStore": ("trioserve.stores.postgres", "PostgresStore"),
}


def __getattr__(name: str) -> Any:
    """Load a backend class on first use (PEP 562)."""
    try:
        module_name, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module_name), attribute)
    globals()[name] = value
    return value


_ACCEPTED = (
    "'memory', 'sqlite' (the default path), 'sqlite:PATH' or 'postgresql://...' "
    "(also 'postgres://...')"
)


def default_sqlite_path() -> Path:
    """``$XDG_DATA_HOME/trioserve/sessions.db``, else ``~/.local/share/trioserve/sessions.db``.

    As the XDG spec says, an empty or relative ``$XDG_DATA_HOME`` is ignored.
    """
    data_home = os.environ.get("XDG_DATA_HOME", "")
    base = Path(data_home) if os.path.isabs(data_home) else Path.home() / ".local" / "share"
    return base / "trioserve" / "sessions.db"


def missing_support(url: str) -> str | None:
    """What is missing to open ``url`` (a PostgreSQL URL without psycopg: the extra to
    install, from PyPI or from a clone), or ``None``.  ``trioserve run --workers N`` asks
    once, before it starts its workers, so the hint is printed once."""
    scheme, _, rest = url.partition(":")
    if scheme not in ("postgresql", "postgres") or not rest.startswith("//"):
        return None
    try:
        import trioserve.stores.postgres  # noqa: F401 (psycopg and psycopg_pool)
    except ImportError as exc:
        return (
            f"store URL {url!r} needs PostgreSQL support: install the 'postgres' extra "
            f"(pip install 'trioserve[postgres]', or from a clone: pip install '.[postgres]'); "
            f"{exc}"
        )
    return None


async def open_store(url: str) -> Store:
    """Open the store ``url`` names (see the module docstring).

    Raises ``ValueError`` for a URL of no accepted form, and ``StoreError`` if
    the store itself can't be opened (or psycopg is not installed for a
    PostgreSQL URL: the error names the ``postgres`` extra).
    """
    scheme, colon, rest = url.partition(":")
    if scheme == "memory" and not colon:
        from trioserve.stores.memory import MemoryStore

        return MemoryStore()
    if scheme == "sqlite":
        if colon and not rest:
            raise ValueError(f"bad store URL {url!r}: empty path; use {_ACCEPTED}")
        from trioserve.stores.sqlite import SQLiteStore

        return await SQLiteStore.open(rest if colon else default_sqlite_path())
    if scheme in ("postgresql", "postgres") and rest.startswith("//"):
        missing = missing_support(url)
        if missing is not None:
            raise StoreError(missing)
        from trioserve.stores.postgres import PostgresStore

        return await PostgresStore.open(url)
    raise ValueError(f"bad store URL {url!r}: use {_ACCEPTED}")
