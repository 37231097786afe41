"""Double texting over HTTP: ``multitask`` reject, enqueue and interrupt, on every store."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import Server, ServerFactory, script
from tests.helpers.sse import Frame, read_frames
from tests.helpers.ws import connect, receive, send

NAME = "trioserve_queued_turns"
HANG = script({"event": "message", "data": {"ready": 1}}, {"hang": True})


def said(label: str) -> str:
    return script({"event": "message", "data": {"label": label}}, {"end": "completed"})


class Stream:
    """A turn's SSE stream read in the background: its answer, then its frames."""

    def __init__(self) -> None:
        self.status = 0
        self.headers: httpx.Headers | None = None
        self.body = b""
        self.frames: list[Frame] = []
        self.first = trio.Event()  # the answer's head, and its first frame if it is a stream
        self.done = trio.Event()

    @property
    def events(self) -> list[str]:
        return [f.event for f in self.frames if f.event != "comment"]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [f.data for f in self.frames if f.event == kind]


async def open_turn(
    server: Server, nursery: trio.Nursery, sid: str, text: str, **body: Any
) -> Stream:
    """POST a turn whose stream is read in the background; return once it has answered."""
    stream = Stream()

    async def run() -> None:
        url = f"/v1/sessions/{sid}/turns"
        try:
            async with server.client.stream("POST", url, json={"input": text, **body}) as resp:
                stream.status, stream.headers = resp.status_code, resp.headers
                if resp.status_code != 200:
                    stream.body = await resp.aread()
                    stream.first.set()
                    return
                async for frame in read_frames(resp):
                    stream.frames.append(frame)
                    stream.first.set()
        finally:
            stream.first.set()
            stream.done.set()

    nursery.start_soon(run)
    with trio.fail_after(30):
        await stream.first.wait()
    return stream


async def until(stream: Stream, kind: str) -> None:
    with trio.fail_after(30):
        while kind not in stream.events and not stream.done.is_set():
            await trio.sleep(0.01)
    assert kind in stream.events, stream.events


async def finished(stream: Stream) -> None:
    with trio.fail_after(60):
        await stream.done.wait()


async def turns(server: Server, sid: str) -> list[dict[str, Any]]:
    resp = await server.client.get(f"/v1/sessions/{sid}/turns")
    assert resp.status_code == 200, resp.text
    return list(resp.json())


async def queued_gauge(server: Server) -> float:
    """``trioserve_queued_turns`` as ``/metrics`` has it now."""
    resp = await server.client.get("/metrics")
    assert resp.status_code == 200, resp.text
    (family,) = [f for f in text_string_to_metric_families(resp.text) if f.name == NAME]
    (sample,) = family.samples
    return float(sample.value)


async def busy_session(server: Server, nursery: trio.Nursery) -> tuple[str, Stream]:
    """A session whose turn runs until it is stopped."""
    sid = (await server.create())["id"]
    running = await open_turn(server, nursery, sid, HANG)
    await until(running, "message")
    return sid, running


async def test_reject_is_the_default_and_v08s_409(
    start_server: ServerFactory, nursery: trio.Nursery, backend_url: str
) -> None:
    server = await start_server(store=backend_url)
    sid, running = await busy_session(server, nursery)
    for body in ({}, {"multitask": "reject"}):
        resp = await server.client.post(f"/v1/sessions/{sid}/turns", json={"input": "x", **body})
        assert resp.status_code == 409 and resp.json()["error"]["reason"] == "session_busy"
    for value, words in (("rollback", "cannot roll back"), ("later", "multitask"), (1, "")):
        resp = await server.client.post(f"/v1/sessions/{sid}/turns", json={"multitask": value})
        assert resp.status_code == 400, resp.text
        message = resp.json()["error"]["message"]
        assert "multitask" in message and words in message
    assert [t["id"] for t in await turns(server, sid)] == [running.headers["Trioserve-Turn-Id"]]  # type: ignore[index]


async def test_enqueued_turns_run_in_order_of_acceptance(
    start_server: ServerFactory, nursery: trio.Nursery, backend_url: str
) -> None:
    server = await start_server(store=backend_url)
    sid, running = await busy_session(server, nursery)
    queued: dict[str, Stream] = {}

    async def enqueue(label: str) -> None:
        queued[label] = await open_turn(server, nursery, sid, said(label), multitask="enqueue")

    async with trio.open_nursery() as racing:  # three clients at once
        for label in "abc":
            racing.start_soon(enqueue, label)
    firsts = {label: s.frames[0] for label, s in queued.items()}
    for label, frame in firsts.items():
        assert queued[label].status == 200
        assert frame.event == "trioserve.queued" and frame.id is None, frame  # not logged
        assert frame.data["data"]["turnId"] == queued[label].headers["Trioserve-Turn-Id"]  # type: ignore[index]
    by_position = sorted(queued, key=lambda label: firsts[label].data["data"]["position"])
    assert sorted(f.data["data"]["position"] for f in firsts.values()) == [1, 2, 3]
    records = await turns(server, sid)
    assert [t["status"] for t in records] == ["running", "queued", "queued", "queued"]
    accepted = [t["id"] for t in records[1:]]  # GET .../turns: oldest first
    ids = {label: firsts[label].data["data"]["turnId"] for label in queued}
    assert [ids[label] for label in by_position] == accepted

    resp = await server.client.delete(f"/v1/sessions/{sid}/turns/current")
    assert resp.status_code == 202
    await finished(running)
    for label in by_position:
        await finished(queued[label])
        stream = queued[label]
        assert stream.events[1:] == ["session.started", "message", "session.ended"], stream.events
        assert stream.of("message")[0]["data"]["label"] == label
    seqs = [queued[label].frames[1].seq for label in by_position]
    assert seqs == sorted(seqs), "they ran one after another, in the order accepted"
    records = await turns(server, sid)
    assert [t["status"] for t in records] == ["cancelled", "completed", "completed", "completed"]


async def test_the_queue_cap_and_a_detached_enqueue(
    start_server: ServerFactory, nursery: trio.Nursery, backend_url: str
) -> None:
    server = await start_server(store=backend_url, max_queued_turns=2)
    sid, running = await busy_session(server, nursery)
    post = server.client.post
    url = f"/v1/sessions/{sid}/turns"
    detached = await post(url, json={"input": said("d"), "multitask": "enqueue", "detach": True})
    assert detached.status_code == 202, detached.text
    assert detached.json()["status"] == "queued"
    waiting = await open_turn(server, nursery, sid, said("w"), multitask="enqueue")
    assert waiting.frames[0].data["data"]["position"] == 2
    full = await post(url, json={"input": "x", "multitask": "enqueue"})
    assert full.status_code == 429 and full.json()["error"]["reason"] == "queue_full"
    assert full.headers["Retry-After"] == "1"
    assert len(await turns(server, sid)) == 3  # the refused one left no record
    assert await queued_gauge(server) == 2  # the refused one is not counted either

    await server.client.delete(f"/v1/sessions/{sid}/turns/current")
    await finished(waiting)
    assert await queued_gauge(server) == 0
    assert waiting.of("message")[0]["data"]["label"] == "w"
    record = await server.client.get(detached.headers["Location"])
    assert record.json()["status"] == "completed"
    assert record.json()["lastSeq"] < waiting.frames[1].seq  # the detached one ran first
    await finished(running)


async def test_interrupt_stops_the_running_turn_and_starts_at_once(
    start_server: ServerFactory, nursery: trio.Nursery, backend_url: str
) -> None:
    server = await start_server(store=backend_url)
    sid, running = await busy_session(server, nursery)
    behind = await open_turn(server, nursery, sid, said("behind"), multitask="enqueue")
    interrupting = await open_turn(server, nursery, sid, said("now"), multitask="interrupt")
    await finished(running)
    new_id = interrupting.headers["Trioserve-Turn-Id"]  # type: ignore[index]
    (ended,) = running.of("session.ended")
    assert ended["data"] == {"reason": "cancelled", "message": f"interrupted by turn {new_id}"}
    await finished(interrupting)
    assert interrupting.events == ["session.started", "message", "session.ended"]
    assert interrupting.of("message")[0]["data"]["label"] == "now"
    await finished(behind)  # queued turns behind it stayed queued, and run after it
    assert behind.frames[1].seq > interrupting.frames[-1].seq
    records = {t["id"]: t for t in await turns(server, sid)}
    first = records[running.headers["Trioserve-Turn-Id"]]  # type: ignore[index]
    assert (first["status"], first["reason"]) == ("cancelled", "interrupted")
    # interrupt with nothing running starts at once
    alone = await open_turn(server, nursery, sid, said("alone"), multitask="interrupt")
    await finished(alone)
    assert alone.events[0] == "session.started"


async def test_cancel_a_queued_turn_and_leaving_while_queued(
    start_server: ServerFactory, nursery: trio.Nursery, backend_url: str
) -> None:
    server = await start_server(store=backend_url)
    sid, running = await busy_session(server, nursery)
    removed = await open_turn(server, nursery, sid, said("x"), multitask="enqueue")
    kept = await open_turn(
        server, nursery, sid, said("kept"), multitask="enqueue", onDisconnect="continue"
    )
    removed_id = removed.frames[0].data["data"]["turnId"]
    resp = await server.client.delete(f"/v1/sessions/{sid}/turns/{removed_id}")
    assert (resp.status_code, resp.json()) == (202, {"turnCancelled": True})
    await finished(removed)
    assert removed.events == ["trioserve.queued", "session.ended"]
    assert removed.frames[-1].id is None and removed.of("session.ended")[0]["data"]["reason"] == (
        "cancelled"
    )
    record = (await server.client.get(f"/v1/sessions/{sid}/turns/{removed_id}")).json()
    assert (record["status"], record["reason"], record["firstSeq"]) == (
        "cancelled",
        "cancelled",
        None,
    )
    again = await server.client.delete(f"/v1/sessions/{sid}/turns/{removed_id}")
    assert again.status_code == 409 and again.json()["error"]["reason"] == "turn_ended"
    unknown = await server.client.delete(f"/v1/sessions/{sid}/turns/t_nope")
    assert unknown.status_code == 404

    # A client leaving a queued turn: onDisconnect cancel removes it, continue keeps it.
    leaving = await open_turn(server, nursery, sid, said("gone"), multitask="enqueue")
    leaving_id = leaving.frames[0].data["data"]["turnId"]
    kept_id = kept.frames[0].data["data"]["turnId"]
    await _leave(server, sid)
    await server.client.delete(f"/v1/sessions/{sid}/turns/current")
    await finished(kept)
    assert kept.of("message")[0]["data"]["label"] == "kept"
    await finished(leaving)
    statuses = {t["id"]: (t["status"], t["reason"]) for t in await turns(server, sid)}
    assert statuses[kept_id] == ("completed", "completed")
    assert statuses[leaving_id] == ("completed", "completed")  # its client stayed
    await finished(running)


async def _leave(server: Server, sid: str) -> None:
    """A queued turn whose client closes its stream at once: it leaves the line."""
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        url = f"/v1/sessions/{sid}/turns"
        body = {"input": said("left"), "multitask": "enqueue"}
        async with client.stream("POST", url, json=body) as resp:
            async for frame in read_frames(resp):
                assert frame.event == "trioserve.queued"
                left_id = frame.data["data"]["turnId"]
                break
    with trio.fail_after(30):
        while True:
            record = (await server.client.get(f"/v1/sessions/{sid}/turns/{left_id}")).json()
            if record["status"] != "queued":
                break
            await trio.sleep(0.01)
    assert (record["status"], record["reason"]) == ("cancelled", "client_disconnected")


async def test_ending_the_session_ends_its_queued_turns(
    start_server: ServerFactory, nursery: trio.Nursery, backend_url: str
) -> None:
    server = await start_server(store=backend_url)
    sid, running = await busy_session(server, nursery)
    queued = await open_turn(server, nursery, sid, said("q"), multitask="enqueue")
    assert (await server.client.delete(f"/v1/sessions/{sid}")).status_code == 204
    await finished(queued)
    assert queued.events == ["trioserve.queued", "session.ended"]
    await finished(running)
    assert [(t["status"], t["reason"]) for t in await turns(server, sid)] == [
        ("cancelled", "session_ended"),
        ("cancelled", "session_ended"),
    ]


async def test_websocket_turns_enqueue_and_interrupt(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    server = await start_server()
    sid, running = await busy_session(server, nursery)
    async with connect(server, sid) as first, connect(server, sid) as second:
        await send(first, {"type": "turn", "input": said("ws"), "multitask": "enqueue"})
        queued = await receive(first)
        assert queued["type"] == "trioserve.queued" and "seq" not in queued
        assert queued["data"]["position"] == 1
        await send(second, {"type": "turn", "input": said("busy")})  # reject: the default
        refused = await receive(second)
        assert refused["error"]["reason"] == "session_busy"
        await send(second, {"type": "turn", "input": said("now"), "multitask": "interrupt"})
        now = [await receive(second) for _ in range(4)]
        assert [m["type"] for m in now] == [
            "session.started",
            "message",
            "session.ended",
            "trioserve.turn.end",
        ]
        await finished(running)
        assert running.of("session.ended")[0]["data"]["message"].startswith("interrupted by")
        rest = [await receive(first) for _ in range(4)]
        assert [m["type"] for m in rest][1:] == ["message", "session.ended", "trioserve.turn.end"]
        end = rest[-1]
        assert (end["turnId"], end["status"]) == (queued["data"]["turnId"], "completed")
        assert end["lastSeq"] == rest[2]["seq"] > now[2]["seq"]


@pytest.mark.backends("sqlite")
async def test_a_queued_turn_runs_after_a_restart(
    start_server: ServerFactory, nursery: trio.Nursery, backend_url: str
) -> None:
    server = await start_server(store=backend_url, shutdown_grace=0.5)
    sid, running = await busy_session(server, nursery)
    url = f"/v1/sessions/{sid}/turns"
    body = {"input": said("later"), "multitask": "enqueue", "detach": True}
    resp = await server.client.post(url, json=body)
    assert resp.status_code == 202 and resp.json()["status"] == "queued"
    location = resp.headers["Location"]
    server.stop.drain.set()  # the running turn is stopped; the queued one stays queued
    with trio.fail_after(60):
        await server.done.wait()
    await finished(running)

    again = await start_server(store=backend_url)
    with trio.fail_after(60):
        while (record := (await again.client.get(location)).json())["status"] != "completed":
            await trio.sleep(0.02)
    assert record["firstSeq"] > running.frames[-1].seq
    events = await again.client.get(f"/v1/sessions/{sid}/events?format=json&turn={record['id']}")
    labels = [e["data"].get("label") for e in events.json() if e["type"] == "message"]
    assert labels == ["later"]


async def test_a_queued_turn_is_followed_by_id_and_replayed_by_its_key(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    server = await start_server()
    sid, running = await busy_session(server, nursery)
    url = f"/v1/sessions/{sid}/turns"
    body = {"input": said("keyed"), "multitask": "enqueue", "detach": True}
    key = {"Idempotency-Key": "k1"}
    first = await server.client.post(url, json=body, headers=key)
    assert first.status_code == 202, first.text
    turn_id = first.json()["id"]
    followed: list[Frame] = []

    async def follow() -> None:
        path = f"/v1/sessions/{sid}/events"
        async with server.client.stream("GET", path, params={"turn": turn_id}) as resp:
            assert resp.status_code == 200, await resp.aread()
            async for frame in read_frames(resp):
                followed.append(frame)

    async with trio.open_nursery() as readers:
        readers.start_soon(follow)
        again = await server.client.post(url, json=body, headers=key)  # a repeat: no new turn
        assert again.headers["Idempotent-Replayed"] == "true"
        assert (again.json()["id"], again.json()["status"]) == (turn_id, "queued")
        with trio.fail_after(30):
            while not followed:
                await trio.sleep(0.01)
        await server.client.delete(f"/v1/sessions/{sid}/turns/current")
    assert [f.event for f in followed] == [
        "trioserve.queued",
        "session.started",
        "message",
        "session.ended",
    ]
    assert followed[0].data["data"]["turnId"] == turn_id
    assert len(await turns(server, sid)) == 2
    await finished(running)
