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

from cliserver import start_cli_server, write_spec
from conftest import ServerFactory, raw_request, script
from trioserve.auth import KeyEntry, KeyRing, digest

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
                fields_of(r) for r in access_records(caplog) if method is None or r.method == method
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
