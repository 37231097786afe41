"""The protocol faces are imported on their first request, not when the server starts."""

from __future__ import annotations

import importlib
import logging
import subprocess
import sys

import pytest
import trio
from quart_trio import QuartTrio

from tests.helpers import ServerFactory
from trioserve.http._lazy_faces import FACES, Needs, Recorder
from trioserve.http._streams import StreamSlots

SDKS = ("mcp", "a2a", "ag_ui", "google.protobuf")

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"},
    },
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream"}


def test_starting_a_server_imports_no_protocol_sdk() -> None:
    """What ``trioserve run`` imports to serve: none of the faces' SDKs."""
    code = (
        "import sys, trioserve.cli.run, trioserve.server, trioserve.http;"
        f"print(sorted(m for m in {SDKS!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


async def test_routes_declared_for_each_face_are_the_ones_its_module_registers(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    needs = Needs(server.manager, StreamSlots(0), 15.0, auth=False)
    for face in FACES:
        recorder = Recorder(QuartTrio("faces"))
        face.install(recorder, importlib.import_module(face.module), needs)
        declared = {(path, method) for path, methods in face.routes for method in methods}
        assert set(recorder.handlers) == declared, face.name


async def test_first_requests_load_each_face_once_and_all_are_answered(
    start_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trioserve.http")
    server = await start_server()
    created = await server.create()
    await server.turn(created["id"], "hi")  # the v0.8 API loads nothing
    assert not [r for r in caplog.records if "face loaded" in r.getMessage()]

    statuses: list[tuple[str, int]] = []

    async def card() -> None:
        resp = await server.client.get("/.well-known/agent-card.json")
        statuses.append(("card", resp.status_code))

    async def initialize() -> None:
        resp = await server.client.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS)
        statuses.append(("mcp", resp.status_code))

    async def unknown_a2a_method() -> None:
        body = {"jsonrpc": "2.0", "id": 7, "method": "NoSuchMethod", "params": {}}
        resp = await server.client.post("/a2a", json=body)
        statuses.append(("a2a", resp.status_code))
        assert resp.json()["error"]["code"] == -32601

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(card)
            nursery.start_soon(initialize)
            nursery.start_soon(unknown_a2a_method)
    assert sorted(statuses) == sorted([("a2a", 200), ("card", 200), ("mcp", 200)] * 4)
    loaded = [r.getMessage() for r in caplog.records if "face loaded" in r.getMessage()]
    assert sorted(m.split()[0] for m in loaded) == ["a2a", "mcp"]
