"""``trioserve run``: check the flags, compile the spec, and serve it (or supervise workers).

Every failure the user can fix (a bad flag, a port in use, a store that
cannot open) is one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import resource
from dataclasses import replace

import trio

from trioserve.cli._options import Parser, fail, from_flags
from trioserve.cli._webhook_flags import webhook_settings
from trioserve.cli.spec import compile_spec
from trioserve.config import ServerConfig
from trioserve.errors import StoreError
from trioserve.http import KeyFileError, KeyRing, default_hosts, load_keys
from trioserve.observe import logformat, tracing
from trioserve.runtime import ForkServerError
from trioserve.sessions import Limits
from trioserve.spec import command_problem, resolve_command
from trioserve.stores import missing_support
from trioserve.units import is_loopback


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
        fail("--insecure-no-auth and --api-keys (or TRIOSERVE_API_KEYS_FILE) exclude each other")
    if args.api_keys:
        try:
            return load_keys(args.api_keys)
        except KeyFileError as exc:
            fail(str(exc))
    if not is_loopback(args.host) and not args.insecure_no_auth:
        fail(
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
        fail(
            f"--workers {args.workers} needs a PostgreSQL store (--store postgresql://...):"
            f" the workers share sessions, turns and caps through it, and {store!r} is"
            " one process's"
        )
    if args.metrics_bind is not None:
        fail(f"--metrics-bind is not supported with --workers {args.workers} yet")


def run_main(args: argparse.Namespace) -> int:
    """``trioserve run SPEC [flags]``: serve until SIGINT/SIGTERM (or supervise ``--workers``)."""
    from trioserve.server import run_until_signalled
    from trioserve.supervisor import run_worker, supervise, worker_link

    keys = _keys(args)
    link = worker_link()
    if link is None:
        _check_workers(args)
    raise_open_file_limit()
    logformat.configure(args.log_level, args.log_format)
    logging.getLogger("hypercorn.error").setLevel(logging.WARNING)
    logging.getLogger("mcp").setLevel(logging.WARNING)  # the MCP face's SDK: a line per session
    if args.warm_adapters_max is not None and args.warm_adapters_max < args.warm_adapters:
        Parser(prog="trioserve run").error(
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
    spec = compile_spec(args.spec, args.registry)
    override: list[str] | None = args.runtime_command
    command = resolve_command(
        spec.runtime.type,
        spec.runtime.command,
        override=override,
        mcp_servers=bool(spec.mcp_servers),
        module=spec.runtime.module,
    )
    if problem := command_problem(command):
        logging.getLogger("trioserve").warning("%s; turns will fail until it is fixed", problem)
    config = server_config(args, keys)
    if link is not None:  # a worker of `--workers N`: the supervisor's port
        config = replace(config, port=link[1])
    elif args.workers > 1:
        missing = missing_support(config.store)
        if missing is not None:  # once here, not once per worker
            fail(f"cannot open the session store: {missing}", 1)
        try:
            return supervise(config, args.argv, args.workers)
        except OSError as exc:
            fail(f"cannot serve on {args.host}:{args.port}: {exc.strerror or exc}", 1)
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
        fail(f"cannot serve on {args.host}:{args.port}: {exc.strerror or exc}", 1)
    except StoreError as exc:
        fail(f"cannot open the session store: {exc}", 1)
    except ForkServerError as exc:
        fail(str(exc), 1)
    return 0


def server_config(args: argparse.Namespace, keys: KeyRing | None) -> ServerConfig:
    """The settings ``run``'s flags give: each flag's destination is its field's name."""
    return replace(
        from_flags(ServerConfig, args),
        store="memory" if args.in_memory else args.store,
        limits=replace(from_flags(Limits, args), webhooks=webhook_settings(args)),
        keys=keys,
    )


def _only_leaf(exc: BaseException) -> BaseException:
    """The single real error inside nested one-member exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
