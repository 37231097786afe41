"""The PostgreSQL store's database: its URL, its schema, its migrations.

The store URL is a libpq URI (``postgresql://`` or ``postgres://``) with
one extra query parameter, ``schema``: the PostgreSQL schema (namespace)
the store's tables live in, created if missing (default: the server's
``search_path``, normally ``public``).  ``trioserve_schema`` holds the
schema version (one row); opening runs the pending migrations in one
transaction, under a transaction-level advisory lock so that processes
opening the same database at once migrate it once, and refuses a database
made by a newer version.  Times are ``bigint`` microseconds since the
epoch (UTC), as in the SQLite store (``stores.codec``); ``raw``, and a
turn's ``input`` and ``reason`` (UTF-8, so that a NUL is kept), are ``bytea``.
"""

from __future__ import annotations

import re
from typing import Any, Final, TypeAlias
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql

from trioserve.stores.sql import (
    LEASE_INDEXES,
    QUEUED_ENDED_CHECK,
    QUEUED_INDEX,
    QUEUED_STATUS_CHECK,
    SINGLE_FLIGHT,
    pending_statements,
)
from trioserve.stores.sql_approvals import (
    APPROVALS_TABLE,
    WAITING_ENDED_CHECK,
    WAITING_SINGLE_FLIGHT,
    WAITING_STATUS_CHECK,
)
from trioserve.stores.sql_crons import CRONS_TABLES
from trioserve.stores.sql_keys import KEYS_TABLE
from trioserve.stores.sql_outbox import OUTBOX_TABLE

__all__ = ["PG_SCHEMA_VERSION", "Conn", "PgTarget", "configure", "migrate", "parse_url"]

Conn: TypeAlias = psycopg.Connection[tuple[Any, ...]]

#: ``_MIGRATIONS[n]`` takes a database from schema version ``n`` to ``n + 1``.
#: Never edit a released step; append a new one.
_MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    (
        """
        CREATE TABLE sessions (
            id             text PRIMARY KEY,
            agent_name     text NOT NULL,
            runtime_type   text NOT NULL,
            status         text NOT NULL
                           CHECK (status IN ('active', 'ended', 'paused', 'expired', 'failed')),
            created_at     bigint NOT NULL,  -- microseconds since 1970-01-01T00:00Z
            last_active_at bigint NOT NULL,
            spec           text NOT NULL,    -- JSON object
            inputs         text NOT NULL,    -- JSON object
            adapter_state  text,
            last_seq       bigint NOT NULL DEFAULT 0,
            ended_at       bigint,           -- NULL while not terminal
            tenant         text
        )
        """,
        "CREATE INDEX sessions_by_last_active ON sessions (last_active_at, id)",
        "CREATE INDEX sessions_by_status ON sessions (status, last_active_at, id)",
        "CREATE INDEX sessions_by_agent ON sessions (agent_name, last_active_at, id)",
        "CREATE INDEX sessions_by_tenant ON sessions (tenant, last_active_at, id)",
        "CREATE INDEX sessions_to_purge ON sessions (ended_at) WHERE ended_at IS NOT NULL",
        """
        CREATE FUNCTION sessions_expired_is_final() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'session is expired'; END $$
        """,
        """
        CREATE TRIGGER sessions_expired_is_final
        BEFORE UPDATE OF status ON sessions FOR EACH ROW
        WHEN (OLD.status = 'expired' AND NEW.status <> 'expired')
        EXECUTE FUNCTION sessions_expired_is_final()
        """,
        """
        CREATE TABLE turns (
            id             text PRIMARY KEY,
            session_id     text NOT NULL,
            input          text NOT NULL,
            status         text NOT NULL CHECK (status IN
                               ('running', 'completed', 'failed', 'cancelled', 'interrupted')),
            reason         text,
            created_at     bigint NOT NULL,
            started_at     bigint,
            ended_at       bigint,           -- NULL exactly while running
            first_seq      bigint,
            last_seq       bigint,
            events_dropped boolean NOT NULL DEFAULT false,
            CHECK ((status = 'running') = (ended_at IS NULL))
        )
        """,
        "CREATE INDEX turns_by_session ON turns (session_id, created_at, id)",
        "CREATE INDEX turns_running ON turns (created_at, id) WHERE status = 'running'",
        "CREATE INDEX turns_to_drop ON turns (ended_at) WHERE NOT events_dropped",
        """
        CREATE TABLE events (
            session_id text NOT NULL,
            seq        bigint NOT NULL,
            turn_id    text NOT NULL,
            type       text NOT NULL,
            raw        bytea NOT NULL,  -- the JSON as sent
            PRIMARY KEY (session_id, seq)
        )
        """,
        "CREATE INDEX events_by_turn ON events (turn_id, seq)",
    ),
    (
        # Single flight in the store and leases, as the SQLite store's 4 -> 5.
        *SINGLE_FLIGHT,
        "ALTER TABLE turns ADD COLUMN owner text",
        "ALTER TABLE turns ADD COLUMN lease_expires_at bigint",  # microseconds
        *LEASE_INDEXES,
    ),
    (
        # Cancel requests across processes (``stores.pg_cancel``).
        "ALTER TABLE turns ADD COLUMN cancel_requested boolean NOT NULL DEFAULT false",
    ),
    (
        # Idempotency keys (``stores.sql_keys``).
        *KEYS_TABLE,
    ),
    (
        # Queued turns (``stores.turn_queue``): a status of their own, no ``ended_at``.
        "ALTER TABLE turns DROP CONSTRAINT turns_status_check",
        "ALTER TABLE turns DROP CONSTRAINT turns_check",
        f"ALTER TABLE turns ADD CONSTRAINT turns_status_check CHECK {QUEUED_STATUS_CHECK}",
        f"ALTER TABLE turns ADD CONSTRAINT turns_check CHECK {QUEUED_ENDED_CHECK}",
        QUEUED_INDEX,
    ),
    (
        # A turn's input (the client's) and reason (the adapter's) hold any string, NUL
        # included, which text cannot: UTF-8 bytes (``stores.codec``), as SQLite keeps them.
        "ALTER TABLE turns ALTER COLUMN input TYPE bytea USING convert_to(input, 'UTF8')",
        "ALTER TABLE turns ALTER COLUMN reason TYPE bytea USING convert_to(reason, 'UTF8')",
    ),
    (
        # Crons and their runs (``stores.sql_crons``).
        *CRONS_TABLES,
    ),
    (
        # The webhook outbox (``stores.sql_outbox``).
        *OUTBOX_TABLE,
    ),
    (
        # Approvals (``stores.sql_approvals``): a turn may wait for one, a status of
        # its own without ``ended_at``.
        "ALTER TABLE turns DROP CONSTRAINT turns_status_check",
        "ALTER TABLE turns DROP CONSTRAINT turns_check",
        f"ALTER TABLE turns ADD CONSTRAINT turns_status_check CHECK {WAITING_STATUS_CHECK}",
        f"ALTER TABLE turns ADD CONSTRAINT turns_check CHECK {WAITING_ENDED_CHECK}",
        "DROP INDEX turns_one_running",  # single flight: a waiting turn holds it too
        WAITING_SINGLE_FLIGHT,
        *APPROVALS_TABLE,
    ),
)

#: The schema version this code writes.
PG_SCHEMA_VERSION: Final = len(_MIGRATIONS)

_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


class PgTarget:
    """Where a PostgreSQL store lives: libpq conninfo, schema, and a password-free description."""

    def __init__(self, conninfo: str, schema: str | None, description: str) -> None:
        self.conninfo = conninfo
        self.schema = schema
        self.description = description

    @property
    def channel(self) -> str:
        """The ``NOTIFY`` channel of appends to this store's logs."""
        return f"trioserve_appended:{self.schema or 'default'}"


def parse_url(url: str) -> PgTarget:
    """Split a store URL into libpq conninfo and the ``schema`` parameter (``ValueError``)."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError(f"bad store URL {url!r}: not postgresql://")
    query = parse_qsl(parts.query, keep_blank_values=True)
    schemas = [value for key, value in query if key == "schema"]
    rest = [(key, value) for key, value in query if key != "schema"]
    schema = schemas[-1] if schemas else None
    if schema is not None and not _IDENTIFIER.fullmatch(schema):
        raise ValueError(
            f"bad store URL: schema {schema!r} must be letters, digits and '_' (at most 63)"
        )
    conninfo = urlunsplit(parts._replace(query=urlencode(rest)))
    try:
        info = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as exc:
        raise ValueError(f"bad store URL: {exc}") from None
    where = f"{info.get('host', '')}:{info.get('port', 5432)}/{info.get('dbname', '')}"
    user = f"{info['user']}@" if info.get("user") else ""
    suffix = f"?schema={schema}" if schema else ""
    return PgTarget(conninfo, schema, f"postgresql://{user}{where}{suffix}")


#: A connection of the store idle inside a transaction this long is ended by the
#: server, its locks released: a process frozen mid-transaction (stopped, paused,
#: cut off) must not hold a session's row from the others for longer.  The
#: store's transactions take milliseconds.
IDLE_IN_TRANSACTION_SECONDS: Final = 5


def configure(conn: Conn, target: PgTarget) -> None:
    """Point a new connection at the store's schema, and bound how long it may sit idle
    in a transaction (a pool's ``configure`` callback)."""
    conn.execute(
        sql.SQL("SET idle_in_transaction_session_timeout = {}").format(
            sql.Literal(f"{IDLE_IN_TRANSACTION_SECONDS}s")
        )
    )
    if target.schema is not None:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(target.schema)))


def migrate(conn: Conn, target: PgTarget) -> None:
    """Create the schema if needed and run the pending migrations, in one transaction."""
    with conn.transaction():
        lock = f"trioserve_migrate:{target.schema or ''}"
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (lock,))
        if target.schema is not None:
            name = sql.Identifier(target.schema)
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(name))
            conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(name))
        conn.execute("CREATE TABLE IF NOT EXISTS trioserve_schema (version integer NOT NULL)")
        row = conn.execute("SELECT version FROM trioserve_schema").fetchone()
        version = 0 if row is None else int(row[0])
        for statement in pending_statements(version, _MIGRATIONS, target.description):
            conn.execute(statement)
        if row is None:
            conn.execute("INSERT INTO trioserve_schema VALUES (%s)", (PG_SCHEMA_VERSION,))
        elif version != PG_SCHEMA_VERSION:
            conn.execute("UPDATE trioserve_schema SET version = %s", (PG_SCHEMA_VERSION,))
