"""Idempotency keys in the SQL stores: the statements both backends run, in their dialect.

The ``idempotency_keys`` table (``KEYS_TABLE``, made by both schemas'
migrations) has one row per tenant and key: ``''`` is the tenant of a
server without API keys (tenant names are never empty), times are
microseconds, as everywhere (``stores.codec``).  ``claim_key`` and
``keep_key`` run inside ``insert``/``insert_turn``'s transaction, so a key
is bound in the same step as its session or turn; the others are whole
operations (``SQLStore``'s hooks run them in a worker thread).  On
PostgreSQL a claim holds a transaction-level advisory lock of the key, so
two processes claiming it at once are served one after the other: the
second finds the first's row.  SQLite's ``BEGIN IMMEDIATE`` does that
already.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Final, NamedTuple

from trioserve.stores.codec import _from_micros, _to_micros
from trioserve.stores.records import IdempotencyClaim, IdempotencyKeyBound, IdempotencyRecord

__all__ = [
    "KEYS_TABLE",
    "KeyDialect",
    "bind_key",
    "claim_key",
    "find_key",
    "keep_key",
    "key_row",
    "purge_keys_chunk",
]

#: The migration statements that make the table (both schemas run them).
KEYS_TABLE: Final = (
    """
        CREATE TABLE idempotency_keys (
            tenant      text NOT NULL,    -- '' without API keys
            name        text NOT NULL,    -- the key, as the client sent it
            fingerprint text NOT NULL,    -- what the request asked: route and body
            session_id  text,             -- the session it created, or its turn's
            turn_id     text,             -- the turn it started
            refusal     text,             -- or the reason of its refusal
            message     text,             -- and its message
            created_at  bigint NOT NULL,  -- microseconds since 1970-01-01T00:00Z
            expires_at  bigint NOT NULL,
            PRIMARY KEY (tenant, name)
        )
        """,
    "CREATE INDEX idempotency_keys_by_expiry ON idempotency_keys (expires_at)",
)

_COLUMNS: Final = (
    "tenant, name, fingerprint, session_id, turn_id, refusal, message, created_at, expires_at"
)


class KeyDialect(NamedTuple):
    """What differs between the backends here."""

    #: The positional placeholder (``?`` or ``%s``).
    placeholder: str
    #: The column naming a row physically (``rowid``, ``ctid``), for chunked deletes.
    row_id: str
    #: Opens a transaction on a connection (``BEGIN IMMEDIATE``; psycopg's ``transaction``).
    transaction: Callable[[Any], AbstractContextManager[Any]]
    #: Takes a lock of one key until the transaction ends (``None``: the transaction
    #: serialises already).
    lock: Callable[[Any, str], None] | None = None


def key_row(record: IdempotencyRecord) -> tuple[Any, ...]:
    """A record's row, in ``_COLUMNS`` order."""
    claim = record.claim
    return (
        claim.tenant or "",
        claim.key,
        claim.fingerprint,
        record.session_id,
        record.turn_id,
        record.refusal,
        record.message,
        _to_micros(claim.created_at, "created_at"),
        _to_micros(claim.expires_at, "expires_at"),
    )


def _record(row: tuple[Any, ...]) -> IdempotencyRecord:
    tenant, name, fingerprint, session_id, turn_id, refusal, message, created, expires = row
    claim = IdempotencyClaim(
        tenant or None, name, fingerprint, _from_micros(created), _from_micros(expires)
    )
    return IdempotencyRecord(claim, session_id, turn_id, refusal, message)


def find_key(
    conn: Any, d: KeyDialect, tenant: str | None, name: str, at: int
) -> IdempotencyRecord | None:
    """The record of ``tenant``'s key ``name`` unless it expired at or before ``at``."""
    p = d.placeholder
    found = conn.execute(
        f"SELECT {_COLUMNS} FROM idempotency_keys"
        f" WHERE tenant = {p} AND name = {p} AND expires_at > {p}",
        (tenant or "", name, at),
    ).fetchone()
    return None if found is None else _record(found)


def claim_key(conn: Any, d: KeyDialect, row: tuple[Any, ...]) -> None:
    """In the caller's transaction: ``IdempotencyKeyBound`` if the key of ``row`` is bound
    at its claim's time (a row of it that expires later)."""
    tenant, name, created = row[0], row[1], row[7]
    if d.lock is not None:
        d.lock(conn, f"trioserve_key:{tenant}\x1f{name}:")
    found = find_key(conn, d, tenant, name, created)
    if found is not None:
        raise IdempotencyKeyBound(found)


def keep_key(conn: Any, d: KeyDialect, row: tuple[Any, ...]) -> None:
    """In the caller's transaction, after ``claim_key``: store the row (over an expired one)."""
    p = d.placeholder
    values = ", ".join([p] * len(row))
    updates = ", ".join(f"{c} = excluded.{c}" for c in _COLUMNS.split(", ")[2:])
    conn.execute(
        f"INSERT INTO idempotency_keys ({_COLUMNS}) VALUES ({values})"
        f" ON CONFLICT (tenant, name) DO UPDATE SET {updates}",
        row,
    )


def bind_key(conn: Any, d: KeyDialect, row: tuple[Any, ...]) -> None:
    """``remember_refusal``'s step: claim the key and keep the row, in one transaction."""
    with d.transaction(conn):
        claim_key(conn, d, row)
        keep_key(conn, d, row)


def purge_keys_chunk(conn: Any, d: KeyDialect, cutoff: int, rows: int) -> tuple[int, bool]:
    """Delete up to ``rows`` records that expired at or before ``cutoff``; return how many
    and whether that was the last of them."""
    p = d.placeholder
    deleted: int = conn.execute(
        f"""
        DELETE FROM idempotency_keys WHERE {d.row_id} IN (
            SELECT {d.row_id} FROM idempotency_keys WHERE expires_at <= {p} LIMIT {p}
        )
        """,
        (cutoff, rows),
    ).rowcount
    return deleted, deleted < rows
