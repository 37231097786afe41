"""Live turns over SSE: cancel, deadlines, heartbeats, drain notice, error reasons."""

from __future__ import annotations

import json

import httpx
import trio

from tests.helpers import Server, ServerFactory, compiled_spec, parse_sse, script, wait_gone
from trioserve.spec._runtimes import echo_command

HANG = script({"event": "message", "data": {"ready": 1}}, {"hang": True})


async def open_turn(
    server: Server, session_id: str, text: str, nursery: trio.Nursery
) -> tuple[trio.Event, list[str], dict[str, int]]:
    """Start a streaming turn in the background; returns (done, chunks, info)."""
    done = trio.Event()
    chunks: list[str] = []
    info: dict[str, int] = {}
    ready = trio.Event()

    async def run() -> None:
        url = f"/v1/sessions/{session_id}/turns"
        async with server.client.stream("POST", url, json={"input": text}) as resp:
            info["status"] = resp.status_code
            async for chunk in resp.aiter_text():
                chunks.append(chunk)
                joined = "".join(chunks)
                if "pid" not in info and '"pid"' in joined:
                    first = parse_sse(joined.split("\n\n", 1)[0] + "\n\n")[0]
                    info["pid"] = first.data["data"]["pid"]
                if "pid" in info or "session.ended" in joined:
                    ready.set()
        ready.set()
        done.set()

    nursery.start_soon(run)
    with trio.fail_after(10):
        await ready.wait()
    return done, chunks, info


async def test_cancel_running_turn(start_server: ServerFactory, nursery: trio.Nursery) -> None:
    server = await start_server(adapter_stop_grace=2.0, processes=True)
    sid = (await server.create())["id"]
    done, chunks, info = await open_turn(server, sid, HANG, nursery)
    resp = await server.client.delete(f"/v1/sessions/{sid}/turns/current")
    assert (resp.status_code, resp.json()) == (202, {"turnCancelled": True})
    with trio.fail_after(5):
        await done.wait()
    await wait_gone(info["pid"])
    frames = parse_sse("".join(chunks))
    ends = [f for f in frames if f.event == "session.ended"]
    assert len(ends) == 1 and ends[0].data["data"]["reason"] == "cancelled"
    assert frames[-1].event == "session.ended"
    assert not [f for f in frames if f.event == "error"], "a cancel is not an error"
    # The session stays active and takes the next turn.
    assert (await server.client.get(f"/v1/sessions/{sid}")).json()["status"] == "active"
    frames = await server.turn(sid, "next")
    assert frames[-1].data["data"]["reason"] == "completed"


async def test_cancel_keeps_the_adapters_own_session_ended(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    spec = compiled_spec(runtime="echo")
    spec["runtime"]["options"] = {"chunkSize": 1, "delayMs": 500}
    server = await start_server(spec=spec, command=echo_command())
    sid = (await server.create())["id"]
    done, chunks, _ = await open_turn(server, sid, "a long reply to interrupt", nursery)
    with trio.fail_after(5):
        while "delta" not in "".join(chunks):
            await trio.sleep(0.01)
    assert (await server.client.delete(f"/v1/sessions/{sid}/turns/current")).status_code == 202
    with trio.fail_after(5):
        await done.wait()
    frames = parse_sse("".join(chunks))
    ends = [f for f in frames if f.event == "session.ended"]
    assert len(ends) == 1
    # The echo adapter answers SIGINT with its own session.ended (its apiVersion field
    # shows it is the adapter's line, not one the server made).
    assert ends[0].data["data"] == {"reason": "cancelled"}
    assert ends[0].data["apiVersion"] == "agent-controller.dev/events/v1alpha1"


async def test_cancel_with_nothing_running(start_server: ServerFactory) -> None:
    server = await start_server()
    sid = (await server.create())["id"]
    resp = await server.client.delete(f"/v1/sessions/{sid}/turns/current")
    assert resp.status_code == 404
    assert resp.json()["error"]["reason"] == "no_turn"
    resp = await server.client.delete("/v1/sessions/s_nope/turns/current")
    assert resp.status_code == 404
    assert resp.json()["error"]["reason"] == "not_found"


async def test_turn_deadline_stops_a_hanging_adapter(start_server: ServerFactory) -> None:
    server = await start_server(turn_timeout=1.0, adapter_stop_grace=0.5, processes=True)
    sid = (await server.create())["id"]
    text = script({"ignore_sigint": True}, {"hang": True})
    with trio.fail_after(10):
        frames = await server.turn(sid, text)
    assert [f.event for f in frames] == ["session.started", "error", "session.ended"]
    error = frames[1].data["data"]
    assert error["reason"] == "turn_timeout"
    assert "1s" in error["message"]
    assert frames[2].data["data"]["reason"] == "cancelled"
    await wait_gone(frames[0].data["data"]["pid"])
    frames = await server.turn(sid, "after")
    assert frames[-1].data["data"]["reason"] == "completed"


async def test_heartbeats_on_a_quiet_stream(start_server: ServerFactory) -> None:
    server = await start_server(heartbeat=0.2)
    sid = (await server.create())["id"]
    resp = await server.client.post(
        f"/v1/sessions/{sid}/turns",
        json={"input": script({"sleep": 1.1}, {"end": "completed"})},
    )
    assert resp.text.count(": keep-alive\n\n") >= 3
    frames = parse_sse(resp.text)
    assert [f.event for f in frames] == ["session.started", "session.ended"]
    # A busy stream sends none.
    resp = await server.client.post(f"/v1/sessions/{sid}/turns", json={"input": "hi"})
    assert ": keep-alive" not in resp.text


async def test_shutdown_notice_on_streams_past_the_grace(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    server = await start_server(shutdown_grace=0.3, adapter_stop_grace=0.5, processes=True)
    sid = (await server.create())["id"]
    done, chunks, info = await open_turn(server, sid, HANG, nursery)
    server.stop.drain.set()
    with trio.fail_after(10):
        await done.wait()
    frames = parse_sse("".join(chunks))
    assert [f.event for f in frames][-2:] == ["error", "session.ended"]
    assert frames[-2].data["data"]["reason"] == "server_shutdown"
    assert frames[-1].data["data"]["reason"] == "cancelled"
    await wait_gone(info["pid"])


async def test_every_error_has_a_reason_and_retry_after(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    server = await start_server(max_concurrent_turns=1, max_sessions=3)
    c = server.client
    a = (await server.create())["id"]
    b = (await server.create())["id"]

    async def check(resp: httpx.Response, code: int, reason: str) -> None:
        assert resp.status_code == code, resp.text
        body = resp.json()["error"]
        assert (body["code"], body["reason"]) == (code, reason), body
        assert body["message"]
        if code in (429, 503):
            assert int(resp.headers["retry-after"]) >= 1
        else:
            assert "retry-after" not in resp.headers

    await check(await c.post("/v1/sessions", content=b"{"), 400, "invalid_request")
    await check(await c.get("/v1/sessions/s_nope"), 404, "not_found")
    await check(await c.get("/nowhere"), 404, "route_not_found")
    await check(await c.put("/v1/sessions"), 405, "method_not_allowed")
    big = json.dumps({"input": "x" * (1024 * 1024 + 1)})
    await check(await c.post(f"/v1/sessions/{a}/turns", content=big), 413, "payload_too_large")
    await server.create()
    await check(await c.post("/v1/sessions"), 429, "session_cap")
    await open_turn(server, a, HANG, nursery)
    await check(await c.post(f"/v1/sessions/{a}/turns", json={"input": "x"}), 409, "session_busy")
    await check(await c.post(f"/v1/sessions/{b}/turns", json={"input": "x"}), 429, "turn_cap")
    server.manager.start_draining()
    await check(await c.post("/v1/sessions"), 503, "draining")
    await check(await c.post(f"/v1/sessions/{b}/turns", json={"input": "x"}), 503, "draining")
    nursery.cancel_scope.cancel()


async def test_ending_a_session_stops_its_turn(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    server = await start_server(processes=True)
    sid = (await server.create())["id"]
    done, chunks, info = await open_turn(server, sid, HANG, nursery)
    assert (await server.client.delete(f"/v1/sessions/{sid}")).status_code == 204
    with trio.fail_after(10):
        await done.wait()
    frames = parse_sse("".join(chunks))
    assert frames[-1].event == "session.ended"
    assert frames[-1].data["data"] == {"reason": "cancelled", "message": "session ended"}
    await wait_gone(info["pid"])
    assert (await server.client.get(f"/v1/sessions/{sid}")).json()["status"] == "ended"
