"""``trioserve``: run, validate and compile agent specs; chat with a running server.

Every failure the user can fix (a bad spec, a bad flag, a port in use) is
one line on stderr and a non-zero exit (2 for usage and spec errors), never
a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import resource
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeVar

import trio

from trioserve import __version__
from trioserve.config import ServerConfig
from trioserve.errors import SpecError, StoreError
from trioserve.http._auth import TENANT_RULE, KeyFileError, KeyRing, load_keys, new_key
from trioserve.http._browser import default_hosts, parse_hosts, parse_origins
from trioserve.observe import _logformat as logformat
from trioserve.observe import _tracing as tracing
from trioserve.sessions._limits import Limits
from trioserve.spec._runtimes import (
    OVERRIDE_ENV,
    RuntimeResolutionError,
    command_problem,
    resolve_command,
    split_command,
)
from trioserve.units import (
    format_duration,
    format_size,
    is_loopback,
    parse_bind,
    parse_duration,
    parse_size,
)

if TYPE_CHECKING:
    from trioserve.spec._compiler import CompiledSpec

T = TypeVar("T")
EXIT_USAGE = 2


class _HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, written as on the command line.

    The default shown is the option's own (``default=``, read from the
    settings model), displayed by its value type (``_Value.show``), so it is
    said in one place.  A help text that says its default itself, as
    ``(default: ...)``, is left as it is (for defaults that are not a value,
    such as "from the spec").
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if not action.option_strings or action.default is argparse.SUPPRESS or "(default" in text:
            return text
        shown = _show_default(action).replace("%", "%%")
        return f"{text} (default: {shown})" if text else f"default: {shown}"


def _show_default(action: argparse.Action) -> str:
    value = action.default
    if action.nargs == 0:  # a switch
        return "on" if value else "off"
    if value is None or value == []:
        return "none"
    if isinstance(action.type, _Value):
        return action.type.show(value)
    return str(value)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors, help that shows defaults, and negative values.

    An option value that starts with ``-`` and a digit (``--session-ttl -5s``)
    is read as the option's value, so its type can refuse it by name, instead
    of argparse taking it for an unknown option (what Python 3.13 does too).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\.?[0-9]")

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


@dataclass(frozen=True)
class _Value(Generic[T]):
    """An option's value type: parses the command line, shows a default as one would write it."""

    parse: Callable[[str], T]
    name: str
    show: Callable[[T], str] = str

    def __call__(self, text: str) -> T:
        try:
            return self.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None


def _defaults(model: type[Any]) -> dict[str, Any]:
    """The plain defaults of a settings dataclass, by field name."""
    return {f.name: f.default for f in fields(model) if f.default is not MISSING}


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise ValueError(f"must be 0 or more, got {value}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise ValueError(f"port must be 0..65535, got {value}")
    return value


def _positive_duration(text: str) -> float:
    value = parse_duration(text)
    if value <= 0:
        raise ValueError(f"must be more than 0, got {text!r}")
    return value


def _max_connections(text: str) -> int | None:
    if text.strip().lower() == "auto":
        return None
    try:
        return _non_negative_int(text)
    except ValueError:
        raise ValueError(f"expected a whole number or auto, got {text!r}") from None


def _workers(text: str) -> int:
    """``--workers``: a count >= 1, or ``auto`` (the CPUs this process may use)."""
    if text.strip().lower() == "auto":
        return max(1, len(os.sched_getaffinity(0)))
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected a number of processes or auto, got {text!r}") from None
    if value < 1:
        raise ValueError(f"must be 1 or more, got {value}")
    return value


def _command(text: str) -> list[str]:
    if not text.strip():
        raise ValueError("empty command: give the adapter's program and its arguments")
    return split_command(text)


COUNT = _Value(_non_negative_int, "count")
PORT = _Value(_port, "port")
DURATION = _Value(parse_duration, "duration", format_duration)
SIZE = _Value(parse_size, "size", format_size)
COMMAND = _Value(_command, "command", shlex.join)
HOSTS = _Value(parse_hosts, "hosts")
ORIGINS = _Value(parse_origins, "origins")


class _Extend(argparse.Action):
    """A repeatable option whose values (tuples, from a comma list each) add up."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, (*getattr(namespace, self.dest, ()), *values))


POSITIVE_DURATION = _Value(_positive_duration, "duration", format_duration)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trioserve", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"trioserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_run(sub.add_parser("run", help="serve an agent spec over HTTP"))

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
        help="make API keys for run --api-keys",
        description="Make API keys. The server's key file holds only each key's SHA-256.",
    )
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, parser_class=_Parser)
    new = keys_sub.add_parser(
        "new",
        help="print a new key (line 1, for the client) and its key file line (line 2)",
        description="Print a new random key for TENANT on the first line (give it to the"
        " client) and the line for the --api-keys file on the second.",
    )
    new.add_argument("tenant", help=f"who the key is for: {TENANT_RULE}")
    return parser


def _add_run(run: argparse.ArgumentParser) -> None:
    """``trioserve run``'s arguments; every default comes from the settings model."""
    server = _defaults(ServerConfig)
    limits = _defaults(Limits)
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
        action=_Extend,
        default=server["allowed_hosts"],
        metavar="HOST[,HOST...]",
        help="the Host header values answered (any port unless HOST:PORT; * = any); others"
        " get 421; repeatable (default: the --host address, and for loopback or all"
        " interfaces also localhost, 127.0.0.1, [::1])",
    )
    run.add_argument(
        "--cors-origins",
        type=ORIGINS,
        action=_Extend,
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
        choices=["cancel", "continue"],
        default=limits["on_disconnect"],
        help="what a turn does when its client leaves; a turn's onDisconnect overrides it",
    )
    run.add_argument(
        "--adapter-stderr",
        choices=["client", "log"],
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
        " its last response, or its request head still incomplete",
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
        "--max-connections",
        type=_Value(_max_connections, "count"),
        default=server["max_connections"],
        metavar="N",
        help="connections open at once; one more is answered 503 and closed; 0 = no cap"
        " (default: auto, what RLIMIT_NOFILE leaves after adapters' descriptors)",
    )
    run.add_argument(
        "--workers",
        type=_Value(_workers, "count"),
        default=server["workers"],
        metavar="N",
        help="server processes on the port (SO_REUSEPORT) under one supervisor that restarts"
        " one that dies; auto = one per CPU; more than 1 needs --store postgresql://...,"
        " which they share",
    )
    run.add_argument(
        "--require-inputs",
        action="store_true",
        default=limits["require_inputs"],
        help="refuse (400) a new session whose inputs leave a ${inputs.NAME} of the task"
        " without a value; off, the placeholder stays as written and a warning is logged",
    )
    run.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="the least severe messages logged on stderr",
    )
    run.add_argument(
        "--metrics-bind",
        type=_Value(parse_bind, "address", lambda bind: f"{bind[0]}:{bind[1]}"),
        default=server["metrics_bind"],
        metavar="HOST:PORT",
        help="also serve GET /metrics on this address, without API keys, for a private"
        " network's Prometheus (default: off; /metrics is on the API port, behind the keys)",
    )
    run.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="how log lines are written on stderr: text (time level logger: message) or json"
        " (one object per line: time, level, logger, message and each line's fields)",
    )


def _fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    print(f"trioserve: {message}", file=sys.stderr)
    raise SystemExit(code)


def _cmd_validate(args: argparse.Namespace) -> int:
    from trioserve.spec._compiler import check_agent
    from trioserve.spec._documents import AgentDocument, load_document

    doc = load_document(args.spec)
    unresolved = []
    if isinstance(doc, AgentDocument):
        unresolved = check_agent(doc, registry_dir=args.registry)
    print(f"{args.spec}: valid {doc.kind} {doc.metadata.name!r}")
    if unresolved:
        count = len(unresolved)
        print(
            f"{args.spec}: {count} registry reference{'s' if count != 1 else ''} not resolved"
            " (give --registry DIR to check them as compile and run do)"
        )
    return 0


def _compile(spec_path: Path, registry: Path | None) -> CompiledSpec:
    from trioserve.spec._compiler import compile_agent
    from trioserve.spec._documents import load_agent

    return compile_agent(load_agent(spec_path), registry_dir=registry or Path.cwd())


def _cmd_compile(args: argparse.Namespace) -> int:
    print(json.dumps(_compile(args.spec, args.registry).to_json_dict(), indent=2))
    return 0


def raise_open_file_limit() -> None:
    """Lift the soft RLIMIT_NOFILE to the hard limit, as Go programs do.

    Each running turn holds four descriptors (three pipes and a pidfd); the
    common soft limit of 1024 would refuse adapters long before the caps.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _keys(args: argparse.Namespace) -> KeyRing | None:
    """The API keys ``run`` serves with; refuse a non-loopback bind without them."""
    if args.api_keys and args.insecure_no_auth:
        _fail("--insecure-no-auth and --api-keys (or TRIOSERVE_API_KEYS_FILE) exclude each other")
    if args.api_keys:
        try:
            return load_keys(args.api_keys)
        except KeyFileError as exc:
            _fail(str(exc))
    if not is_loopback(args.host) and not args.insecure_no_auth:
        _fail(
            f"refusing to serve on {args.host or 'all interfaces'} without API keys: anyone "
            "who can reach it could run the agent's tools; give --api-keys FILE, or "
            "--insecure-no-auth to serve without authentication"
        )
    return None


def _check_workers(args: argparse.Namespace) -> None:
    """``--workers`` > 1 needs a store the processes share, and one ``/metrics`` view."""
    if args.workers == 1:
        return
    store = "memory" if args.in_memory else args.store or "sqlite"
    if not store.startswith(("postgresql://", "postgres://")):
        _fail(
            f"--workers {args.workers} needs a PostgreSQL store (--store postgresql://...):"
            f" the workers share sessions, turns and caps through it, and {store!r} is"
            " one process's"
        )
    if args.metrics_bind is not None:
        _fail(f"--metrics-bind is not supported with --workers {args.workers} yet")


def _cmd_run(args: argparse.Namespace) -> int:
    from trioserve.server import run_until_signalled
    from trioserve.supervisor import run_worker, supervise, worker_link

    keys = _keys(args)
    link = worker_link()
    if link is None:
        _check_workers(args)
    raise_open_file_limit()
    logformat.configure(args.log_level, args.log_format)
    logging.getLogger("hypercorn.error").setLevel(logging.WARNING)
    if args.warm_adapters_max is not None and args.warm_adapters_max < args.warm_adapters:
        _Parser(prog="trioserve run").error(
            f"argument --warm-adapters-max: {args.warm_adapters_max} is less than"
            f" --warm-adapters {args.warm_adapters}"
        )
    if args.insecure_no_auth:
        logging.getLogger("trioserve").warning(
            "--insecure-no-auth: serving on %s without authentication", args.host
        )
    if not is_loopback(args.host) and not args.allowed_hosts:
        logging.getLogger("trioserve").warning(
            "no --allowed-hosts: only requests with Host %s (any port) are answered, others"
            " get 421; list the names clients use",
            ", ".join(default_hosts(args.host)),
        )
    spec = _compile(args.spec, args.registry)
    override: list[str] | None = args.runtime_command
    command = resolve_command(spec.runtime.type, spec.runtime.command, override=override)
    if problem := command_problem(command):
        logging.getLogger("trioserve").warning("%s; turns will fail until it is fixed", problem)
    config = ServerConfig(
        host=args.host,
        port=args.port,
        store="memory" if args.in_memory else args.store,
        shutdown_grace=args.shutdown_grace,
        limits=Limits(
            max_concurrent_turns=args.max_concurrent_turns,
            max_sessions=args.max_sessions,
            session_ttl=args.session_ttl,
            adapter_stop_grace=args.adapter_stop_grace,
            max_event_bytes=args.max_event_bytes,
            turn_timeout=args.turn_timeout,
            event_retention=args.event_retention,
            session_retention=args.session_retention,
            on_disconnect=args.on_disconnect,
            warm_adapters=args.warm_adapters,
            warm_adapters_max=args.warm_adapters_max,
            warm_max_idle=args.warm_max_idle,
            adapter_stderr=args.adapter_stderr,
            max_sessions_per_tenant=args.max_sessions_per_tenant,
            max_turns_per_tenant=args.max_turns_per_tenant,
            require_inputs=args.require_inputs,
        ),
        heartbeat=args.heartbeat,
        keep_alive=args.keep_alive,
        write_timeout=args.write_timeout,
        max_connections=args.max_connections,
        keys=keys,
        allowed_hosts=args.allowed_hosts,
        cors_origins=args.cors_origins,
        metrics_bind=args.metrics_bind,
        workers=args.workers,
    )
    if link is not None:  # a worker of `--workers N`: the supervisor's port
        config = replace(config, port=link[1])
    elif args.workers > 1:
        try:
            return supervise(config, args.argv, args.workers)
        except OSError as exc:
            _fail(f"cannot serve on {args.host}:{args.port}: {exc.strerror or exc}", 1)
    stop_tracing = tracing.configure()
    try:
        try:
            if link is not None:
                trio.run(run_worker, config, spec, command, link[0])
            else:
                trio.run(run_until_signalled, config, spec, command)
        except BaseExceptionGroup as group:
            raise _only_leaf(group) from None
        finally:
            if stop_tracing is not None:
                stop_tracing()  # sends the spans still buffered
    except OSError as exc:
        _fail(f"cannot serve on {args.host}:{args.port}: {exc.strerror or exc}", 1)
    except StoreError as exc:
        _fail(f"cannot open the session store: {exc}", 1)
    return 0


def _only_leaf(exc: BaseException) -> BaseException:
    """The single real error inside nested one-member exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _cmd_chat(args: argparse.Namespace) -> int:
    from trioserve.chat import chat_main

    return chat_main(args)


def _cmd_keys(args: argparse.Namespace) -> int:
    key, line = new_key(args.tenant)  # a bad tenant name: ValueError, one line, exit 2
    print(key)
    print(line)
    return 0


def _cmd_sessions(args: argparse.Namespace) -> int:
    from trioserve.chat import sessions_main

    return sessions_main(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for the workers of --workers
    handlers = {
        "run": _cmd_run,
        "validate": _cmd_validate,
        "compile": _cmd_compile,
        "chat": _cmd_chat,
        "sessions": _cmd_sessions,
        "keys": _cmd_keys,
    }
    try:
        return handlers[args.command](args)
    except SpecError as exc:
        if args.command == "run":
            _fail(str(exc))  # one line, for service logs
        count = len(exc.problems)
        lines = [f"{exc.source}: {count} problem{'s' if count != 1 else ''}:"]
        lines += [f"  - {problem}" for problem in exc.problems]
        _fail("\n".join(lines))
    except (RuntimeResolutionError, StoreError, ValueError) as exc:
        _fail(str(exc))
    except BrokenPipeError:
        # `trioserve compile spec.yaml | head`: the reader left; not an error.
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
