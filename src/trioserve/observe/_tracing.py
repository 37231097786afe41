"""OpenTelemetry traces: a span per request and per turn.

Spans (``opentelemetry-api``; a no-op unless an SDK is installed and
configured, so nothing is exported unless asked):

- ``HTTP <METHOD>`` (server kind) for each HTTP request and WebSocket
  connection, from its first byte to its last (an SSE stream's whole
  length); an incoming W3C ``traceparent`` continues that trace.
- ``turn`` for each turn, a child of the request that started it, from its
  admission until its log is closed, with ``trioserve.session.id``,
  ``trioserve.turn.id``, ``trioserve.protocol`` (the face that started it:
  ``api``, ``mcp``, ``ag-ui``, ``a2a``, as the turn metrics' label),
  ``trioserve.turn.status``, ``trioserve.turn.reason``
  and ``trioserve.adapter`` (``warm`` or ``cold``).  Its children:
  ``adapter.start`` (until the adapter runs: taken from the warm pool, or
  spawned), ``first_event`` (from then until the turn's first event is
  logged) and ``end`` (writing the end of the turn and closing its log).

A turn started with a ``traceparent`` (which starts its own adapter, as the
trace context is in its environment) gives its adapter the turn span's
context as ``TRACEPARENT``/``TRACESTATE``; without a recording SDK the
adapter gets the request's headers unchanged.

``configure`` installs the SDK with an OTLP exporter when the standard
``OTEL_*`` variables ask for traces (the ``[otel]`` extra).
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from trioserve import __version__
from trioserve.runtime import ProcessGuard

log = logging.getLogger("trioserve.tracing")

#: The tracer provider (``None``: the global one, which is a no-op without an SDK).
_provider: trace.TracerProvider | None = None

_TRACE_KEYS: Final = {"traceparent": "TRACEPARENT", "tracestate": "TRACESTATE"}

ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


def tracer() -> trace.Tracer:
    return trace.get_tracer("trioserve", __version__, tracer_provider=_provider)


def use_provider(provider: trace.TracerProvider | None) -> None:
    """Trace to ``provider`` instead of the global one (``None``: back to it)."""
    global _provider
    _provider = provider


def configure(environ: Mapping[str, str] = os.environ) -> Callable[[], Any] | None:
    """Install the SDK if the environment asks for traces; its shutdown (flushes), or ``None``.

    Traces are asked for by ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``,
    comma-separated) or by an OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT``,
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``); ``OTEL_SDK_DISABLED=true`` or
    ``OTEL_TRACES_EXPORTER=none`` turn them off.  The exporters read the
    other ``OTEL_*`` variables themselves (endpoint, headers, timeout).
    """
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    names = [n.strip() for n in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    if not names and endpoint:
        names = ["otlp"]
    if not names or names == ["none"]:
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        log.warning("traces asked for by OTEL_* but not sent: install trioserve[otel]")
        return None
    attributes = {}
    if "OTEL_SERVICE_NAME" not in environ:
        attributes["service.name"] = "trioserve"
    provider = TracerProvider(resource=Resource.create(attributes))
    for name in names:
        if name == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        elif name == "otlp":
            exporter = _otlp_exporter(environ)
            if exporter is not None:
                provider.add_span_processor(BatchSpanProcessor(exporter))
        elif name != "none":
            log.warning("OTEL_TRACES_EXPORTER: unknown exporter %r ignored", name)
    trace.set_tracer_provider(provider)
    log.info("sending traces (%s)", ", ".join(names))
    return provider.shutdown


def _otlp_exporter(environ: Mapping[str, str]) -> Any:
    """The OTLP span exporter for ``OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL`` (default HTTP)."""
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    kind = "grpc" if protocol == "grpc" else "http"
    try:
        module = importlib.import_module(f"opentelemetry.exporter.otlp.proto.{kind}.trace_exporter")
    except ImportError:
        log.warning("OTLP traces (%s) need opentelemetry-exporter-otlp-proto-%s", protocol, kind)
        return None
    return module.OTLPSpanExporter()


def recording() -> bool:
    """Whether spans can go anywhere: a provider was given (``use_provider``) or an SDK's
    is installed globally.  Without one every span is a no-op."""
    if _provider is not None:
        return True
    return not isinstance(trace.get_tracer_provider(), _NO_SDK)


_NO_SDK: Final = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


def instrument(app: Any) -> None:
    """Wrap a Quart app's ASGI callable so each request and WebSocket gets a span.

    Without a recording provider (``recording``) a request goes straight to
    the app: its span would be a no-op, and extracting the trace context,
    starting it and wrapping ``send`` cost about 40 µs a request.  A turn's
    adapter then gets the request's ``traceparent`` unchanged, as it did
    through the no-op span.
    """
    inner: ASGIApp = app.asgi_app

    async def traced(
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope["type"] not in ("http", "websocket") or not recording():
            await inner(scope, receive, send)
            return
        carrier = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())
        }
        parent = propagate.extract(carrier)
        method = "GET" if scope["type"] == "websocket" else str(scope.get("method", ""))
        span = tracer().start_span(
            f"HTTP {method}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": str(scope.get("path", ""))},
        )
        token = otel_context.attach(trace.set_span_in_context(span, parent))

        async def send_traced(message: Any) -> None:
            if message.get("type") == "http.response.start":
                status = int(message["status"])
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))
            await send(message)

        try:
            await inner(scope, receive, send_traced)
        finally:
            otel_context.detach(token)
            span.end()

    app.asgi_app = traced


class TurnTrace:
    """The spans of one turn (see the module doc); made when the turn is admitted."""

    def __init__(self, session_id: str, turn_id: str, protocol: str = "api") -> None:
        #: Whether its spans go anywhere (``recording``); if not, nobody need wait for
        #: the turn's first event to end its ``first_event`` span.
        self.recording = recording()
        self._start: Span | None = None
        self._first: Span | None = None
        self._end: Span | None = None
        self._warm = False
        if not self.recording:  # its spans would all be no-ops: none is made (11 µs a turn)
            self.span: Span = trace.INVALID_SPAN
            self._context = None
            return
        self.span = tracer().start_span(
            "turn",
            attributes={
                "trioserve.session.id": session_id,
                "trioserve.turn.id": turn_id,
                "trioserve.protocol": protocol,  # the face that started it, as the metrics' label
            },
        )
        self._context = trace.set_span_in_context(self.span)
        self._start = tracer().start_span("adapter.start", context=self._context)

    def adapter_env(self, env: Mapping[str, str] | None) -> dict[str, str] | None:
        """The trace context for the adapter: the turn span's, when one was given and it records."""
        if not env or "TRACEPARENT" not in env or not self.span.get_span_context().is_valid:
            return None if not env else dict(env)
        carrier: dict[str, str] = {}
        propagate.inject(carrier, self._context)
        out = {k: v for k, v in env.items() if k not in _TRACE_KEYS.values()}
        out.update({_TRACE_KEYS[k]: v for k, v in carrier.items() if k in _TRACE_KEYS})
        return out

    def guard(self, inner: ProcessGuard | None) -> ProcessGuard:
        """A process guard that also ends ``adapter.start`` when a cold adapter is spawned."""
        return _SpawnWatch(self, inner)

    def adapter_started(self, *, warm: bool) -> None:
        if self._start is None:
            return
        self._warm = warm
        self._start.set_attribute("trioserve.adapter", "warm" if warm else "cold")
        self._start.end()
        self._start = None
        self._first = tracer().start_span("first_event", context=self._context)

    def first_event(self) -> None:
        if self._first is not None:
            self._first.end()
            self._first = None

    def ending(self) -> None:
        """The turn is ending: its end events are written, its log closed."""
        if not self.recording:
            return
        if self._start is not None:
            self._start.set_status(Status(StatusCode.ERROR, "the adapter did not start"))
            self._start.end()
            self._start = None
        if self._first is not None:
            self._first.end()
            self._first = None
        self._end = tracer().start_span("end", context=self._context)

    def finish(self, status: str, reason: str | None) -> None:
        if not self.recording:
            return
        if self._end is None:
            self.ending()
        assert self._end is not None
        attributes = {
            "trioserve.turn.status": status,
            "trioserve.turn.reason": reason or "",
            "trioserve.adapter": "warm" if self._warm else "cold",
        }
        for span in (self._end, self.span):
            span.set_attributes(attributes)
        if status == "failed":
            self.span.set_status(Status(StatusCode.ERROR, reason))
        self._end.end()
        self.span.end()


class _SpawnWatch:
    """``run_adapter`` tells its guard of a spawned adapter's pid: the start is over."""

    def __init__(self, trace_: TurnTrace, inner: ProcessGuard | None) -> None:
        self._trace = trace_
        self._inner = inner

    def add(self, pid: int) -> None:
        self._trace.adapter_started(warm=False)
        if self._inner is not None:
            self._inner.add(pid)

    def remove(self, pid: int) -> None:
        if self._inner is not None:
            self._inner.remove(pid)
