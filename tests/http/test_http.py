"""The HTTP API over real sockets: every endpoint, status code and envelope."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import httpx
import pytest
import trio

from tests.helpers import ServerFactory, compiled_spec, parse_sse, script


def assert_envelope(resp: httpx.Response, code: int, *needles: str) -> None:
    assert resp.status_code == code, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert set(body["error"]) == {"code", "reason", "message"}
    for needle in needles:
        assert needle in body["error"]["message"], body


async def raw_get(url: str, path: str, *headers: str) -> tuple[str, dict[str, str], bytes]:
    """GET over a plain socket: the status line, the headers (names lowercased), the body.

    The body is read up to its ``Content-Length``.
    """
    host, port = url.removeprefix("http://").rsplit(":", 1)
    request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\n"
    request += "".join(f"{h}\r\n" for h in headers) + "\r\n"
    data = b""
    with trio.fail_after(10):
        async with await trio.open_tcp_stream(host, int(port)) as stream:
            await stream.send_all(request.encode())
            while b"\r\n\r\n" not in data:
                data += await stream.receive_some(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            status, *lines = head.decode().split("\r\n")
            fields = {}
            for line in lines:
                name, _, value = line.partition(":")
                fields[name.strip().lower()] = value.strip()
            while len(body) < int(fields["content-length"]):
                body += await stream.receive_some(65536)
    return status, fields, body


async def test_health_and_ready_bytes_are_the_references(start_server: ServerFactory) -> None:
    """The reference's bytes: ``w.Write("ok\\n")``, ``http.Error(w, "draining", 503)``."""
    server = await start_server(warm_adapters=1)
    status, headers, body = await raw_get(server.url, "/healthz")
    assert (status, body) == ("HTTP/1.1 200 OK", b"ok\n")
    assert headers["content-type"] == "text/plain; charset=utf-8"
    assert headers["content-length"] == "3"
    status, headers, body = await raw_get(server.url, "/readyz")
    assert (status, body) == ("HTTP/1.1 200 OK", b"ready\n")
    assert headers["content-type"] == "text/plain; charset=utf-8"
    assert "retry-after" not in headers
    assert re.fullmatch(r"\d+/1", headers["trioserve-warm-adapters"])
    resp = await server.client.get("/readyz", headers={"Accept": "application/json"})
    assert resp.status_code == 200 and resp.json()["status"] == "ready"

    server.manager.start_draining()
    status, headers, body = await raw_get(server.url, "/readyz")
    assert (status, body) == ("HTTP/1.1 503 Service Unavailable", b"draining\n")
    assert headers["content-type"] == "text/plain; charset=utf-8"
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["retry-after"] == "1"  # like every other 503
    assert re.fullmatch(r"0/\d+", headers["trioserve-warm-adapters"])
    resp = await server.client.get("/readyz", headers={"Accept": "application/json"})
    assert resp.status_code == 503 and resp.headers["retry-after"] == "1"
    assert resp.json()["status"] == "draining"
    assert resp.json()["warmAdapters"]["ready"] == 0
    # Health is unaffected by the drain.
    status, headers, body = await raw_get(server.url, "/healthz")
    assert (status, body) == ("HTTP/1.1 200 OK", b"ok\n")


async def test_status_lines_carry_the_reason_phrase(start_server: ServerFactory) -> None:
    server = await start_server()
    assert (await raw_get(server.url, "/v1/sessions"))[0] == "HTTP/1.1 200 OK"
    assert (await raw_get(server.url, "/v1/sessions/s_nope"))[0] == "HTTP/1.1 404 Not Found"


async def test_create_session_shapes(start_server: ServerFactory) -> None:
    server = await start_server()
    body: dict[str, Any] | None
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
    assert_envelope(await post("/v1/sessions", content=b"true"), 400, "got a boolean")
    # Wrong types are refused, as Go refuses them (map[string]string).
    assert_envelope(
        await post("/v1/sessions", json={"inputs": {"k": 3}}), 400, "inputs.k", "expected a string"
    )
    resp = await post("/v1/sessions", json={"inputs": [], "extra": 1})
    assert_envelope(resp, 400, "inputs: expected an object, got an array")
    assert "extra" not in resp.json()["error"]["message"]  # unknown fields are not at fault
    assert_envelope(await post("/v1/sessions", json={"inputs": "x"}), 400, "inputs")
    big = b'{"inputs":{"k":"' + b"x" * (1024 * 1024 + 10) + b'"}}'
    assert_envelope(await post("/v1/sessions", content=big), 413, "larger than")


async def test_create_reads_bodies_as_the_reference(
    start_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Go's encoding/json: unknown fields ignored, null is empty, names match in any case."""
    caplog.set_level(logging.DEBUG, logger="trioserve.requests")
    server = await start_server(spec=compiled_spec(task="Hello ${inputs.name}."))

    async def task_of(body: bytes) -> str:
        resp = await server.client.post("/v1/sessions", content=body)
        assert resp.status_code == 201, resp.text
        frames = await server.turn(resp.json()["id"], "")
        return str(frames[1].data["data"]["text"])

    body = b'{"inputs":{"name":"Ada"},"extra":1,"meta":{"x":[1]}}'
    assert await task_of(body) == "echo: Hello Ada."
    ignored = [r for r in caplog.records if r.name == "trioserve.requests"]
    assert len(ignored) == 1 and "'extra', 'meta'" in ignored[0].getMessage(), ignored
    assert ignored[0].levelno == logging.DEBUG
    assert await task_of(b'{"Inputs":{"name":"Ada"}}') == "echo: Hello Ada."
    assert await task_of(b'{"inputs":{"name":null}}') == "echo: Hello ."
    for empty in (b"null", b" null\n", b'{"inputs":null}', b"", b"{}"):
        assert await task_of(empty) == "echo: Hello ${inputs.name}.", empty


async def test_turn_reads_bodies_as_the_reference(
    start_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="trioserve.requests")
    server = await start_server(spec=compiled_spec(task="The task."))
    sid = (await server.create())["id"]
    url = f"/v1/sessions/{sid}/turns"

    async def reply_to(body: bytes) -> str:
        resp = await server.client.post(url, content=body)
        assert resp.status_code == 200, resp.text
        return str(parse_sse(resp.text)[1].data["data"]["text"])

    assert await reply_to(b'{"input":"hi","model":"x","stream":true}') == "echo: hi"
    assert any("'model', 'stream'" in r.getMessage() for r in caplog.records)
    assert await reply_to(b'{"INPUT":"loud"}') == "echo: loud"
    for empty in (b"null", b'{"input":null}', b'{"input":null,"detach":null}', b""):
        assert await reply_to(empty) == "echo: The task.", empty
    resp = await server.client.post(url, json={"input": 7})
    assert_envelope(resp, 400, "input: expected a string, got a number")
    resp = await server.client.post(url, json={"detach": "yes"})
    assert_envelope(resp, 400, "detach: expected a boolean, got a string")


async def test_inputs_interpolation_and_missing_keys(
    start_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trioserve.manager")
    spec = compiled_spec(task="Hello ${inputs.name}, from ${inputs.place}. ${inputs.name}!")
    server = await start_server(spec=spec)
    # As in the reference: a placeholder without a value stays as written.
    partial = await server.create({"inputs": {"place": "Trio", "other": "x"}})
    frames = await server.turn(partial["id"], "")
    text = frames[1].data["data"]["text"]
    assert text == "echo: Hello ${inputs.name}, from Trio. ${inputs.name}!"
    none = await server.create()
    warnings = [r for r in caplog.records if r.name == "trioserve.manager"]
    assert [r.levelno for r in warnings] == [logging.WARNING, logging.WARNING]  # one per create
    first, second = (r.getMessage() for r in warnings)
    assert partial["id"] in first and first.endswith("task: name (left as written)")
    assert none["id"] in second and "task: name, place (left" in second
    session = await server.create({"inputs": {"name": "Ada", "place": "Trio"}})
    assert len([r for r in caplog.records if r.name == "trioserve.manager"]) == 2  # no warning
    # An empty turn input runs the interpolated task (a documented divergence).
    frames = await server.turn(session["id"], "")
    assert frames[1].data["data"]["text"] == "echo: Hello Ada, from Trio. Ada!"
    frames = await server.turn(session["id"], "explicit")
    assert frames[1].data["data"]["text"] == "echo: explicit"


async def test_require_inputs_refuses_missing_keys(start_server: ServerFactory) -> None:
    spec = compiled_spec(task="Hello ${inputs.name}, from ${inputs.place}.")
    server = await start_server(spec=spec, require_inputs=True)
    resp = await server.client.post("/v1/sessions", json={"inputs": {"other": "x"}})
    assert_envelope(resp, 400, "missing inputs referenced by the spec's task: name, place")
    assert (await server.client.get("/v1/sessions")).json() == []  # nothing was created
    session = await server.create({"inputs": {"name": "Ada", "place": "Trio"}})
    frames = await server.turn(session["id"], "")
    assert frames[1].data["data"]["text"] == "echo: Hello Ada, from Trio."


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
    # As in the reference, a status no session has matches nothing.
    for unknown in ("bogus", "ACTIVE", "active "):
        resp = await server.client.get("/v1/sessions", params={"status": unknown})
        assert (resp.status_code, resp.json()) == (200, []), unknown
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
    assert_envelope(await post(f"/v1/sessions/{a}/turns", json={"detach": 1}), 400, "detach")
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
        assert (resp.status_code, resp.text) == (503, "draining\n")
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
