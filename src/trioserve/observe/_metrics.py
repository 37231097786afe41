"""Prometheus metrics: one registry per server, and what feeds it.

``Metrics`` owns a ``CollectorRegistry`` of its own (not the process-wide
one, so servers in one process -- tests -- never share counters) and the
metric objects.  Who feeds what:

- the HTTP layer, through its access-log observer: each request by
  method, route template and status, its duration, the SSE and WebSocket
  clients connected, clients that left before an answer;
- the session manager: turns started and ended, their duration and time to
  first event, adapter starts (warm or cold) and exits, retention;
- a turn's log: events and their bytes, once per stored batch;
- the SQL stores: each operation's latency (``Store.on_operation``);
- gauges read when scraped: active sessions, running and queued turns, the warm pool,
  the fork server (``_fork_metrics``).

The layers above hand their objects in; this module reads them only
through the small ``Protocol``s below (``Exchange``, ``FinishedTurn``,
``Watched``), so it imports nothing of the layers it serves (the layer
contract counts type-checking imports too).

Every label comes from a closed set, so no client can grow the registry:
a method outside the standard ones is ``OTHER``, a route is a route's
template or ``unmatched``, a status is a number the server sent, a turn's
reason one the server knows (an adapter's own ``session.ended`` reason is
``other``).  Hot paths stay cheap: labelled children are bound ahead or
cached, and events are counted per batch.  docs/operations.md lists every
metric.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final, Protocol, get_args

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from trioserve.observe._fork_metrics import ForkServerCollector
from trioserve.protocol import TURN_PROTOCOLS
from trioserve.runtime import StopReason

if TYPE_CHECKING:
    from trioserve.runtime import AdapterOutcome, ForkServer, WarmPool
    from trioserve.stores.base import Store, TurnEnd


class Exchange(Protocol):
    """What the metrics read of one HTTP request or WebSocket (``http``'s access log)."""

    @property
    def method(self) -> str: ...
    @property
    def route(self) -> str: ...
    @property
    def status(self) -> int: ...
    @property
    def duration(self) -> float: ...
    @property
    def websocket(self) -> bool: ...


class FinishedTurn(Protocol):
    """What the metrics read of a turn that ended (``sessions``' ``Turn``)."""

    @property
    def end(self) -> TurnEnd | None: ...
    @property
    def admitted_at(self) -> float: ...
    @property
    def outcome(self) -> AdapterOutcome | None: ...
    @property
    def warm(self) -> bool: ...
    @property
    def adapter(self) -> str: ...
    @property
    def protocol(self) -> str: ...


class Watched(Protocol):
    """What the gauges read when scraped (``sessions``' ``SessionManager``)."""

    @property
    def active_sessions(self) -> int: ...
    @property
    def turns_in_flight(self) -> int: ...
    @property
    def queued_turns(self) -> int: ...
    @property
    def pool(self) -> WarmPool | None: ...
    @property
    def forker(self) -> ForkServer | None: ...
    @property
    def store(self) -> Store: ...


#: The methods counted by name (RFC 9110's, and a WebSocket's handshake); others are OTHER.
METHODS: Final = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH", "WEBSOCKET"}
)
#: The turn reasons counted by name; an adapter's own is ``other``.
REASONS: Final = frozenset(
    {
        "completed",
        "cancelled",
        "internal",
        "store_error",
        "adapter_start_failed",
        "event_too_large",
        "adapter_exit",
        *get_args(StopReason),
    }
)

#: Seconds: from a millisecond to a long turn.
_TIME_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    1800.0,
)
#: The status of a request whose client left before it was answered (nginx's 499).
CLIENT_CLOSED: Final = 499
_CRON_BUCKETS: Final = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)
_STORE_BUCKETS: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 1.0)


class Metrics:
    """The server's metrics; see the module doc."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        self.requests = Counter(
            "trioserve_http_requests",
            "HTTP requests and WebSocket handshakes answered, by method, route template and status",
            ["method", "route", "status"],
            registry=registry,
        )
        self.request_seconds = Histogram(
            "trioserve_http_request_duration_seconds",
            "From a request's arrival to its response's last byte (a stream's end), by route",
            ["route"],
            buckets=_TIME_BUCKETS,
            registry=registry,
        )
        self.client_aborts = Counter(
            "trioserve_http_client_aborts",
            "Requests whose client left before any response began (logged with status 499)",
            registry=registry,
        )
        self.stream_clients = Gauge(
            "trioserve_stream_clients",
            "Clients connected to an event stream, by transport (sse, websocket)",
            ["transport"],
            registry=registry,
        )
        self.turns_started = Counter(
            "trioserve_turns_started",
            "Turns admitted and started, by the face that started them (api, mcp, ag-ui, a2a)",
            ["protocol"],
            registry=registry,
        )
        self.turns_ended = Counter(
            "trioserve_turns_ended",
            "Turns finished, by the turn record's status and reason, and the face that"
            " started them",
            ["status", "reason", "protocol"],
            registry=registry,
        )
        for name in TURN_PROTOCOLS:  # every face's series exists, at 0, from the start
            self.turns_started.labels(name)
        self.turn_seconds = Histogram(
            "trioserve_turn_duration_seconds",
            "From a turn's admission to its end, by status",
            ["status"],
            buckets=_TIME_BUCKETS,
            registry=registry,
        )
        self.first_event_seconds = Histogram(
            "trioserve_turn_first_event_seconds",
            "From a turn's admission until its first event was stored and sent",
            buckets=_TIME_BUCKETS,
            registry=registry,
        )
        self.events = Counter(
            "trioserve_events",
            "Events logged by turns (each sent to every client that follows the turn)",
            registry=registry,
        )
        self.event_bytes = Counter(
            "trioserve_event_bytes", "Bytes of the events logged by turns", registry=registry
        )
        self.warm_taken = Counter(
            "trioserve_warm_adapters_taken",
            "Turns that took an adapter from the warm pool",
            registry=registry,
        )
        self.cold_starts = Counter(
            "trioserve_cold_starts",
            "Turns that started their own adapter (pool off, empty, or a trace context)",
            registry=registry,
        )
        self.adapter_exits = Counter(
            "trioserve_adapter_exits",
            "Adapters of turns that ended, by kind: clean (exit 0), error (another exit"
            " status), signal (killed by a signal the server did not send), stopped (by the"
            " server), start_failed",
            ["kind"],
            registry=registry,
        )
        self.store_seconds = Histogram(
            "trioserve_store_operation_seconds",
            "SQLite store operations, waiting for the connection included, by operation",
            ["operation"],
            buckets=_STORE_BUCKETS,
            registry=registry,
        )
        self.events_dropped = Counter(
            "trioserve_retention_events_dropped",
            "Logged events dropped by --event-retention",
            registry=registry,
        )
        self.sessions_purged = Counter(
            "trioserve_retention_sessions_purged",
            "Terminal sessions deleted by --session-retention",
            registry=registry,
        )
        self.end_write_failures = Counter(
            "trioserve_turn_end_write_failures",
            "Writes of a turn's end (its last events and status) that the store refused or did"
            " not finish in time; each such turn's end is written again, with backoff",
            registry=registry,
        )
        self.cron_fires = Counter(
            "trioserve_cron_fires",
            "Scheduled fires of crons claimed by this process, by outcome (started, queued:"
            " a turn; skipped: none, busy or missed; failed: refused)",
            ["outcome"],
            registry=registry,
        )
        self.cron_skips = Counter(
            "trioserve_cron_skips",
            "Scheduled fires that started no turn, by reason (busy: multitask skip; missed:"
            " no process was up in time, catchUp skip)",
            ["reason"],
            registry=registry,
        )
        self.cron_lateness_seconds = Histogram(
            "trioserve_cron_lateness_seconds",
            "From a fire's scheduled time to its turn's start (or queueing)",
            buckets=_CRON_BUCKETS,
            registry=registry,
        )
        self.turns_unwritten = Gauge(
            "trioserve_turns_unwritten",
            "Turns that are over but whose end the store has not taken yet (being retried)",
            registry=registry,
        )
        self.active_sessions = Gauge(
            "trioserve_active_sessions", "Sessions with status active", registry=registry
        )
        self.running_turns = Gauge("trioserve_running_turns", "Turns running", registry=registry)
        self.queued_turns = Gauge(
            "trioserve_queued_turns",
            "Turns waiting for their session (multitask: enqueue) in this process",
            registry=registry,
        )
        self.warm_adapters = Gauge(
            "trioserve_warm_adapters",
            "Processes of the warm pool, by state (ready: loaded and waiting; loading;"
            " paused: a loading one stopped while a turn waits for another load)",
            ["state"],
            registry=registry,
        )
        self.warm_target = Gauge(
            "trioserve_warm_adapters_target",
            "Processes the warm pool keeps now (--warm-adapters up to --warm-adapters-max)",
            registry=registry,
        )
        self.warm_load_seconds = Gauge(
            "trioserve_warm_adapter_load_seconds",
            "The adapter's load time, spawn to ready (median of the last 16 warm adapters;"
            " 0 until one has loaded)",
            ["clock"],
            registry=registry,
        )
        self.webhooks_sent = Counter(
            "trioserve_webhook_deliveries_sent",
            "Webhook deliveries a receiver took (a 2xx), each counted once",
            registry=registry,
        )
        self.webhooks_failed = Counter(
            "trioserve_webhook_deliveries_failed",
            "Webhook deliveries given up: --webhook-retry-for passed, their host no longer"
            " allowed, or their turn deleted before the first attempt",
            registry=registry,
        )
        self.webhook_attempts_failed = Counter(
            "trioserve_webhook_attempts_failed",
            "Webhook attempts that got no 2xx (each is retried, with backoff, or given up)",
            registry=registry,
        )
        self.webhooks_pending = Gauge(
            "trioserve_webhook_deliveries_pending",
            "Webhook deliveries in the store's outbox (waiting for their turn's end, due or"
            " being retried), as this process last counted them",
            registry=registry,
        )
        self.webhook_attempt_seconds = Histogram(
            "trioserve_webhook_attempt_seconds",
            "One webhook attempt, from the connection to the answer (or the failure)",
            buckets=_TIME_BUCKETS,
            registry=registry,
        )
        self._sse = self.stream_clients.labels("sse")
        self._websocket = self.stream_clients.labels("websocket")
        self._request_children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
        self._store_children: dict[str, Histogram] = {}
        self._turn_children: dict[tuple[str, str, str], tuple[Counter, Histogram]] = {}

    def watch(self, manager: Watched) -> None:
        """Read ``manager``'s gauges when scraped; time its store's operations."""
        self.active_sessions.set_function(lambda: manager.active_sessions)
        self.running_turns.set_function(lambda: manager.turns_in_flight)
        self.queued_turns.set_function(lambda: manager.queued_turns)
        pool = manager.pool
        ready, loading = self.warm_adapters.labels("ready"), self.warm_adapters.labels("loading")
        paused = self.warm_adapters.labels("paused")
        wall, cpu = self.warm_load_seconds.labels("wall"), self.warm_load_seconds.labels("cpu")
        if pool is None:
            for gauge in (ready, loading, paused, self.warm_target, wall, cpu):
                gauge.set(0)
        else:
            ready.set_function(lambda: pool.ready)
            loading.set_function(lambda: pool.loading - pool.paused)
            paused.set_function(lambda: pool.paused)
            self.warm_target.set_function(lambda: pool.target)
            wall.set_function(lambda: pool.loads.wall or 0.0)
            cpu.set_function(lambda: pool.loads.cpu or 0.0)
        self.registry.register(ForkServerCollector(manager.forker))
        manager.store.on_operation = self.store_operation

    # -- HTTP (an accesslog.Observer) ---------------------------------------------------

    def stream_opened(self, exchange: Exchange) -> None:
        (self._websocket if exchange.websocket else self._sse).inc()

    def stream_closed(self, exchange: Exchange) -> None:
        (self._websocket if exchange.websocket else self._sse).dec()

    def ended(self, exchange: Exchange) -> None:
        method = exchange.method if exchange.method in METHODS else "OTHER"
        key = (method, exchange.route, exchange.status)  # each from a closed set
        children = self._request_children.get(key)
        if children is None:
            children = self._request_children[key] = (
                self.requests.labels(method, exchange.route, str(exchange.status)),
                self.request_seconds.labels(exchange.route),
            )
        children[0].inc()
        children[1].observe(exchange.duration)
        if exchange.status == CLIENT_CLOSED:
            self.client_aborts.inc()

    # -- turns, store, retention ---------------------------------------------------------

    def turn_ended(self, turn: FinishedTurn, first_event_at: float | None) -> None:
        """Count a finished turn (``first_event_at``: ``time.monotonic`` of its first event)."""
        end = turn.end
        status = "unknown" if end is None else end.status.value
        reason = "unknown" if end is None else end.reason if end.reason in REASONS else "other"
        protocol = turn.protocol if turn.protocol in TURN_PROTOCOLS else "other"
        key = (status, reason, protocol)  # each from a closed set
        children = self._turn_children.get(key)
        if children is None:
            children = self._turn_children[key] = (
                self.turns_ended.labels(status, reason, protocol),
                self.turn_seconds.labels(status),
            )
        children[0].inc()
        children[1].observe(time.monotonic() - turn.admitted_at)
        if first_event_at is not None:
            self.first_event_seconds.observe(first_event_at - turn.admitted_at)
        outcome = turn.outcome
        if turn.warm:
            self.warm_taken.inc()
        elif turn.adapter == "fork":
            pass  # counted by the fork server (trioserve_fork_server_forks)
        elif outcome is not None and (outcome.pid is not None or outcome.error_reason):
            self.cold_starts.inc()
        kind = exit_kind(outcome)
        if kind is not None:
            self.adapter_exits.labels(kind).inc()

    def store_operation(self, name: str, seconds: float) -> None:
        child = self._store_children.get(name)
        if child is None:
            child = self._store_children[name] = self.store_seconds.labels(name)
        child.observe(seconds)

    # -- exposition -------------------------------------------------------------------------

    def exposition(self) -> tuple[bytes, str]:
        """The registry in the Prometheus text format, and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def exit_kind(outcome: AdapterOutcome | None) -> str | None:
    """How a turn's adapter ended (``None``: no adapter was involved)."""
    if outcome is None:
        return None
    if outcome.error_reason == "adapter_start_failed":
        return "start_failed"
    if outcome.exit_code is None:
        return None
    if outcome.stopped_by_server:
        return "stopped"
    if outcome.exit_code == 0:
        return "clean"
    return "signal" if outcome.exit_code < 0 else "error"
