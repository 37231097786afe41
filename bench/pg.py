"""PostgreSQL for the scenarios that need it (``postgres`` extra): a fresh schema per
server, and what its backends cost (CPU, round trips)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Iterator

from bench.procinfo import Meter

PG_URL = os.environ.get("TRIOSERVE_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
_SEGS = re.compile(r"\bdata_segs_(out|in):(\d+)")


@contextlib.contextmanager
def pg_store(name: str) -> Iterator[tuple[str, str]]:
    """A store URL on a fresh schema, and the schema's name; the schema is dropped afterwards.

    The name (``$TRIOSERVE_BENCH_PG_PREFIX``, default ``bench``, then ``_NAME_HEX``) is
    also the connections' ``application_name``: ``pg_backends`` finds them by it.
    """
    import psycopg  # the 'postgres' extra: only scenarios m and n need it

    prefix = os.environ.get("TRIOSERVE_BENCH_PG_PREFIX", "bench")
    schema = f"{prefix}_{name}_{os.urandom(4).hex()}"
    try:
        yield f"{PG_URL}?schema={schema}&application_name={schema}", schema
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def pg_backends(app: str) -> dict[int, int]:
    """The PostgreSQL backends of connections named ``app``: pid -> the client's port."""
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid, client_port FROM pg_stat_activity WHERE application_name = %s", (app,)
        ).fetchall()
    return {int(pid): int(port) for pid, port in rows}


def pg_segments(app: str) -> dict[str, int]:
    """TCP data segments the backends of ``app`` sent (``out``) and received (``in``), per ss -ti.

    On loopback a backend's response to one statement (or BEGIN, COMMIT) is one segment:
    ``out`` counts round trips (and NOTIFYs to a listener); a request may take two.
    """
    ports = set(pg_backends(app).values())
    cmd = ["ss", "-tinH", "state", "established", "( sport = :5432 )"]
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    total = {"out": 0, "in": 0}
    peer = 0
    for line in text.splitlines():
        if not line[:1].isspace():  # a socket's line; its details follow, indented
            peer = int(line.split()[-1].rpartition(":")[2])
        elif peer in ports:
            for kind, n in _SEGS.findall(line):
                total[kind] += int(n)
    return total


def pg_meter(app: str) -> Meter:
    """The CPU of the PostgreSQL backends whose connections are named ``app``."""
    return Meter(lambda: list(pg_backends(app)))
