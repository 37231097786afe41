"""The ``trioserve`` command line: one subcommand per command (``run``'s flags in ``_run_flags``).

Building the parser imports no command: each command's module is loaded
when it runs (``trioserve.cli.main``), so ``trioserve chat`` loads neither
the server nor hypercorn, and ``trioserve run`` not the client.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Final

from trioserve import __version__
from trioserve.cli._options import Parser
from trioserve.cli._run_flags import add_run_flags
from trioserve.http import TENANT_RULE

DESCRIPTION: Final = (
    "``trioserve``: run, validate and compile agent specs; chat with a running server."
)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every ``trioserve`` command (``run``'s flags are in ``_run_flags``)."""
    parser = Parser(prog="trioserve", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"trioserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    add_run_flags(sub.add_parser("run", help="serve an agent spec over HTTP"))

    validate = sub.add_parser(
        "validate",
        help="check a spec: the ADL schema, and with --registry what compile checks",
        description="Check a spec against the ADL schema and the adapter checks of its"
        " runtime; with --registry, also resolve its registry references as compile and"
        " run do. Every problem is listed; exit 2 if there is any.",
    )
    validate.add_argument("spec", type=Path, help="the ADL spec (YAML): an Agent or RuntimeBinding")
    validate.add_argument(
        "--registry",
        type=Path,
        default=None,
        metavar="DIR",
        help="resolve registry references against DIR"
        " (default: not resolved, and the output says so)",
    )
    compile_ = sub.add_parser(
        "compile",
        help="print the CompiledSpec JSON an adapter receives",
        description="Compile an Agent spec and print the CompiledSpec JSON its adapter"
        " receives on stdin.",
    )
    compile_.add_argument("spec", type=Path, help="the ADL Agent spec (YAML)")
    compile_.add_argument(
        "--registry",
        type=Path,
        default=None,
        metavar="DIR",
        help="where tools/, extensions/, skills/, subagents/ manifests are looked up"
        " (default: the working directory)",
    )

    url_help = "the server's base URL, e.g. http://127.0.0.1:8080"
    chat = sub.add_parser(
        "chat",
        help="talk to a running server: each input line is a turn",
        description="Each line of standard input is a turn; the reply streams to stdout."
        " A session this command creates is ended when it exits, unless --keep-session.",
    )
    chat.add_argument("url", help=url_help)
    chat.add_argument(
        "--session",
        metavar="ID",
        default=None,
        help="chat in this existing session (default: create a new one)",
    )
    chat.add_argument(
        "--transport",
        choices=["sse", "websocket"],
        default="sse",
        help="how turns are streamed",
    )
    chat.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a value for ${inputs.KEY} in a new session's task; repeatable (default: none given)",
    )
    chat.add_argument(
        "--multitask",
        choices=["enqueue", "interrupt", "reject"],
        default="enqueue",
        help="what a line typed while a reply streams does (a terminal's): enqueue (the"
        " server runs it next), interrupt (it cancels the reply and runs at once) or"
        " reject (refused: 409)",
    )
    chat.add_argument(
        "--keep-session",
        action="store_true",
        help="leave the session this command created active on exit, and print how to"
        " resume it (a session given with --session is never ended)",
    )
    sessions = sub.add_parser(
        "sessions",
        help="list a running server's sessions",
        description="Print a running server's sessions as a table, most recently active first.",
    )
    sessions.add_argument("url", help=url_help)
    sessions.add_argument(
        "--status",
        default=None,
        metavar="S",
        help="only sessions in status S: active, ended, expired or failed (default: all)",
    )
    sessions.add_argument(
        "--limit",
        type=int,
        default=None,
        metavar="N",
        help="at most N sessions, 1 to 10000; when there are more, the command for the next"
        " page is printed on stderr (default: no limit)",
    )
    sessions.add_argument(
        "--before",
        default=None,
        metavar="TOKEN",
        help="start after this page token (from the previous page) or session id"
        " (default: the most recently active session)",
    )
    for client_command in (chat, sessions):
        client_command.add_argument(
            "--api-key",
            default=os.environ.get("TRIOSERVE_API_KEY") or None,
            metavar="KEY",
            help="the server's API key, sent as 'Authorization: Bearer KEY'"
            " (default: $TRIOSERVE_API_KEY if set, else none)",
        )

    keys = sub.add_parser(
        "keys",
        help="make and check API keys for run --api-keys, and webhook secrets",
        description="Make API keys, and check a key file. The server's key file holds only"
        " each key's SHA-256.",
    )
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, parser_class=Parser)
    new = keys_sub.add_parser(
        "new",
        help="print a new key (line 1, for the client) and its key file line (line 2)",
        description="Print a new random key for TENANT on the first line (give it to the"
        " client) and the line for the --api-keys file on the second.",
    )
    new.add_argument("tenant", help=f"who the key is for: {TENANT_RULE}")
    new.add_argument(
        "--admin",
        action="store_true",
        help="give the key the admin scope: it may read the server-wide GET /metrics",
    )
    check = keys_sub.add_parser(
        "check",
        help="check a key file as run --api-keys and a SIGHUP reload read it",
        description="Read FILE as the server does (at start, and again on SIGHUP) and say how"
        " many keys of how many tenants it holds, or, exit 2, what is wrong (never a key).",
    )
    check.add_argument("file", type=Path, help="the key file")
    keys_sub.add_parser(
        "new-webhook-secret",
        help="print a new webhook signing secret (whsec_...) for run --webhook-secret-file",
        description="Print a new random Standard Webhooks secret (whsec_ and 32 random bytes"
        " in base64): put it in the file run --webhook-secret-file reads, and give it to the"
        " receivers, which verify each webhook's signature with it.",
    )
    return parser
