"""Observability over real servers: access lines, turn lines, JSON logs."""

from __future__ import annotations

import json
import logging
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from trio_websocket import open_websocket_url

from tests.helpers import ServerFactory, raw_request, run_cli, script, start_cli_server, write_spec
from tests.helpers.backends import DURABLE
from trioserve.http._auth import KeyEntry, KeyRing, digest

ACCESS_FIELDS = {"method", "route", "path", "status", "duration_ms", "bytes", "tenant", "turn"}
TURN_FIELDS = {"session", "turn", "status", "reason", "duration_ms", "events", "exit", "adapter"}


def access_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "trioserve.access"]


async def access_lines(
    caplog: pytest.LogCaptureFixture, count: int, method: str | None = None
) -> list[dict[str, Any]]:
    """The first ``count`` access lines' fields (a line comes right after its response)."""
    with trio.fail_after(10):
        while True:
            lines = [
                fields_of(r)
                for r in access_records(caplog)
                if method is None or r.__dict__.get("method") == method
            ]
            if len(lines) >= count:
                return lines
            await trio.sleep(0.01)


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    return {name: getattr(record, name) for name in ACCESS_FIELDS}


async def test_one_access_line_per_request_with_route_template(
    start_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trioserve")
    server = await start_server()
    sid = (await server.create())["id"]
    streamed = await server.client.post(f"/v1/sessions/{sid}/turns", json={"input": "hi"})
    assert streamed.status_code == 200 and "session.ended" in streamed.text
    missing = await server.client.get("/v1/sessions/s_nope")
    assert missing.status_code == 404
    unknown = await server.client.get("/no/such/route")
    assert unknown.status_code == 404

    lines = await access_lines(caplog, 4)
    assert [(f["method"], f["route"], f["status"]) for f in lines] == [
        ("POST", "/v1/sessions", 201),
        ("POST", "/v1/sessions/<session_id>/turns", 200),
        ("GET", "/v1/sessions/<session_id>", 404),
        ("GET", "unmatched", 404),
    ]
    create, turn, got, _ = lines
    assert create["path"] == "/v1/sessions" and create["turn"] is None
    assert create["tenant"] is None
    # The turn's line comes when its stream has ended, with the whole stream's length.
    assert turn["bytes"] == len(streamed.content)
    assert turn["turn"] == streamed.headers["Trioserve-Turn-Id"]
    assert turn["path"] == f"/v1/sessions/{sid}/turns"
    assert got["bytes"] == len(missing.content)
    assert all(isinstance(f["duration_ms"], float) and f["duration_ms"] >= 0 for f in lines)
    # The message says the same for people, key=value.
    message = access_records(caplog)[1].getMessage()
    assert message.startswith("request method=POST route=/v1/sessions/<session_id>/turns ")
    assert "status=200 " in message and f"turn={turn['turn']}" in message


async def test_access_line_names_the_tenant_and_refusals(
    start_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trioserve")
    keys = KeyRing((KeyEntry(digest("k-acme"), "acme"),))
    server = await start_server(keys=keys)
    refused = await server.client.get("/v1/sessions")
    assert refused.status_code == 401
    ok = await server.client.get("/v1/sessions", headers={"Authorization": "Bearer k-acme"})
    assert ok.status_code == 200
    lines = await access_lines(caplog, 2)
    assert [(f["route"], f["status"], f["tenant"]) for f in lines] == [
        ("/v1/sessions", 401, None),
        ("/v1/sessions", 200, "acme"),
    ]


async def test_websocket_access_line(
    start_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trioserve")
    server = await start_server()
    sid = (await server.create())["id"]
    host = server.url.removeprefix("http://")
    refused = await raw_request(
        server.url,
        "GET",
        "/v1/sessions/s_nope/ws",
        [
            ("Host", host),
            ("Upgrade", "websocket"),
            ("Connection", "Upgrade"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("Sec-WebSocket-Version", "13"),
        ],
    )
    lines = await access_lines(caplog, 1, "WEBSOCKET")
    assert lines[-1]["route"] == "/v1/sessions/<session_id>/ws"
    assert lines[-1]["status"] == refused.status
    assert sid  # the session exists; the refused one was another id


async def test_json_log_lines_of_a_real_server(nursery: trio.Nursery, tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    server = await start_cli_server(
        nursery, tmp_path, spec, "--in-memory", "--log-format", "json", "--warm-adapters", "0"
    )
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={})).json()["id"]
        body = {"input": script({"event": "message", "data": {"text": "x"}}, {"end": "completed"})}
        resp = await client.post(f"/v1/sessions/{sid}/turns", json=body)
        assert resp.status_code == 200
        assert (await client.get("/nowhere")).status_code == 404
    server.signal(signal.SIGTERM)
    assert await server.wait() == 0
    records = []
    for line in server.log.splitlines():
        if line.startswith("trioserve: "):
            continue  # the startup line, for people
        records.append(json.loads(line))  # every log line is one JSON object
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    access = [r for r in records if r["logger"] == "trioserve.access"]
    assert [(r["method"], r["route"], r["status"]) for r in access] == [
        ("POST", "/v1/sessions", 201),
        ("POST", "/v1/sessions/<session_id>/turns", 200),
        ("GET", "unmatched", 404),
    ]
    assert all(r.keys() >= ACCESS_FIELDS for r in access)
    assert access[1]["turn"] == resp.headers["Trioserve-Turn-Id"]
    ended = [r for r in records if r["message"].startswith("turn ended ")]
    assert len(ended) == 1 and ended[0].keys() >= TURN_FIELDS
    assert ended[0]["turn"] == access[1]["turn"] and ended[0]["status"] == "completed"
    assert ended[0]["events"] == 3 and ended[0]["exit"] == "0"
    assert ended[0]["adapter"] == "cold"


# --- metrics ---------------------------------------------------------------------------------


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The exposition's samples by name and labels."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def value(
    found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


def ended(
    found: dict[tuple[str, frozenset[tuple[str, str]]], float], status: str, reason: str
) -> float:
    """Turns of the v0.8 API that ended with ``status`` and ``reason``."""
    labels = {"status": status, "reason": reason, "protocol": "api"}
    return value(found, "trioserve_turns_ended_total", **labels)


async def scrape(
    client: httpx.AsyncClient, **headers: str
) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    resp = await client.get("/metrics", headers=headers)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/plain; version=")
    return samples(resp.text)


async def wait_turn_counted(
    server: Any, count: float
) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Scrape until ``count`` turns have ended (a turn is counted right after its stream ends)."""
    with trio.fail_after(10):
        while True:
            found = await scrape(server.client)
            if sum(v for (n, _), v in found.items() if n == "trioserve_turns_ended_total") >= count:
                return found
            await trio.sleep(0.01)


async def test_metrics_count_completed_crashed_and_cancelled_turns(
    start_server: ServerFactory,
) -> None:
    server = await start_server(warm_adapters=0)
    before = await scrape(server.client)
    assert value(before, "trioserve_turns_started_total", protocol="api") == 0
    assert ("trioserve_turns_started_total", frozenset({("protocol", "mcp")})) in before
    sid = (await server.create())["id"]
    # completed: 2 events of the adapter's + session.started
    done = await server.client.post(
        f"/v1/sessions/{sid}/turns",
        json={"input": script({"event": "message", "data": {"text": "x"}}, {"end": "completed"})},
    )
    assert done.status_code == 200
    # crashed: exit 3 without session.ended
    crashed = await server.client.post(
        f"/v1/sessions/{sid}/turns", json={"input": script({"exit": 3})}
    )
    assert crashed.status_code == 200 and "adapter exited" in crashed.text
    found = await wait_turn_counted(server, 2)
    assert value(found, "trioserve_active_sessions") == 1
    # cancelled: a hanging turn, cancelled while it runs
    async with server.client.stream(
        "POST", f"/v1/sessions/{sid}/turns", json={"input": script({"hang": True})}
    ) as resp:
        lines = resp.aiter_lines()
        async for line in lines:
            if line.startswith("event: session.started"):
                break
        running = await scrape(server.client)
        assert value(running, "trioserve_running_turns") == 1
        assert value(running, "trioserve_stream_clients", transport="sse") == 1
        cancel = await server.client.delete(f"/v1/sessions/{sid}/turns/current")
        assert cancel.status_code == 202
        async for _ in lines:
            pass
    found = await wait_turn_counted(server, 3)

    assert value(found, "trioserve_turns_started_total", protocol="api") == 3
    assert ended(found, "completed", "completed") == 1
    assert ended(found, "failed", "adapter_exit") == 1
    assert ended(found, "cancelled", "cancelled") == 1
    assert value(found, "trioserve_turn_duration_seconds_count", status="completed") == 1
    assert value(found, "trioserve_turn_first_event_seconds_count") == 3
    assert value(found, "trioserve_cold_starts_total") == 3
    assert value(found, "trioserve_warm_adapters_taken_total") == 0
    assert value(found, "trioserve_adapter_exits_total", kind="clean") == 1
    assert value(found, "trioserve_adapter_exits_total", kind="error") == 1
    assert value(found, "trioserve_adapter_exits_total", kind="stopped") == 1
    # Every event the turns logged, with its bytes: what the streams carried.
    export = await server.client.get(f"/v1/sessions/{sid}/events?format=json")
    logged = export.json()
    assert value(found, "trioserve_events_total") == len(logged)
    # The export is [raw,raw,...]\n: the events' bytes are the rest.
    raw_bytes = len(export.content) - len("[]\n") - (len(logged) - 1)
    assert value(found, "trioserve_event_bytes_total") == raw_bytes
    assert value(found, "trioserve_running_turns") == 0
    assert value(found, "trioserve_stream_clients", transport="sse") == 0
    assert (
        value(
            found,
            "trioserve_http_requests_total",
            method="POST",
            route="/v1/sessions/<session_id>/turns",
            status="200",
        )
        == 3
    )
    assert (
        value(
            found,
            "trioserve_http_requests_total",
            method="POST",
            route="/v1/sessions",
            status="201",
        )
        == 1
    )
    assert (
        value(
            found,
            "trioserve_http_requests_total",
            method="DELETE",
            route="/v1/sessions/<session_id>/turns/current",
            status="202",
        )
        == 1
    )
    assert (
        value(
            found,
            "trioserve_http_request_duration_seconds_count",
            route="/v1/sessions/<session_id>/turns",
        )
        == 3
    )


async def test_metrics_requests_by_route_and_status_and_the_warm_pool(
    start_server: ServerFactory,
) -> None:
    server = await start_server(warm_adapters=1)
    await server.pool.wait_ready()
    assert (await server.client.get("/v1/sessions/s_nope")).status_code == 404
    assert (await server.client.get("/v1/sessions/s_nope")).status_code == 404
    assert (await server.client.get("/no/where")).status_code == 404
    found = await scrape(server.client)
    route = "/v1/sessions/<session_id>"
    assert (
        value(found, "trioserve_http_requests_total", method="GET", route=route, status="404") == 2
    )
    assert (
        value(found, "trioserve_http_requests_total", method="GET", route="unmatched", status="404")
        == 1
    )
    assert value(found, "trioserve_warm_adapters", state="ready") == 1
    assert value(found, "trioserve_warm_adapters", state="loading") == 0
    assert value(found, "trioserve_warm_adapters_target") == 1
    load = server.pool.loads
    assert load.wall is not None and load.cpu is not None
    assert value(found, "trioserve_warm_adapter_load_seconds", clock="wall") == load.wall > 0
    assert value(found, "trioserve_warm_adapter_load_seconds", clock="cpu") == load.cpu > 0
    sid = (await server.create())["id"]
    await server.turn(sid, "hi")
    found = await wait_turn_counted(server, 1)
    assert value(found, "trioserve_warm_adapters_taken_total") == 1
    assert value(found, "trioserve_cold_starts_total") == 0
    # The scrape before this one is counted too, by its own route.
    assert (
        value(found, "trioserve_http_requests_total", method="GET", route="/metrics", status="200")
        >= 1
    )


async def test_metrics_need_a_key_when_keys_are_configured(start_server: ServerFactory) -> None:
    keys = KeyRing((KeyEntry(digest("k-acme"), "acme", frozenset({"admin"})),))
    server = await start_server(keys=keys, metrics_bind=("127.0.0.1", 0))
    refused = await server.client.get("/metrics")
    assert refused.status_code == 401
    assert refused.json()["error"]["reason"] == "unauthorized"
    found = await scrape(server.client, Authorization="Bearer k-acme")
    assert (
        value(found, "trioserve_http_requests_total", method="GET", route="/metrics", status="401")
        == 1
    )
    # --metrics-bind: its own port, no key, only /metrics.
    url = server.running.metrics_url
    assert url is not None and url != server.url
    async with httpx.AsyncClient(base_url=url, timeout=30) as private:
        found = await scrape(private)
        assert (
            value(
                found, "trioserve_http_requests_total", method="GET", route="/metrics", status="401"
            )
            == 1
        )
        other = await private.get("/v1/sessions")
        assert other.status_code == 404


async def test_metrics_bind_of_a_real_trioserve_run(nursery: trio.Nursery, tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    server = await start_cli_server(
        nursery, tmp_path, spec, "--in-memory", "--metrics-bind", "127.0.0.1:0"
    )
    with trio.fail_after(10):
        while "metrics on " not in server.log:
            await trio.sleep(0.01)
    line = next(line for line in server.log.splitlines() if "metrics on " in line)
    metrics_url = line.rsplit(" ", 1)[1]
    assert metrics_url.endswith("/metrics") and not metrics_url.startswith(server.url)
    async with httpx.AsyncClient(timeout=30) as client:
        resp = await client.get(metrics_url)
        assert resp.status_code == 200
        assert 'trioserve_turns_started_total{protocol="api"} 0.0' in resp.text
    server.signal(signal.SIGTERM)
    assert await server.wait() == 0


async def test_a_bad_metrics_bind_is_a_usage_error(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "run", str(write_spec(tmp_path)), "--metrics-bind", "9100")
    assert result.returncode == 2
    assert "--metrics-bind: invalid address '9100': expected HOST:PORT" in result.stderr


async def test_retention_drops_are_counted(start_server: ServerFactory) -> None:
    server = await start_server(warm_adapters=0, event_retention=0.001)
    sid = (await server.create())["id"]
    frames = await server.turn(sid, "hi")
    await wait_turn_counted(server, 1)
    await trio.sleep(0.01)  # older than the retention
    dropped = await server.manager.drop_old_events()
    assert dropped == len(frames)
    found = await scrape(server.client)
    assert value(found, "trioserve_retention_events_dropped_total") == dropped


@pytest.mark.backends(*DURABLE)
async def test_store_operations_are_timed(start_server: ServerFactory, backend_url: str) -> None:
    """Both SQL stores time their operations (the memory store has nothing to time)."""
    server = await start_server(warm_adapters=0, store=backend_url)
    sid = (await server.create())["id"]
    await server.turn(sid, "hi")
    found = await wait_turn_counted(server, 1)
    assert value(found, "trioserve_store_operation_seconds_count", operation="insert") == 1
    assert value(found, "trioserve_store_operation_seconds_count", operation="append") >= 1


async def test_websocket_clients_and_their_turns_are_counted(
    start_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trioserve")
    server = await start_server(warm_adapters=0)
    sid = (await server.create())["id"]
    url = server.url.replace("http://", "ws://", 1) + f"/v1/sessions/{sid}/ws"
    async with open_websocket_url(url, disconnect_timeout=5) as ws:
        await ws.send_message(json.dumps({"type": "turn", "input": "hi"}))
        with trio.fail_after(10):
            while json.loads(await ws.get_message()).get("type") != "session.ended":
                pass
        found = await wait_turn_counted(server, 1)
        assert value(found, "trioserve_stream_clients", transport="websocket") == 1
    route = "/v1/sessions/<session_id>/ws"
    lines = await access_lines(caplog, 1, "WEBSOCKET")
    assert (lines[0]["route"], lines[0]["status"]) == (route, 101)
    assert lines[0]["bytes"] > 0
    found = await scrape(server.client)
    assert value(found, "trioserve_stream_clients", transport="websocket") == 0
    labels = {"method": "WEBSOCKET", "route": route, "status": "101"}
    assert value(found, "trioserve_http_requests_total", **labels) == 1
    assert ended(found, "completed", "completed") == 1


@pytest.mark.parametrize("created", [1_700_000_000.0005, 1_700_000_000.9996, 1_700_000_001.25])
def test_the_text_format_writes_logging_s_own_line(created: float) -> None:
    """The text formatter makes a time's seconds once a second; each line is still what
    logging's formatter writes, across the turn of a second."""
    from trioserve.observe._logformat import TEXT_FORMAT, formatter

    ours, theirs = formatter("text"), logging.Formatter(TEXT_FORMAT)
    for when in (created - 1, created, created + 0.001):
        record = logging.LogRecord("trioserve.x", logging.INFO, "p.py", 1, "m %s", ("a",), None)
        record.created, record.msecs = when, int((when - int(when)) * 1000) + 0.0
        assert ours.format(record) == theirs.format(record)
