"""The server's life: open the store, run the manager and hypercorn, drain.

``serve`` runs until its stop trigger fires (a signal in ``trioserve run``,
an event in tests), then drains: new sessions and turns get 503 and
``/readyz`` says ``draining`` while in-flight turns get ``shutdown_grace`` to
finish; those still running are then cancelled and their adapters stopped;
hypercorn closes; the store is closed.  ``force`` (a second signal) skips
the wait and stops adapters with SIGKILL at once.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TextIO

import trio
from hypercorn.config import Config as HypercornConfig

from trioserve.config import ServerConfig
from trioserve.http import (
    auto_max_connections,
    create_app,
    default_hosts,
    hypercorn_fixes,
    key_reloader,
    metricsroute,
    open_file_limit,
    serve_http,
)
from trioserve.observe import tracing
from trioserve.runtime import AdapterLauncher, ForkServer, WarmPool, fork_target, run_adapter
from trioserve.runtime.forkserver import unsupported as fork_unsupported
from trioserve.runtime.reaper import Reaper
from trioserve.sessions import Crons, CronScheduler, Limits, SessionManager
from trioserve.spec import CompiledSpec
from trioserve.stores import open_store
from trioserve.units import format_duration

log = logging.getLogger("trioserve.server")

hypercorn_fixes.apply()

_CLOSE_GRACE = 1.0  # hypercorn's own grace once turns are done: flush and close
_FEW_CONNECTIONS = 16  # an automatic --max-connections under this is warned about
_METRICS_CONNECTIONS = 64  # open at once on --metrics-bind
#: Young collections come after this many allocations (less deallocations) of objects
#: the collector tracks; CPython's default is 700 (``settle_collector``).
GC_YOUNG = 10_000


@dataclass
class Stop:
    """How ``serve`` is asked to stop: ``drain`` first, ``force`` to hurry; and what a
    SIGHUP does (``reload``, set by ``serve``: the API keys are read again)."""

    drain: trio.Event
    force: trio.Event
    reload: Callable[[], None] | None = None

    @classmethod
    def new(cls) -> Stop:
        return cls(trio.Event(), trio.Event())


@dataclass(frozen=True)
class Running:
    """What ``serve`` reports once it listens."""

    url: str
    manager: SessionManager
    #: The ``--metrics-bind`` listener's URL, if there is one.
    metrics_url: str | None = None


def _hypercorn_config(config: ServerConfig) -> HypercornConfig:
    hc = HypercornConfig()
    host = f"[{config.host}]" if ":" in config.host else config.host
    hc.bind = [f"{host}:{config.port}"]
    hc.graceful_timeout = _CLOSE_GRACE
    hc.backlog = 2048
    hc.workers = config.workers  # more than 1: SO_REUSEPORT, the port shared with the others
    hc.accesslog = None
    hc.errorlog = logging.getLogger("hypercorn.error")
    hc.keep_alive_timeout = config.keep_alive  # also the deadline for a request head
    hc.h11_max_incomplete_size = 64 * 1024
    hc.websocket_max_message_size = config.max_body_bytes  # larger: close 1009
    hc.websocket_ping_interval = config.heartbeat or None
    return hc


async def serve(
    config: ServerConfig,
    spec: CompiledSpec,
    command: Sequence[str],
    *,
    stop: Stop,
    task_status: trio.TaskStatus[Running] = trio.TASK_STATUS_IGNORED,
    announce: TextIO | None = sys.stderr,
    launcher: AdapterLauncher | None = None,
) -> None:
    """Serve until ``stop`` fires; see the module doc.

    ``launcher`` runs the turns' adapters instead of ``run_adapter`` (tests
    play them in-process, ``runtime/_launcher.py``); a server given one starts
    no reaper, since it starts no adapter process.
    """
    store = await open_store(config.store or "sqlite")
    try:
        async with (
            Reaper() if launcher is None else contextlib.nullcontext() as reaper,
            SessionManager.open(
                store,
                spec,
                command,
                _limits(config),
                reaper,
                launcher or run_adapter,
                _fork_server(config, command, reaper) if launcher is None else None,
            ) as manager,
        ):
            max_connections = _max_connections(config)
            crons = Crons(manager)
            app = create_app(
                manager,
                max_body_bytes=config.max_body_bytes,
                heartbeat=config.heartbeat,
                keys=config.keys,
                allowed_hosts=config.allowed_hosts or default_hosts(config.host),
                cors_origins=config.cors_origins,
                max_streams_per_tenant=_max_streams(config, max_connections),
                console=config.console,
                mcp=config.mcp,
                ag_ui=config.ag_ui,
                a2a=config.a2a,
                crons=crons,
            )
            tracing.instrument(app)
            stop.reload = key_reloader(app)
            closed = trio.Event()
            async with trio.open_nursery() as nursery:
                binds = await nursery.start(
                    partial(
                        serve_http,
                        app,
                        _hypercorn_config(config),
                        max_connections,
                        max_per_address=config.max_connections_per_ip,
                        write_timeout=config.write_timeout,
                        shutdown_trigger=closed.wait,
                    )
                )
                url = str(binds[0])
                nursery.start_soon(CronScheduler(manager, crons).run)  # returns on drain
                metrics_url = None
                if config.metrics_bind is not None:
                    metrics_url = await _serve_metrics(nursery, config, manager, closed)
                load_line = trio.CancelScope()
                if announce is not None:
                    line = _startup_line(
                        url, spec, command, store.description, config, manager.forker is not None
                    )
                    print(line, file=announce)
                    if metrics_url is not None:
                        print(f"trioserve: metrics on {metrics_url}/metrics", file=announce)
                    announce.flush()
                    if manager.pool is not None:
                        nursery.start_soon(_announce_load_time, manager.pool, announce, load_line)
                task_status.started(Running(url, manager, metrics_url))
                await stop.drain.wait()
                load_line.cancel()
                await _drain(manager, config.shutdown_grace, stop.force)
                closed.set()
    finally:
        with trio.CancelScope(shield=True):
            await store.close()


async def _serve_metrics(
    nursery: trio.Nursery, config: ServerConfig, manager: SessionManager, closed: trio.Event
) -> str:
    """The ``--metrics-bind`` listener: ``GET /metrics`` only; returns its URL."""
    assert config.metrics_bind is not None
    host, port = config.metrics_bind
    hc = HypercornConfig()
    hc.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    hc.graceful_timeout = _CLOSE_GRACE
    hc.accesslog = None
    hc.errorlog = logging.getLogger("hypercorn.error")
    hc.keep_alive_timeout = config.keep_alive
    app = metricsroute.exposition_app(manager.metrics)
    binds = await nursery.start(
        partial(
            serve_http,
            app,
            hc,
            _METRICS_CONNECTIONS,
            write_timeout=config.write_timeout,
            shutdown_trigger=closed.wait,
        )
    )
    return str(binds[0])


def _fork_server(
    config: ServerConfig, command: Sequence[str], reaper: Reaper | None
) -> ForkServer | None:
    """With ``--fork-server auto`` (the default), a fork server for a Python adapter's command;
    ``None`` (a line logged: the warm pool serves instead) where it cannot fork."""
    if config.limits.fork_server == "off":
        return None
    target = fork_target(command)
    if target is None:
        return None
    reason = fork_unsupported()
    if reason is not None:
        log.warning("fork server off: %s; turns exec their adapter (and the warm pool)", reason)
        return None
    return ForkServer(target, guard=reaper)


def _limits(config: ServerConfig) -> Limits:
    """The manager's limits; a PostgreSQL store is shared (workers, replicas: ``sessions``)."""
    shared = config.workers > 1 or config.store.startswith(("postgresql://", "postgres://"))
    return replace(config.limits, shared_store=shared)


def _max_connections(config: ServerConfig) -> int:
    nofile = open_file_limit()
    room = auto_max_connections(config.limits, nofile)
    cap = room if config.max_connections is None else config.max_connections
    if room and (cap == 0 or cap > room):
        log.warning(
            "--max-connections %s is over the %d connections RLIMIT_NOFILE %s leaves after"
            " adapters' descriptors: turns may fail to start when connections take them",
            cap or "0 (no cap)",
            room,
            nofile,
        )
    elif room and room < _FEW_CONNECTIONS:
        log.warning(
            "RLIMIT_NOFILE %s leaves room for only %d connection(s) after adapters'"
            " descriptors: raise it (ulimit -n) or lower --max-concurrent-turns",
            nofile,
            room,
        )
    log.info(
        "at most %s connections open at once (RLIMIT_NOFILE %s); idle ones closed after %s",
        cap or "unlimited",
        nofile or "unlimited",
        format_duration(config.keep_alive),
    )
    return cap


def _max_streams(config: ServerConfig, max_connections: int) -> int:
    """``--max-streams-per-tenant``; auto: half the connection cap (none without one)."""
    if config.max_streams_per_tenant is not None:
        return config.max_streams_per_tenant
    return max(max_connections // 2, 1) if max_connections else 0


async def _drain(manager: SessionManager, grace: float, force: trio.Event) -> None:
    manager.start_draining()
    log.info(
        "draining: %d turn(s) in flight, grace %s",
        manager.turns_in_flight,
        format_duration(grace),
    )
    async with trio.open_nursery() as nursery:

        async def hurry() -> None:
            await force.wait()
            log.info("second signal: stopping now")
            manager.stop_all("server_shutdown", force=True)
            nursery.cancel_scope.cancel()

        nursery.start_soon(hurry)
        with trio.move_on_after(grace):
            await manager.wait_idle()
        if manager.turns_in_flight:
            log.info("grace over: stopping %d turn(s)", manager.turns_in_flight)
            manager.stop_all("server_shutdown")
        await manager.wait_idle()
        nursery.cancel_scope.cancel()


def _startup_line(
    url: str,
    spec: CompiledSpec,
    command: Sequence[str],
    store: str,
    config: ServerConfig,
    forked: bool = False,
) -> str:
    name, runtime = spec.metadata.name, spec.runtime.type
    limits = config.limits
    warm = "warm adapters " + str(limits.warm_adapters)
    if limits.warm_ceiling > limits.warm_adapters:
        warm += f" (up to {limits.warm_ceiling})"
    if forked:
        warm = "fork server"
    if config.keys is None:
        auth = "no API keys"
    else:
        count = len(config.keys.tenants)
        auth = f"API keys of {count} tenant{'s' if count != 1 else ''}"
    workers = f"; workers {config.workers}" if config.workers > 1 else ""
    return (
        f"trioserve: serving agent {name!r} on {url} "
        f"(runtime {runtime}: {' '.join(command)}; store {store}; {warm}; {auth}"
        f"{workers})"
    )


async def _announce_load_time(pool: WarmPool, announce: TextIO, scope: trio.CancelScope) -> None:
    """The second startup line: how long the adapter takes to load, once the pool knows."""
    with scope:
        await pool.first_load.wait()
        wall, cpu = pool.loads.wall or 0.0, pool.loads.cpu or 0.0
        print(f"trioserve: the adapter loads in {wall:.2f} s ({cpu:.2f} s of CPU)", file=announce)
        announce.flush()


async def watch_signals(stop: Stop, *, task_status: trio.TaskStatus[None]) -> None:
    """SIGINT/SIGTERM: the first starts the drain, the second forces the stop.
    SIGHUP: the API keys are read again (``stop.reload``)."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        task_status.started()
        async for signum in signals:
            name = signal.Signals(signum).name
            if signum == signal.SIGHUP:
                if stop.reload is None:
                    log.info("SIGHUP: no API keys to reload")
                else:
                    stop.reload()
                continue
            if not stop.drain.is_set():
                log.warning("%s: draining (send again to stop at once)", name)
                stop.drain.set()
            else:
                stop.force.set()
                return


def settle_collector() -> None:
    """Tune the cyclic garbage collector of a serving process, once it listens.

    What starting it made (modules, the app, the spec: ~80,000 objects the
    collector tracks) is moved out of its sight (``gc.freeze``): an older
    collection no longer walks it.  And young collections come every
    ``GC_YOUNG`` allocations, not every 700: a stream's events are objects
    the log keeps, each young collection walked the last 700 of them and
    each tenth an older generation with them.  With CPython's defaults the
    collector took a third of a streamed event's CPU (docs/benchmarks.md, b).
    """
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG, older, oldest)


async def run_until_signalled(
    config: ServerConfig, spec: CompiledSpec, command: Sequence[str]
) -> None:
    """``trioserve run``: serve until SIGINT/SIGTERM, then drain and return."""
    stop = Stop.new()
    async with trio.open_nursery() as nursery:
        await nursery.start(watch_signals, stop)
        async with trio.open_nursery() as serving:
            await serving.start(partial(serve, config, spec, command, stop=stop))
            settle_collector()
        nursery.cancel_scope.cancel()
