"""What importing a package loads, in a fresh interpreter (the import contract at run time)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import trio

from tests.helpers import start_cli_server, write_spec


def loaded_after(statement: str) -> list[str]:
    """The module names in ``sys.modules`` after ``statement`` runs in a new interpreter."""
    code = f"{statement}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded: list[str] = json.loads(out.stdout)
    return loaded


def test_the_client_loads_no_server_code_no_store_and_no_web_server() -> None:
    loaded = loaded_after("import trioserve.client")
    # the checks below see what the import did
    assert {"trioserve.client.async_client", "trioserve.client.sync_client"} <= set(loaded)
    # No event loop of its own: trio is loaded only by a program that runs on it.
    forbidden: tuple[str, ...] = ("sqlite3", "psycopg", "quart", "quart_trio", "hypercorn")
    forbidden += ("yaml", "trio", "trio_websocket", "asyncio")
    assert [m for m in loaded if m.split(".")[0] in forbidden] == []
    # Of trioserve, only the package itself, the client and the protocol it shares.
    ours = [m for m in loaded if m == "trioserve" or m.startswith("trioserve.")]
    assert [m for m in ours if not m.startswith(("trioserve.client", "trioserve.protocol"))] == [
        "trioserve"
    ]


def test_the_command_line_loads_a_command_only_when_it_runs() -> None:
    loaded = loaded_after("from trioserve.cli import build_parser; build_parser()")
    assert "trioserve.cli._run_flags" in loaded
    heavy = ("httpx", "hypercorn", "quart", "quart_trio", "sqlite3", "psycopg", "yaml")
    assert [m for m in loaded if m.split(".")[0] in heavy] == []
    commands = ("run", "spec", "keys", "chat", "sessions", "terminal")
    not_yet = ["trioserve.client", "trioserve.server", *(f"trioserve.cli.{c}" for c in commands)]
    assert [m for m in loaded if m.startswith(tuple(not_yet))] == []


async def test_a_server_without_webhooks_never_loads_an_http_client(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # httpx (and what it pulls in) would cost every server start 40 ms and MiBs of memory.
    spec = write_spec(tmp_path, runtime="echo")
    flags = ("--in-memory", "--fork-server", "off")  # its adapters' imports: not in its log
    env = {"PYTHONPROFILEIMPORTTIME": "1"}  # each import, a line on stderr
    server = await start_cli_server(nursery, tmp_path, spec, *flags, env=env)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        sid = (await client.post("/v1/sessions")).json()["id"]
        turn = await client.post(f"/v1/sessions/{sid}/turns", json={"input": "hi"})
        assert "event: session.ended" in turn.text
    server.signal(signal.SIGTERM)
    assert await server.wait() == 0
    imported = [
        line.rpartition("|")[2].strip()
        for line in server.log.splitlines()
        if line.startswith("import time:")
    ]
    assert "trioserve.server" in imported  # the log is the one read
    assert [name for name in imported if name.split(".")[0] in ("httpx", "httpcore")] == []
