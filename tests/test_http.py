"""The HTTP API over real sockets: every endpoint, status code and envelope."""

from __future__ import annotations

import json
import re

import httpx
import trio

from conftest import ServerFactory, compiled_spec, parse_sse, script


def assert_envelope(resp: httpx.Response, code: int, *needles: str) -> None:
    assert resp.status_code == code, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert set(body["error"]) == {"code", "reason", "message"}
    for needle in needles:
        assert needle in body["error"]["message"], body


async def test_health_and_ready(start_server: ServerFactory) -> None:
    server = await start_server()
    resp = await server.client.get("/healthz")
    assert (resp.status_code, resp.text) == (200, "ok")
    resp = await server.client.get("/readyz")
    assert (resp.status_code, resp.text) == (200, "ready")


async def test_create_session_shapes(start_server: ServerFactory) -> None:
    server = await start_server()
    for body in (None, {}, {"inputs": {}}):
        resp = await server.client.post("/v1/sessions", json=body)
        assert resp.status_code == 201, resp.text
        session = resp.json()
        assert set(session) == {
            "id",
            "agentName",
            "runtimeType",
            "status",
            "createdAt",
            "lastActiveAt",
        }
        assert re.fullmatch(r"s_[0-9a-z]+[0-9a-f]{8}", session["id"])
        assert session["agentName"] == "test-agent"
        assert session["runtimeType"] == "exec"
        assert session["status"] == "active"
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", session["createdAt"])
    resp = await server.client.post("/v1/sessions", content=b"")
    assert resp.status_code == 201


async def test_create_rejects_bad_bodies(start_server: ServerFactory) -> None:
    server = await start_server()
    post = server.client.post
    assert_envelope(await post("/v1/sessions", content=b"{nope"), 400, "malformed JSON")
    assert_envelope(await post("/v1/sessions", content=b"[1]"), 400, "expected a JSON object")
    assert_envelope(
        await post("/v1/sessions", json={"inputs": {"k": 3}}), 400, "inputs.k", "expected a string"
    )
    assert_envelope(
        await post("/v1/sessions", json={"inputs": [], "extra": 1}),
        400,
        "inputs: expected an object",
        "extra: unknown field",
    )
    big = b'{"inputs":{"k":"' + b"x" * (1024 * 1024 + 10) + b'"}}'
    assert_envelope(await post("/v1/sessions", content=big), 413, "larger than")


async def test_inputs_interpolation_and_missing_keys(start_server: ServerFactory) -> None:
    spec = compiled_spec(task="Hello ${inputs.name}, from ${inputs.place}. ${inputs.name}!")
    server = await start_server(spec=spec)
    resp = await server.client.post("/v1/sessions", json={"inputs": {"other": "x"}})
    assert_envelope(resp, 400, "missing inputs", "name, place")
    session = await server.create({"inputs": {"name": "Ada", "place": "Trio"}})
    # An empty turn input runs the interpolated task (a documented divergence).
    frames = await server.turn(session["id"], "")
    assert frames[1].data["data"]["text"] == "echo: Hello Ada, from Trio. Ada!"
    frames = await server.turn(session["id"], "explicit")
    assert frames[1].data["data"]["text"] == "echo: explicit"


async def test_get_list_delete(start_server: ServerFactory) -> None:
    server = await start_server()
    a = await server.create()
    b = await server.create()
    resp = await server.client.get(f"/v1/sessions/{a['id']}")
    assert resp.status_code == 200 and resp.json()["id"] == a["id"]
    assert_envelope(await server.client.get("/v1/sessions/s_missing"), 404, "s_missing")
    await server.turn(a["id"], "touch")  # a is now the most recently active
    listed = (await server.client.get("/v1/sessions")).json()
    assert [s["id"] for s in listed] == [a["id"], b["id"]]
    assert (await server.client.delete(f"/v1/sessions/{b['id']}")).status_code == 204
    assert (await server.client.delete(f"/v1/sessions/{b['id']}")).status_code == 204
    assert_envelope(await server.client.delete("/v1/sessions/s_missing"), 404)
    ended = (await server.client.get("/v1/sessions", params={"status": "ended"})).json()
    assert [s["id"] for s in ended] == [b["id"]]
    assert ended[0]["status"] == "ended"
    active = (await server.client.get("/v1/sessions?status=active")).json()
    assert [s["id"] for s in active] == [a["id"]]
    assert (await server.client.get("/v1/sessions?status=expired")).json() == []
    assert_envelope(
        await server.client.get("/v1/sessions?status=bogus"), 400, "bogus", "active, ended"
    )
    assert_envelope(await server.client.get("/v1/sessions?limit=x"), 400, "limit")
    one = (await server.client.get("/v1/sessions?limit=1")).json()
    assert len(one) == 1


async def test_unknown_routes_and_methods(start_server: ServerFactory) -> None:
    server = await start_server()
    assert_envelope(await server.client.get("/v2/nothing"), 404, "GET /v2/nothing")
    resp = await server.client.put("/v1/sessions")
    assert_envelope(resp, 405, "PUT")
    assert "POST" in resp.headers["allow"]
    resp = await server.client.put("/v1/sessions/s_x/turns")
    assert_envelope(resp, 405)
    assert {"GET", "POST"} <= set(resp.headers["allow"].split(", "))


async def test_turn_stream_framing(start_server: ServerFactory) -> None:
    server = await start_server()
    session = await server.create()
    resp = await server.client.post(f"/v1/sessions/{session['id']}/turns", json={"input": "hi"})
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "text/event-stream"
    assert resp.headers["cache-control"] == "no-cache"
    assert resp.headers["x-accel-buffering"] == "no"
    blocks = resp.text.split("\n\n")
    assert blocks[-1] == ""
    for n, block in enumerate(blocks[:-1], start=1):
        # The reference's two lines, in its order; then the event's seq as its id.
        lines = block.split("\n")
        assert len(lines) == 3, lines
        assert lines[0].startswith("event: ") and lines[1].startswith("data: ")
        assert lines[2] == f"id: {n}"
        assert json.loads(lines[1].removeprefix("data: "))["seq"] == n
    frames = parse_sse(resp.text)
    assert [f.event for f in frames] == ["session.started", "message", "session.ended"]
    assert all(f.data["sessionId"] == session["id"] for f in frames)
    # The adapter's own bytes reach the client untouched (field order, spacing).
    assert '"ts": "2026-01-01T00:00:00Z"' in blocks[0]


async def test_unknown_event_types_and_fields_pass_through(start_server: ServerFactory) -> None:
    server = await start_server()
    session = await server.create()
    raw = '{"v":1,"type":"custom.thing","sessionId":"x","data":{"a":[1,2]},"extraTop":true}'
    frames = await server.turn(session["id"], script({"raw": raw}, {"end": "completed"}))
    assert frames[1].event == "custom.thing"
    assert frames[1].data["extraTop"] is True
    resp = await server.client.post(
        f"/v1/sessions/{session['id']}/turns",
        json={"input": script({"raw": raw}, {"end": "completed"})},
    )
    # The adapter's bytes, byte for byte, after the seq the server puts first.
    assert '\ndata: {"seq":5,' + raw[1:] + "\nid: 5\n\n" in resp.text


async def test_turn_refusal_order(start_server: ServerFactory) -> None:
    """503 draining > 400 malformed > 404 unknown/terminal > 409 busy > 429 cap."""
    server = await start_server(max_concurrent_turns=1)
    post = server.client.post
    a = (await server.create())["id"]
    b = (await server.create())["id"]
    gone = (await server.create())["id"]
    await server.client.delete(f"/v1/sessions/{gone}")

    assert_envelope(await post("/v1/sessions/s_nope/turns", content=b"{"), 400, "malformed")
    assert_envelope(await post(f"/v1/sessions/{a}/turns", json={"input": 1}), 400, "input")
    assert_envelope(await post(f"/v1/sessions/{a}/turns", json={"inputs": "x"}), 400, "unknown")
    assert_envelope(await post("/v1/sessions/s_nope/turns", json={"input": "x"}), 404)
    assert_envelope(await post(f"/v1/sessions/{gone}/turns", json={"input": "x"}), 404, "ended")

    started = trio.Event()
    async with trio.open_nursery() as nursery:

        async def hold() -> None:
            url = f"/v1/sessions/{a}/turns"
            body = {"input": script({"sleep": 30})}
            async with server.client.stream("POST", url, json=body) as resp:
                # Keep the iterator referenced: a collected one closes the stream.
                chunks = resp.aiter_bytes()
                await chunks.__anext__()
                started.set()
                await trio.sleep_forever()  # keep the stream (and the turn) open

        nursery.start_soon(hold)
        await started.wait()
        # a is busy (409) even though the cap is also reached: 409 comes first.
        assert_envelope(await post(f"/v1/sessions/{a}/turns", json={"input": "x"}), 409, a)
        assert_envelope(await post(f"/v1/sessions/{b}/turns", json={"input": "x"}), 429, "max 1")
        # 404 comes before 409/429 too.
        assert_envelope(await post(f"/v1/sessions/{gone}/turns", json={"input": "x"}), 404)
        server.manager.start_draining()
        assert_envelope(await post(f"/v1/sessions/{a}/turns", content=b"{"), 503, "draining")
        assert_envelope(await post("/v1/sessions", content=b"{"), 503, "draining")
        resp = await server.client.get("/readyz")
        assert (resp.status_code, resp.text) == (503, "draining")
        assert resp.headers.get("connection") == "close"
        assert (await server.client.get("/healthz")).status_code == 200
        nursery.cancel_scope.cancel()


async def test_turn_failures_before_any_frame(start_server: ServerFactory) -> None:
    server = await start_server(command=["/nonexistent/adapter-binary"])
    session = await server.create()
    frames = await server.turn(session["id"], "x")
    assert [f.event for f in frames] == ["error"]
    assert "adapter failed to start" in frames[0].data["data"]["message"]
    assert frames[0].data["sessionId"] == session["id"]
    # The session still works for the next turn (still refused the same way).
    frames = await server.turn(session["id"], "x")
    assert [f.event for f in frames] == ["error"]
