"""``trioserve sessions``: a page of a running server's sessions as a table."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from functools import partial
from typing import Final

import trio

from trioserve.cli._options import EXIT_FAILURE, EXIT_USAGE
from trioserve.client import BadRequestError, Client, Session, TrioserveClientError
from trioserve.client.http import check_base_url

COLUMNS: Final = ("ID", "AGENT", "RUNTIME", "STATUS", "CREATED", "LAST ACTIVE")


def sessions_main(args: argparse.Namespace) -> int:
    """``trioserve sessions URL [--status S] [--limit N] [--before TOKEN]``."""
    check_base_url(args.url)
    return trio.run(
        partial(list_sessions, args.url, args.status, args.limit, args.before, args.api_key)
    )


async def list_sessions(
    url: str,
    status: str | None,
    limit: int | None,
    before: str | None = None,
    api_key: str | None = None,
) -> int:
    """Print a page of sessions as a table, the command for the next on stderr; the exit status."""
    try:
        async with Client(url, api_key=api_key) as client:
            page = await client.sessions_page(status=status, limit=limit, before=before)
    except BadRequestError as exc:
        print(f"trioserve: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    except TrioserveClientError as exc:
        print(f"trioserve: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    print(format_table(COLUMNS, (_row(s) for s in page.sessions)), end="")
    if page.next_page is not None:
        command = ["trioserve", "sessions", url, *(["--status", status] if status else [])]
        command += ["--limit", str(limit), "--before", page.next_page]
        print(f"next page: {shlex.join(command)}", file=sys.stderr)
    return 0


def _row(session: Session) -> tuple[str, ...]:
    return (
        session.id,
        session.agent_name,
        session.runtime_type,
        session.status,
        _time(session.created_at),
        _time(session.last_active_at),
    )


def _time(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def format_table(header: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> str:
    """Left-aligned columns two spaces apart, one line each, header first."""
    lines = [header, *rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        + "\n"
        for line in lines
    )
