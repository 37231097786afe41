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
import resource
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import trio

from . import __version__
from .config import Limits, ServerConfig, parse_duration, parse_size
from .errors import SpecError, StoreError
from .runtimes import RuntimeResolutionError, command_problem, resolve_command, split_command

T = TypeVar("T")
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _typed(parse: Callable[[str], T], what: str) -> Callable[[str], T]:
    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = what
    return convert


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"must be 0 or more, got {value}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError(f"port must be 0..65535, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trioserve", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"trioserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="serve an agent spec over HTTP")
    run.add_argument("spec", type=Path, help="the ADL agent spec (YAML)")
    run.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    run.add_argument("--port", type=_typed(_port, "port"), default=8080, help="default 8080")
    store = run.add_mutually_exclusive_group()
    store.add_argument(
        "--store",
        default="",
        metavar="URL",
        help="memory | sqlite:PATH (default: sqlite at $XDG_DATA_HOME/trioserve/sessions.db)",
    )
    store.add_argument("--in-memory", action="store_true", help="alias for --store memory")
    run.add_argument("--registry", type=Path, default=None, metavar="DIR", help="default: cwd")
    run.add_argument(
        "--runtime-command",
        default=None,
        metavar="'CMD ARGS'",
        help="adapter command overriding the spec's runtime (env TRIOSERVE_RUNTIME_COMMAND)",
    )
    count = _typed(_non_negative_int, "count")
    duration = _typed(parse_duration, "duration")
    run.add_argument("--max-concurrent-turns", type=count, default=8, help="0 = unlimited")
    run.add_argument("--max-sessions", type=count, default=1000, help="0 = unlimited")
    run.add_argument("--session-ttl", type=duration, default=parse_duration("168h"))
    run.add_argument("--shutdown-grace", type=duration, default=parse_duration("25s"))
    run.add_argument("--adapter-stop-grace", type=duration, default=parse_duration("5s"))
    run.add_argument("--max-event-bytes", type=_typed(parse_size, "size"), default=8 << 20)
    run.add_argument(
        "--turn-timeout", type=duration, default=parse_duration("30m"), help="0 = no limit"
    )
    run.add_argument(
        "--heartbeat", type=duration, default=parse_duration("15s"), help="SSE keep-alive; 0 = off"
    )
    run.add_argument(
        "--on-disconnect",
        choices=["cancel", "continue"],
        default="cancel",
        help="what a turn does when its client leaves (default cancel)",
    )
    run.add_argument(
        "--event-retention",
        type=duration,
        default=parse_duration("7d"),
        help="keep logged events of ended turns this long; 0 = forever",
    )
    run.add_argument(
        "--warm-adapters",
        type=count,
        default=1,
        help="adapter processes started ahead of turns (default 1; 0 = off)",
    )
    run.add_argument(
        "--warm-max-idle",
        type=duration,
        default=parse_duration("10m"),
        help="replace a warm adapter idle this long (default 10m; 0 = never)",
    )
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])

    for name, text in (
        ("validate", "check a spec against the ADL schema"),
        ("compile", "print the CompiledSpec JSON"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("spec", type=Path)
        if name == "compile":
            cmd.add_argument("--registry", type=Path, default=None, metavar="DIR")

    chat = sub.add_parser("chat", help="talk to a running server: each input line is a turn")
    chat.add_argument("url", help="the server, e.g. http://127.0.0.1:8080")
    chat.add_argument("--session", metavar="ID", default=None, help="reuse a session")
    chat.add_argument("--transport", choices=["sse", "websocket"], default="sse")
    chat.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a value for ${inputs.KEY} in a new session's task (repeatable)",
    )
    sessions = sub.add_parser("sessions", help="list a running server's sessions")
    sessions.add_argument("url", help="the server, e.g. http://127.0.0.1:8080")
    sessions.add_argument("--status", default=None, metavar="S", help="only sessions in status S")
    sessions.add_argument("--limit", type=int, default=None, metavar="N")
    return parser


def _fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    print(f"trioserve: {message}", file=sys.stderr)
    raise SystemExit(code)


def _cmd_validate(args: argparse.Namespace) -> int:
    from .spec import load_document

    doc = load_document(args.spec)
    name = doc.metadata.name
    print(f"{args.spec}: valid {doc.kind} {name!r}")
    return 0


def _compile(spec_path: Path, registry: Path | None) -> dict[str, Any]:
    from .compiler import compile_agent
    from .spec import load_agent

    doc = load_agent(spec_path)
    compiled = compile_agent(doc, registry_dir=registry or Path.cwd())
    return compiled.to_json_dict()


def _cmd_compile(args: argparse.Namespace) -> int:
    print(json.dumps(_compile(args.spec, args.registry), indent=2))
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


def _cmd_run(args: argparse.Namespace) -> int:
    from .server import run_until_signalled

    raise_open_file_limit()
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("hypercorn.error").setLevel(logging.WARNING)
    spec = _compile(args.spec, args.registry)
    override = split_command(args.runtime_command) if args.runtime_command else None
    runtime = spec["runtime"]
    command = resolve_command(runtime["type"], runtime.get("command"), override=override)
    if problem := command_problem(command):
        logging.getLogger("trioserve").warning("%s; turns will fail until it is fixed", problem)
    config = ServerConfig(
        spec_path=args.spec,
        registry_dir=args.registry or Path.cwd(),
        host=args.host,
        port=args.port,
        store="memory" if args.in_memory else args.store,
        runtime_command=tuple(override) if override else None,
        shutdown_grace=args.shutdown_grace,
        limits=Limits(
            max_concurrent_turns=args.max_concurrent_turns,
            max_sessions=args.max_sessions,
            session_ttl=args.session_ttl,
            adapter_stop_grace=args.adapter_stop_grace,
            max_event_bytes=args.max_event_bytes,
            turn_timeout=args.turn_timeout,
            event_retention=args.event_retention,
            on_disconnect=args.on_disconnect,
            warm_adapters=args.warm_adapters,
            warm_max_idle=args.warm_max_idle,
        ),
        heartbeat=args.heartbeat,
    )
    try:
        try:
            trio.run(run_until_signalled, config, spec, command)
        except BaseExceptionGroup as group:
            raise _only_leaf(group) from None
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
    from .chat import chat_main

    return chat_main(args)


def _cmd_sessions(args: argparse.Namespace) -> int:
    from .chat import sessions_main

    return sessions_main(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handlers = {
        "run": _cmd_run,
        "validate": _cmd_validate,
        "compile": _cmd_compile,
        "chat": _cmd_chat,
        "sessions": _cmd_sessions,
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
