"""Durable turns over real sockets: the event log, turn records, re-attaching with a
cursor, follow, detached turns, disconnect policy, retention and the JSON export.

The tests marked ``backends(*DURABLE)`` run on a SQLite file and on a PostgreSQL
schema (tests/helpers/backends.py); the others on the memory store."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio

from tests.helpers import (
    Frame,
    Server,
    ServerFactory,
    parse_sse,
    pid_alive,
    read_frames,
    script,
    wait_gone,
)
from tests.helpers.backends import DURABLE

TICKS = 200
TICKING = script({"tick": TICKS, "every": 0.005}, {"end": "completed"})
HANG = script({"event": "message", "data": {"ready": 1}}, {"hang": True})


@pytest.fixture
async def durable_server(start_server: ServerFactory, backend_url: str) -> Server:
    """A server on this cell's store (its tests are marked ``backends(*DURABLE)``)."""
    return await start_server(store=backend_url)


def turns_url(session_id: str) -> str:
    return f"/v1/sessions/{session_id}/turns"


def events_url(session_id: str) -> str:
    return f"/v1/sessions/{session_id}/events"


async def collect(resp: httpx.Response) -> list[Frame]:
    assert resp.status_code == 200, await resp.aread()
    return [f async for f in read_frames(resp) if f.event != "comment"]


async def get_events(server: Server, session_id: str, **kw: Any) -> list[Frame]:
    with trio.fail_after(30):
        async with server.client.stream("GET", events_url(session_id), **kw) as resp:
            return await collect(resp)


async def wait_turn(server: Server, session_id: str, turn_id: str) -> dict[str, Any]:
    """Poll the turn record until it has finished; return it."""
    with trio.fail_after(15):
        while True:
            record: dict[str, Any] = (
                await server.client.get(f"{turns_url(session_id)}/{turn_id}")
            ).json()
            if record["status"] != "running":
                return record
            await trio.sleep(0.02)


def ticks(frames: list[Frame]) -> list[int]:
    return [f.data["data"]["i"] for f in frames if f.event == "message" and "i" in f.data["data"]]


def assert_numbered_from(frames: list[Frame], first: int) -> None:
    """Frames carry their seq as the SSE id and in the JSON, one by one from ``first``."""
    assert [f.seq for f in frames] == list(range(first, first + len(frames)))
    assert all(f.data["seq"] == f.seq for f in frames)


# -- re-attach -------------------------------------------------------------------------


@pytest.mark.backends(*DURABLE)
async def test_reconnect_mid_turn_with_last_event_id_loses_and_repeats_nothing(
    durable_server: Server,
) -> None:
    server = durable_server
    sid = (await server.create())["id"]
    first: list[Frame] = []
    body = {"input": TICKING, "onDisconnect": "continue"}
    async with server.client.stream("POST", turns_url(sid), json=body) as resp:
        turn_id = resp.headers["trioserve-turn-id"]
        async for frame in read_frames(resp):
            first.append(frame)
            if len(first) == 30:
                break  # the connection drops in the middle of the turn
    assert turn_id.startswith("t_")
    record = (await server.client.get(f"{turns_url(sid)}/{turn_id}")).json()
    assert record["status"] == "running", "the turn must still be producing events"
    second = await get_events(server, sid, headers={"Last-Event-ID": first[-1].id})
    union = first + second
    assert_numbered_from(union, 1)
    assert ticks(union) == list(range(TICKS))
    assert union[0].event == "session.started"
    assert union[-1].event == "session.ended" and union[-1].data["data"]["reason"] == "completed"
    assert (await wait_turn(server, sid, turn_id))["status"] == "completed"


@pytest.mark.backends(*DURABLE)
async def test_resume_after_the_turn_ended_and_after_query(durable_server: Server) -> None:
    server = durable_server
    sid = (await server.create())["id"]
    whole = await server.turn(sid, script({"tick": 5, "every": 0}, {"end": "completed"}))
    assert_numbered_from(whole, 1)
    rest = await get_events(server, sid, params={"after": 3})
    assert [f.data for f in rest] == [f.data for f in whole[3:]]
    # The header wins over the query (an EventSource reconnects with its URL unchanged).
    rest = await get_events(server, sid, params={"after": 0}, headers={"Last-Event-ID": "5"})
    assert [f.seq for f in rest] == [6, 7]
    assert await get_events(server, sid, params={"after": whole[-1].seq}) == []
    assert [f.data for f in await get_events(server, sid)] == [f.data for f in whole]


async def test_follow_stays_open_across_turns_with_heartbeats(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    server = await start_server(heartbeat=0.1)
    sid = (await server.create())["id"]
    seen: list[Frame] = []
    comments = 0
    ended = trio.Event()

    async def follow() -> None:
        nonlocal comments
        async with server.client.stream(
            "GET", events_url(sid), params={"follow": "true"}, timeout=30
        ) as resp:
            async for frame in read_frames(resp):
                if frame.event == "comment":
                    comments += 1
                else:
                    seen.append(frame)
        ended.set()

    nursery.start_soon(follow)
    await trio.sleep(0.35)  # quiet: heartbeats only
    one = await server.turn(sid, "one")
    two = await server.turn(sid, "two")
    with trio.fail_after(10):
        while len(seen) < len(one) + len(two):
            await trio.sleep(0.01)
    assert [f.data for f in seen] == [f.data for f in one + two]
    assert comments >= 2
    assert not ended.is_set(), "follow stays open between turns"
    assert (await server.client.delete(f"/v1/sessions/{sid}")).status_code == 204
    with trio.fail_after(10):
        await ended.wait()


async def test_follow_while_draining_is_503_and_a_replay_still_works(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    sid = (await server.create())["id"]
    frames = await server.turn(sid, "one")
    server.manager.start_draining()
    resp = await server.client.get(events_url(sid), params={"follow": "true"})
    assert (resp.status_code, resp.json()["error"]["reason"]) == (503, "draining")
    assert resp.headers["retry-after"] == "1"
    assert [f.data for f in await get_events(server, sid)] == [f.data for f in frames]


@pytest.mark.backends(*DURABLE)
async def test_turn_filter_and_turn_records(durable_server: Server) -> None:
    server = durable_server
    sid = (await server.create())["id"]
    await server.turn(sid, "one")
    resp = await server.client.post(turns_url(sid), json={"input": "two"})
    two_id = resp.headers["trioserve-turn-id"]
    two = parse_sse(resp.text)
    await server.turn(sid, "three")
    records = (await server.client.get(turns_url(sid))).json()
    assert [r["input"] for r in records] == ["one", "two", "three"]
    assert [r["status"] for r in records] == ["completed"] * 3
    assert [r["reason"] for r in records] == ["completed"] * 3
    assert [(r["firstSeq"], r["lastSeq"]) for r in records] == [(1, 3), (4, 6), (7, 9)]
    record = records[1]
    assert record["id"] == two_id and record["sessionId"] == sid
    assert record["createdAt"] <= record["startedAt"] <= record["endedAt"]
    assert (await server.client.get(f"{turns_url(sid)}/{two_id}")).json() == record
    only = await get_events(server, sid, params={"turn": two_id})
    assert [f.data for f in only] == [f.data for f in two]
    later = await get_events(server, sid, params={"turn": two_id, "after": 5})
    assert [f.seq for f in later] == [6]


@pytest.mark.backends(*DURABLE)
async def test_detached_turn_then_reattach(durable_server: Server) -> None:
    server = durable_server
    sid = (await server.create())["id"]
    resp = await server.client.post(turns_url(sid), json={"input": TICKING, "detach": True})
    assert resp.status_code == 202
    record = resp.json()
    assert record["status"] == "running" and record["sessionId"] == sid
    assert resp.headers["location"] == f"/v1/sessions/{sid}/turns/{record['id']}"
    assert resp.headers["trioserve-turn-id"] == record["id"]
    # It holds the session like any turn.
    busy = await server.client.post(turns_url(sid), json={"input": "x"})
    assert busy.status_code == 409
    frames = await get_events(server, sid, params={"turn": record["id"]})
    assert_numbered_from(frames, 1)
    assert ticks(frames) == list(range(TICKS))
    done = await wait_turn(server, sid, record["id"])
    assert (done["status"], done["firstSeq"], done["lastSeq"]) == ("completed", 1, len(frames))


@pytest.mark.backends(*DURABLE)
async def test_continue_runs_on_after_the_client_left(
    start_server: ServerFactory, backend_url: str
) -> None:
    server = await start_server(store=backend_url, processes=True)
    sid = (await server.create())["id"]
    text = script({"event": "message", "data": {"n": 1}}, {"sleep": 0.5}, {"end": "completed"})
    body = {"input": text, "onDisconnect": "continue"}
    async with server.client.stream("POST", turns_url(sid), json=body) as resp:
        turn_id = resp.headers["trioserve-turn-id"]
        async for frame in read_frames(resp):
            pid = frame.data["data"]["pid"]
            break
    assert pid_alive(pid)
    record = await wait_turn(server, sid, turn_id)
    assert (record["status"], record["reason"]) == ("completed", "completed")
    frames = await get_events(server, sid)
    assert [f.event for f in frames] == ["session.started", "message", "session.ended"]


@pytest.mark.backends(*DURABLE)
async def test_default_disconnect_cancels_and_the_log_says_so(
    start_server: ServerFactory, backend_url: str
) -> None:
    server = await start_server(store=backend_url, processes=True)
    sid = (await server.create())["id"]
    async with server.client.stream("POST", turns_url(sid), json={"input": HANG}) as resp:
        turn_id = resp.headers["trioserve-turn-id"]
        async for frame in read_frames(resp):
            if frame.event == "session.started":
                pid = frame.data["data"]["pid"]
            else:
                break  # left once the adapter is hanging
    await wait_gone(pid)
    record = await wait_turn(server, sid, turn_id)
    assert (record["status"], record["reason"]) == ("cancelled", "client_disconnected")
    frames = await get_events(server, sid)
    assert [f.event for f in frames] == ["session.started", "message", "session.ended"]
    assert frames[-1].data["data"] == {"reason": "cancelled", "message": "client disconnected"}


async def test_failed_and_cancelled_turn_records(start_server: ServerFactory) -> None:
    server = await start_server()
    sid = (await server.create())["id"]
    crashed = await server.client.post(turns_url(sid), json={"input": script({"exit": 3})})
    record = await server.client.get(f"{turns_url(sid)}/{crashed.headers['trioserve-turn-id']}")
    assert (record.json()["status"], record.json()["reason"]) == ("failed", "adapter_exit")
    reported = await server.client.post(turns_url(sid), json={"input": script({"end": "error"})})
    record = await server.client.get(f"{turns_url(sid)}/{reported.headers['trioserve-turn-id']}")
    assert (record.json()["status"], record.json()["reason"]) == ("failed", "error")
    assert (await server.client.get(f"{turns_url(sid)}/t_nope")).json()["error"] == {
        "code": 404,
        "reason": "not_found",
        "message": f"turn t_nope of session {sid} not found",
    }


# -- retention, export, refusals -----------------------------------------------------


@pytest.mark.backends(*DURABLE)
async def test_retention_drops_old_events_and_old_cursors_get_410(
    start_server: ServerFactory, backend_url: str
) -> None:
    server = await start_server(store=backend_url, event_retention=0.5)
    sid = (await server.create())["id"]
    first = (await server.client.post(turns_url(sid), json={"input": "old"})).headers
    with trio.fail_after(10):
        while (await server.client.get(events_url(sid), params={"format": "json"})).is_success:
            await trio.sleep(0.1)  # the sweep runs every second
    await server.turn(sid, "new")
    resp = await server.client.get(events_url(sid))
    assert resp.status_code == 410
    assert resp.json()["error"]["reason"] == "cursor_expired"
    assert resp.json()["error"]["earliestSeq"] == 4
    assert "no longer retained" in resp.json()["error"]["message"]
    expired = await server.client.get(events_url(sid), params={"turn": first["trioserve-turn-id"]})
    assert expired.status_code == 410
    # From the earliest retained seq on, the log is all there.
    assert [f.seq for f in await get_events(server, sid, params={"after": 3})] == [4, 5, 6]
    # The turn record stays, with its seq range.
    old = (await server.client.get(f"{turns_url(sid)}/{first['trioserve-turn-id']}")).json()
    assert (old["firstSeq"], old["lastSeq"]) == (1, 3)


async def test_export_as_one_json_array(start_server: ServerFactory) -> None:
    server = await start_server()
    sid = (await server.create())["id"]
    frames = await server.turn(sid, "one") + await server.turn(sid, "two")
    resp = await server.client.get(events_url(sid), params={"format": "json"})
    assert resp.headers["content-type"] == "application/json"
    assert resp.json() == [f.data for f in frames]
    resp = await server.client.get(events_url(sid), params={"format": "json", "after": 4})
    assert resp.json() == [f.data for f in frames[4:]]
    empty = (await server.create())["id"]
    assert (await server.client.get(events_url(empty), params={"format": "json"})).json() == []


@pytest.mark.parametrize(
    ("params", "headers", "status", "needle"),
    [
        ({"after": "x"}, {}, 400, "after must be a non-negative integer"),
        ({"after": "-1"}, {}, 400, "after must be a non-negative integer"),
        ({}, {"Last-Event-ID": "abc"}, 400, "Last-Event-ID must be"),
        ({"after": "99"}, {}, 400, "past the end of session"),
        ({"follow": "maybe"}, {}, 400, "follow must be true or false"),
        ({"format": "xml"}, {}, 400, "format must be sse or json"),
        ({"turn": "t_nope"}, {}, 404, "turn t_nope of session"),
    ],
)
async def test_bad_cursors_and_options(
    start_server: ServerFactory,
    params: dict[str, str],
    headers: dict[str, str],
    status: int,
    needle: str,
) -> None:
    server = await start_server()
    sid = (await server.create())["id"]
    await server.turn(sid, "one")
    resp = await server.client.get(events_url(sid), params=params, headers=headers)
    assert resp.status_code == status, resp.text
    assert needle in resp.json()["error"]["message"]
    unknown = await server.client.get(events_url("s_nope"))
    assert (unknown.status_code, unknown.json()["error"]["reason"]) == (404, "not_found")


async def test_a_reader_far_behind_a_running_turn_reads_the_store(
    start_server: ServerFactory,
) -> None:
    """More than the feed's memory window: the start of the turn comes from the store."""
    server = await start_server()
    sid = (await server.create())["id"]
    many = 60_000  # ~4.7 MB of events, over the 4 MiB window
    text = script({"many": many}, {"event": "message", "data": {"last": True}}, {"hang": True})
    resp = await server.client.post(turns_url(sid), json={"input": text, "detach": True})
    turn_id = resp.json()["id"]
    record_url = f"{turns_url(sid)}/{turn_id}"
    with trio.fail_after(30):
        while (await server.client.get(record_url)).json()["lastSeq"] != many + 2:
            await trio.sleep(0.05)
    got: list[Frame] = []
    with trio.fail_after(30):
        async with server.client.stream("GET", events_url(sid)) as stream:
            async for frame in read_frames(stream):
                got.append(frame)
                if frame.data["data"].get("last"):
                    await server.client.delete(f"{turns_url(sid)}/current")
    assert_numbered_from(got, 1)
    assert [f.data["data"]["i"] for f in got[1:-2]] == list(range(many))
    assert got[-1].event == "session.ended"


# -- WebSocket resume ------------------------------------------------------------------


async def test_websocket_resume(start_server: ServerFactory) -> None:
    from tests.helpers.ws import connect, receive, send

    server = await start_server()
    sid = (await server.create())["id"]
    frames = await server.turn(sid, "one")
    async with connect(server, sid) as ws:
        await send(ws, {"type": "resume", "after": 1})
        got = [await receive(ws) for _ in frames[1:]]
        assert got == [f.data for f in frames[1:]]
        assert await receive(ws) == {"type": "trioserve.resume.end", "lastSeq": 3}
        # Nothing after the cursor: just the end.
        await send(ws, {"type": "resume", "after": 3})
        assert await receive(ws) == {"type": "trioserve.resume.end", "lastSeq": 3}
        await send(ws, {"type": "resume", "after": 9})
        error = (await receive(ws))["error"]
        assert (error["code"], error["reason"]) == (400, "invalid_request")
        # A resume while a turn runs follows it to its end.
        text = script({"tick": 3, "every": 0.1}, {"end": "completed"})
        await send(ws, {"type": "turn", "input": text})
        started = await receive(ws)
        async with connect(server, sid) as other:
            await send(other, {"type": "resume", "after": started["seq"]})
            rest = []
            while (message := await receive(other))["type"] != "trioserve.resume.end":
                rest.append(message)
        assert [m["seq"] for m in rest] == list(range(started["seq"] + 1, started["seq"] + 5))
        assert json.dumps(rest[-1]).count("session.ended") == 1
