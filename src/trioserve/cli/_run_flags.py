"""``trioserve run``'s flags: every default is the settings model's (``ServerConfig``, ``Limits``).

The help of each flag ends with its default, shown by the formatter of
``_options`` from the ``default=`` given here; a flag whose default is not
a value (the spec's runtime, an environment variable) says it in its help.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from trioserve.cli._options import (
    AUTO_COUNT,
    BIND,
    COMMAND,
    COUNT,
    DURATION,
    HOSTS,
    ORIGINS,
    PORT,
    POSITIVE_DURATION,
    SIZE,
    WORKERS,
    Extend,
    choices,
    defaults,
)
from trioserve.cli._webhook_flags import add_webhook_flags
from trioserve.config import ServerConfig
from trioserve.observe import LogFormat
from trioserve.protocol import Multitask, OnDisconnect
from trioserve.sessions import AdapterStderr, ForkServerMode, Limits
from trioserve.spec import OVERRIDE_ENV


def add_run_flags(run: argparse.ArgumentParser) -> None:
    """``trioserve run``'s arguments; every default comes from the settings model."""
    server = defaults(ServerConfig)
    limits = defaults(Limits)
    run.add_argument("spec", type=Path, help="the ADL Agent spec (YAML)")
    run.add_argument(
        "--host",
        default=server["host"],
        help="address to bind; all interfaces (0.0.0.0, ::) only when asked",
    )
    run.add_argument(
        "--port",
        type=PORT,
        default=server["port"],
        metavar="N",
        help="port to listen on; 0 picks a free one",
    )
    store = run.add_mutually_exclusive_group()
    store.add_argument(
        "--store",
        default=server["store"],
        metavar="URL",
        help="where sessions are kept: memory, sqlite, sqlite:PATH or postgresql://..."
        " (the 'postgres' extra; ?schema=NAME picks the schema)"
        " (default: sqlite, the file $XDG_DATA_HOME/trioserve/sessions.db,"
        " else ~/.local/share/trioserve/sessions.db)",
    )
    store.add_argument("--in-memory", action="store_true", help="the same as --store memory")
    run.add_argument(
        "--registry",
        type=Path,
        default=None,
        metavar="DIR",
        help="where tools/, extensions/, skills/, subagents/ manifests are looked up"
        " (default: the working directory)",
    )
    run.add_argument(
        "--runtime-command",
        type=COMMAND,
        default=None,
        metavar="'CMD ARGS'",
        help="the adapter command for every turn, split as a shell would"
        f" (default: ${OVERRIDE_ENV} if set and not blank, else the spec's runtime)",
    )
    run.add_argument(
        "--max-concurrent-turns",
        type=COUNT,
        default=limits["max_concurrent_turns"],
        metavar="N",
        help="turns running at once, server-wide; more get 429; 0 = no cap",
    )
    run.add_argument(
        "--max-sessions",
        type=COUNT,
        default=limits["max_sessions"],
        metavar="N",
        help="active sessions; more creates get 429; 0 = no cap",
    )
    run.add_argument(
        "--api-keys",
        default=os.environ.get("TRIOSERVE_API_KEYS_FILE") or None,
        metavar="FILE",
        help="require 'Authorization: Bearer KEY' on every route but /healthz and /readyz;"
        " FILE has one 'sha256:<hex> TENANT' line per key (see 'trioserve keys new')"
        " (default: $TRIOSERVE_API_KEYS_FILE if set, else no keys)",
    )
    run.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="allow serving a non-loopback --host without API keys, which is otherwise refused",
    )
    run.add_argument(
        "--allowed-hosts",
        type=HOSTS,
        action=Extend,
        default=server["allowed_hosts"],
        metavar="HOST[,HOST...]",
        help="the Host header values answered (any port unless HOST:PORT; * = any); others"
        " get 421; repeatable (default: the --host address, and for loopback or all"
        " interfaces also localhost, 127.0.0.1, [::1])",
    )
    run.add_argument(
        "--cors-origins",
        type=ORIGINS,
        action=Extend,
        default=server["cors_origins"],
        metavar="ORIGIN[,ORIGIN...]",
        help="browser origins (https://app.example.com) allowed to call the API, with CORS;"
        " a request with another Origin gets 403; repeatable (default: no origin)",
    )
    run.add_argument(
        "--max-sessions-per-tenant",
        type=COUNT,
        default=limits["max_sessions_per_tenant"],
        metavar="N",
        help="active sessions per API key tenant; more creates get 429; 0 = no cap",
    )
    run.add_argument(
        "--max-turns-per-tenant",
        type=COUNT,
        default=limits["max_turns_per_tenant"],
        metavar="N",
        help="turns running at once per API key tenant; more get 429; 0 = no cap",
    )
    run.add_argument(
        "--session-ttl",
        type=DURATION,
        default=limits["session_ttl"],
        metavar="D",
        help="an active session idle this long becomes expired; 0 = never",
    )
    run.add_argument(
        "--shutdown-grace",
        type=DURATION,
        default=server["shutdown_grace"],
        metavar="D",
        help="how long in-flight turns may run on after SIGINT/SIGTERM",
    )
    run.add_argument(
        "--adapter-stop-grace",
        type=DURATION,
        default=limits["adapter_stop_grace"],
        metavar="D",
        help="from SIGINT to SIGKILL when stopping an adapter",
    )
    run.add_argument(
        "--max-event-bytes",
        type=SIZE,
        default=limits["max_event_bytes"],
        metavar="SIZE",
        help="longest adapter stdout line; a longer one is an error and stops the adapter",
    )
    run.add_argument(
        "--turn-timeout",
        type=DURATION,
        default=limits["turn_timeout"],
        metavar="D",
        help="a turn running longer is stopped; 0 = no limit",
    )
    run.add_argument(
        "--heartbeat",
        type=DURATION,
        default=server["heartbeat"],
        metavar="D",
        help="SSE keep-alive comment after this much silence, and the WebSocket ping"
        " interval; 0 = off",
    )
    run.add_argument(
        "--on-disconnect",
        choices=choices(OnDisconnect),
        default=limits["on_disconnect"],
        help="what a turn does when its client leaves; a turn's onDisconnect overrides it",
    )
    run.add_argument(
        "--multitask",
        choices=choices(Multitask),
        default=limits["multitask"],
        help="what a turn does when its session is busy: reject (409), enqueue (wait its"
        " turn) or interrupt (stop the running turn); a turn's multitask overrides it",
    )
    run.add_argument(
        "--max-queued-turns",
        type=COUNT,
        default=limits["max_queued_turns"],
        metavar="N",
        help="turns that may wait on one session (multitask enqueue); one more gets 429",
    )
    run.add_argument(
        "--max-crons-per-tenant",
        type=COUNT,
        default=limits["max_crons_per_tenant"],
        metavar="N",
        help="crons (POST /v1/crons) one tenant may hold, across processes sharing the store;"
        " one more gets 429; 0 = no cap",
    )
    run.add_argument(
        "--cron-misfire-grace",
        type=POSITIVE_DURATION,
        default=limits["cron_misfire_grace"],
        metavar="D",
        help="a cron's fire not claimed by any process within this long of its time was"
        " missed (no process was up): it follows the cron's catchUp (skip, or once)",
    )
    run.add_argument(
        "--adapter-stderr",
        choices=choices(AdapterStderr),
        default=limits["adapter_stderr"],
        help="where a crashed adapter's stderr tail goes: client (in the error event clients"
        " see, as agentctl does) or log (the server log only; clients get the exit status)",
    )
    run.add_argument(
        "--event-retention",
        type=DURATION,
        default=limits["event_retention"],
        metavar="D",
        help="logged events of turns that ended longer ago are dropped; 0 = keep forever",
    )
    run.add_argument(
        "--session-retention",
        type=DURATION,
        default=limits["session_retention"],
        metavar="D",
        help="ended, expired and failed sessions are deleted, with their turns and logs,"
        " this long after they ended; 0 = keep forever",
    )
    run.add_argument(
        "--warm-adapters",
        type=COUNT,
        default=limits["warm_adapters"],
        metavar="N",
        help="adapter processes started ahead of turns; 0 = off",
    )
    run.add_argument(
        "--warm-adapters-max",
        type=COUNT,
        default=limits["warm_adapters_max"],
        metavar="M",
        help="the warm pool may grow to M processes while turns come faster than an"
        " adapter loads, and shrinks back to --warm-adapters after --warm-max-idle"
        " (default: the --warm-adapters value, no growth)",
    )
    run.add_argument(
        "--fork-server",
        choices=choices(ForkServerMode),
        default=limits["fork_server"],
        help="auto: a Python adapter (echo, openai, a runtime.type python module) is"
        " imported once by a fork server and each turn gets a child forked from it (no warm"
        " pool; the default); off: each turn execs its adapter",
    )
    run.add_argument(
        "--warm-max-idle",
        type=DURATION,
        default=limits["warm_max_idle"],
        metavar="D",
        help="a warm adapter idle this long is replaced; 0 = never",
    )
    run.add_argument(
        "--keep-alive",
        type=POSITIVE_DURATION,
        default=server["keep_alive"],
        metavar="D",
        help="close a connection with no request in progress after this long: idle since"
        " its last response, or its request head still incomplete; set it above the idle"
        " timeout of the load balancer or proxy in front, so that it closes first",
    )
    run.add_argument(
        "--write-timeout",
        type=POSITIVE_DURATION,
        default=server["write_timeout"],
        metavar="D",
        help="close a connection whose client has taken none of its response for this long"
        " (it stopped reading); a turn it was streaming counts as its client leaving",
    )
    run.add_argument(
        "--max-body-bytes",
        type=SIZE,
        default=server["max_body_bytes"],
        metavar="SIZE",
        help="largest request body (413, and the connection is closed) and WebSocket message"
        " (close 1009)",
    )
    run.add_argument(
        "--max-connections",
        type=AUTO_COUNT,
        default=server["max_connections"],
        metavar="N",
        help="connections open at once; for one more, the connection idle longest is closed,"
        " or, with none idle, the new one is answered 503 and closed; 0 = no cap"
        " (default: auto, what RLIMIT_NOFILE leaves after adapters' descriptors)",
    )
    run.add_argument(
        "--max-connections-per-ip",
        type=COUNT,
        default=server["max_connections_per_ip"],
        metavar="N",
        help="connections open at once from one client address (an IPv6 address counts with"
        " its /64; loopback too); one more is answered 429 and closed; behind a proxy, every"
        " client has the proxy's address: raise it or 0 = no cap",
    )
    run.add_argument(
        "--max-streams-per-tenant",
        type=AUTO_COUNT,
        default=server["max_streams_per_tenant"],
        metavar="N",
        help="SSE streams and WebSockets one API key tenant holds open at once; one more gets"
        " 429; 0 = no cap (default: auto, half of --max-connections)",
    )
    run.add_argument(
        "--workers",
        type=WORKERS,
        default=server["workers"],
        metavar="N",
        help="server processes on the port (SO_REUSEPORT) under one supervisor that restarts"
        " one that dies; auto = one per CPU; more than 1 needs --store postgresql://...,"
        " which they share",
    )
    run.add_argument(
        "--turn-lease",
        type=POSITIVE_DURATION,
        default=limits["turn_lease"],
        metavar="D",
        help="with a PostgreSQL store: a running turn's lease, renewed by its process every"
        " third of it; when a process dies its turns are closed (interrupted) by the others"
        " once their lease has passed",
    )
    run.add_argument(
        "--idempotency-window",
        type=DURATION,
        default=limits["idempotency_window"],
        metavar="D",
        help="how long an Idempotency-Key is kept: a create or a turn sent again with the same"
        " key within it answers what the first did, without running anything; kept in the"
        " store, so it holds across restarts, workers and replicas; 0 = keys are ignored",
    )
    run.add_argument(
        "--require-approval",
        type=_globs,
        default=limits["require_approval"],
        metavar="GLOBS",
        help="tools that need a person's approval before they run, comma-separated names or"
        " globs (e.g. 'fs_*,shell'), for every session of the openai, exec and python"
        " runtimes, beside runtime.options.requireApproval and tool refs' config",
    )
    run.add_argument(
        "--approval-timeout",
        type=DURATION,
        default=limits["approval_timeout"],
        metavar="D",
        help="how long a tool call waits for a person's decision; then it is denied"
        " (reason expired) and the turn continues",
    )
    run.add_argument(
        "--require-inputs",
        action="store_true",
        default=limits["require_inputs"],
        help="refuse (400) a new session whose inputs leave a ${inputs.NAME} of the task"
        " without a value; off, the placeholder stays as written and a warning is logged",
    )
    run.add_argument(
        "--no-console",
        dest="console",
        action="store_false",
        default=server["console"],
        help="do not serve the web console at / (its page and /console/ files; the API"
        " is unchanged); see docs/console.md (default: served)",
    )
    run.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="the least severe messages logged on stderr",
    )
    run.add_argument(
        "--metrics-bind",
        type=BIND,
        default=server["metrics_bind"],
        metavar="HOST:PORT",
        help="also serve GET /metrics on this address, without API keys, for a private"
        " network's Prometheus (default: off; /metrics is on the API port, behind the keys)",
    )
    run.add_argument(
        "--no-mcp",
        dest="mcp",
        action="store_false",
        default=server["mcp"],
        help="do not serve the agent as an MCP tool at /mcp (docs/protocols.md) (default: served)",
    )
    run.add_argument(
        "--no-ag-ui",
        dest="ag_ui",
        action="store_false",
        default=server["ag_ui"],
        help="do not serve AG-UI runs at /ag-ui (docs/protocols.md) (default: served)",
    )
    run.add_argument(
        "--no-a2a",
        dest="a2a",
        action="store_false",
        default=server["a2a"],
        help="do not serve the agent over A2A (/a2a and /.well-known/agent-card.json;"
        " docs/protocols.md) (default: served)",
    )
    run.add_argument(
        "--log-format",
        default="text",
        choices=choices(LogFormat),
        help="how log lines are written on stderr: text (time level logger: message) or json"
        " (one object per line: time, level, logger, message and each line's fields)",
    )
    add_webhook_flags(run)


def _globs(text: str) -> tuple[str, ...]:
    """``--require-approval``'s value: comma-separated names or globs, none empty."""
    globs = tuple(part.strip() for part in text.split(","))
    if not text.strip() or not all(globs):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated tool names or globs (e.g. 'fs_*,shell'), got {text!r}"
        )
    return globs
