"""OpenTelemetry: the span tree of a turn, the trace context the adapter gets, and
``trioserve run`` sending spans when the ``OTEL_*`` environment asks."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import trio
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from tests.helpers import Server, ServerFactory, parse_sse, script, start_cli_server, write_spec
from trioserve.observe import _tracing as tracing

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    yield exporter
    tracing.use_provider(None)
    provider.shutdown()


def tree(
    exporter: InMemorySpanExporter,
    turn_id: str,
    children: frozenset[str] = frozenset({"adapter.start", "first_event", "end"}),
) -> dict[str, ReadableSpan]:
    """The spans of one turn by name: its request, the turn and the turn's children."""
    finished = exporter.get_finished_spans()
    turn = next(
        s
        for s in finished
        if s.name == "turn" and (s.attributes or {}).get("trioserve.turn.id") == turn_id
    )
    assert turn.parent is not None
    by_id = {s.context.span_id: s for s in finished}
    found = {"request": by_id[turn.parent.span_id], "turn": turn}
    for span in finished:
        if span.parent is not None and span.parent.span_id == turn.context.span_id:
            assert span.name not in found, f"two {span.name} spans"
            found[span.name] = span
    assert set(found) == {"request", "turn", *children}
    for span in found.values():
        assert span.context.trace_id == turn.context.trace_id
    return found


def _hex(value: int, width: int) -> str:
    return format(value, f"0{width}x")


async def post_turn(server: Server, sid: str, text: str, **headers: str) -> Any:
    resp = await server.client.post(
        f"/v1/sessions/{sid}/turns", json={"input": text}, headers=headers
    )
    assert resp.status_code == 200, resp.text
    return resp


async def wait_turn_span(exporter: InMemorySpanExporter, turn_id: str) -> None:
    """Wait for the turn's span and its request's (ended when the response is sent)."""
    with trio.fail_after(10):
        while True:
            finished = exporter.get_finished_spans()
            ids = {s.context.span_id for s in finished}
            turns = [s for s in finished if _turn_id(s) == turn_id]
            if turns and turns[0].parent is not None and turns[0].parent.span_id in ids:
                return
            await trio.sleep(0.01)


def _turn_id(span: ReadableSpan) -> object:
    return (span.attributes or {}).get("trioserve.turn.id") if span.name == "turn" else None


async def test_a_cold_turn_continues_the_trace_and_its_adapter_gets_the_turn_span(
    start_server: ServerFactory, spans: InMemorySpanExporter
) -> None:
    server = await start_server(warm_adapters=0)
    sid = (await server.create())["id"]
    text = script({"env": "TRACEPARENT"}, {"end": "completed"})
    resp = await post_turn(server, sid, text, traceparent=TRACEPARENT, tracestate="vendor=1")
    turn_id = resp.headers["Trioserve-Turn-Id"]
    await wait_turn_span(spans, turn_id)
    found = tree(spans, turn_id)

    request, turn = found["request"], found["turn"]
    assert request.name == "HTTP POST"
    assert request.parent is not None and request.parent.is_remote
    assert _hex(request.context.trace_id, 32) == TRACE_ID
    assert _hex(request.parent.span_id, 16) == PARENT_ID
    assert request.attributes is not None
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["url.path"] == f"/v1/sessions/{sid}/turns"
    assert turn.attributes == {
        "trioserve.session.id": sid,
        "trioserve.turn.id": turn_id,
        "trioserve.protocol": "api",
        "trioserve.turn.status": "completed",
        "trioserve.turn.reason": "completed",
        "trioserve.adapter": "cold",
    }
    assert turn.status.status_code is StatusCode.UNSET
    assert found["adapter.start"].attributes == {"trioserve.adapter": "cold"}
    # The children follow one another within the turn.
    start, first, end = found["adapter.start"], found["first_event"], found["end"]
    assert turn.start_time <= start.start_time <= start.end_time <= first.start_time  # type: ignore[operator]
    assert first.end_time <= end.start_time <= end.end_time <= turn.end_time  # type: ignore[operator]
    # The adapter's TRACEPARENT is the turn span's context, in the caller's trace.
    frames = parse_sse(resp.text)
    env = frames[1].data["data"]["env"]
    assert env == f"00-{TRACE_ID}-{_hex(turn.context.span_id, 16)}-01"


async def test_without_a_tracer_the_adapter_gets_the_callers_trace_context_unchanged(
    start_server: ServerFactory,
) -> None:
    """No provider records spans (the default): a turn makes none, and its adapter gets the
    request's ``traceparent`` as it came, so its own spans still join the caller's trace."""
    assert not tracing.recording()
    server = await start_server(warm_adapters=0)
    sid = (await server.create())["id"]
    text = script({"env": "TRACEPARENT"}, {"end": "completed"})
    resp = await post_turn(server, sid, text, traceparent=TRACEPARENT)
    frames = parse_sse(resp.text)
    assert frames[1].data["data"]["env"] == TRACEPARENT
    assert frames[-1].data["data"]["reason"] == "completed"


async def test_a_warm_turn_without_trace_context(
    start_server: ServerFactory, spans: InMemorySpanExporter
) -> None:
    server = await start_server(warm_adapters=1)
    pool = server.manager.pool
    assert pool is not None
    with trio.fail_after(10):
        await pool.wait_ready()
    sid = (await server.create())["id"]
    text = script({"env": "TRACEPARENT"}, {"end": "completed"})
    resp = await post_turn(server, sid, text)
    turn_id = resp.headers["Trioserve-Turn-Id"]
    await wait_turn_span(spans, turn_id)
    found = tree(spans, turn_id)
    assert found["request"].parent is None  # a new trace
    assert found["adapter.start"].attributes == {"trioserve.adapter": "warm"}
    assert found["turn"].attributes is not None
    assert found["turn"].attributes["trioserve.adapter"] == "warm"
    # No trace context was given: the warm adapter has none.
    assert parse_sse(resp.text)[1].data["data"]["env"] is None


async def test_a_cancelled_turn(start_server: ServerFactory, spans: InMemorySpanExporter) -> None:
    server = await start_server(warm_adapters=0)
    sid = (await server.create())["id"]
    async with server.client.stream(
        "POST", f"/v1/sessions/{sid}/turns", json={"input": script({"hang": True})}
    ) as resp:
        turn_id = resp.headers["Trioserve-Turn-Id"]
        lines = resp.aiter_lines()
        while "session.started" not in await anext(lines):
            pass
        cancel = await server.client.delete(f"/v1/sessions/{sid}/turns/current")
        assert cancel.status_code == 202
        async for _ in lines:  # the rest of the stream, to its end
            pass
    await wait_turn_span(spans, turn_id)
    found = tree(spans, turn_id)
    attributes = found["turn"].attributes
    assert attributes is not None
    assert attributes["trioserve.turn.status"] == "cancelled"
    assert attributes["trioserve.turn.reason"] == "cancelled"
    assert found["turn"].status.status_code is StatusCode.UNSET
    cancels = [s for s in spans.get_finished_spans() if s.name == "HTTP DELETE"]
    assert len(cancels) == 1 and cancels[0].attributes is not None
    assert cancels[0].attributes["http.response.status_code"] == 202


async def test_a_crashed_turn(start_server: ServerFactory, spans: InMemorySpanExporter) -> None:
    server = await start_server(warm_adapters=0)
    sid = (await server.create())["id"]
    resp = await post_turn(server, sid, script({"exit": 3}))
    turn_id = resp.headers["Trioserve-Turn-Id"]
    await wait_turn_span(spans, turn_id)
    found = tree(spans, turn_id)
    turn = found["turn"]
    assert turn.attributes is not None
    assert turn.attributes["trioserve.turn.status"] == "failed"
    assert turn.attributes["trioserve.turn.reason"] == "adapter_exit"
    assert turn.status.status_code is StatusCode.ERROR


async def test_an_adapter_that_cannot_start(
    start_server: ServerFactory, spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    server = await start_server(warm_adapters=0, command=[str(tmp_path / "no-such-adapter")])
    sid = (await server.create())["id"]
    resp = await post_turn(server, sid, "hello")
    turn_id = resp.headers["Trioserve-Turn-Id"]
    await wait_turn_span(spans, turn_id)
    # It never ran: no first_event.
    found = tree(spans, turn_id, frozenset({"adapter.start", "end"}))
    assert found["adapter.start"].status.status_code is StatusCode.ERROR
    assert found["turn"].attributes is not None
    assert found["turn"].attributes["trioserve.turn.reason"] == "adapter_start_failed"


def test_nothing_is_configured_unless_asked() -> None:
    assert tracing.configure({}) is None
    assert tracing.configure({"OTEL_TRACES_EXPORTER": "none"}) is None
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert tracing.configure({**endpoint, "OTEL_SDK_DISABLED": "true"}) is None


async def test_run_sends_spans_when_the_environment_asks(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """``trioserve run`` with ``OTEL_TRACES_EXPORTER=console``: spans on stdout at exit."""
    import httpx

    out = tmp_path / "stdout"
    spec = write_spec(tmp_path, runtime="echo")
    with out.open("wb") as stdout:
        server = await start_cli_server(
            nursery,
            tmp_path,
            spec,
            "--warm-adapters",
            "0",
            env={"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "ts-test"},
            stdout=stdout,
        )
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        sid = (await client.post("/v1/sessions")).json()["id"]
        resp = await client.post(f"/v1/sessions/{sid}/turns", headers={"traceparent": TRACEPARENT})
        assert resp.status_code == 200
    server.signal(signal.SIGTERM)
    assert await server.wait() == 0
    text = out.read_text()
    decoder = json.JSONDecoder()
    exported, at = [], 0
    while (at := text.find("{", at)) != -1:
        span, at = decoder.raw_decode(text, at)
        exported.append(span)
    names = {s["name"] for s in exported}
    assert {"HTTP POST", "turn", "adapter.start", "first_event", "end"} <= names
    assert all(s["context"]["trace_id"] == "0x" + TRACE_ID for s in exported if s["name"] == "turn")
    assert all(s["resource"]["attributes"]["service.name"] == "ts-test" for s in exported)


async def test_run_sends_spans_to_an_otlp_collector(nursery: trio.Nursery, tmp_path: Path) -> None:
    """``OTEL_EXPORTER_OTLP_ENDPOINT``: the spans reach a collector as OTLP/HTTP protobuf."""
    import httpx
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    received: list[tuple[str, bytes]] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.path, body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    collector = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{collector.server_address[1]}"
        spec = write_spec(tmp_path, runtime="echo")
        server = await start_cli_server(
            nursery,
            tmp_path,
            spec,
            "--warm-adapters",
            "0",
            env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint},
        )
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            sid = (await client.post("/v1/sessions")).json()["id"]
            resp = await client.post(f"/v1/sessions/{sid}/turns")
            assert resp.status_code == 200
        server.signal(signal.SIGTERM)
        assert await server.wait() == 0  # the buffered spans are sent before it exits
    finally:
        collector.shutdown()
        collector.server_close()
    assert received and {path for path, _ in received} == {"/v1/traces"}
    names = set()
    for _, body in received:
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}[
                "service.name"
            ]
            assert service == "trioserve"
            for scope_spans in resource_spans.scope_spans:
                names |= {span.name for span in scope_spans.spans}
    assert {"HTTP POST", "turn", "adapter.start", "first_event", "end"} <= names


async def test_a_turn_span_names_the_face_that_started_it(
    start_server: ServerFactory, spans: InMemorySpanExporter
) -> None:
    server = await start_server()
    said = {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": said}}
    answer = (await server.client.post("/a2a", json=rpc, timeout=60)).json()
    turn_id = answer["result"]["task"]["id"].split(".")[1]
    with trio.fail_after(30):  # a hang guard: the span ends as the turn's log closes
        while not (found := [s for s in spans.get_finished_spans() if _turn_id(s) == turn_id]):
            await trio.sleep(0.01)
    [turn] = found
    assert (turn.attributes or {})["trioserve.protocol"] == "a2a"
