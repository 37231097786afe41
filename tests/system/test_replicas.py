"""Replicas: several real ``trioserve run`` processes sharing one PostgreSQL database.

Each test starts two or three servers on loopback ports with the same
``--store postgresql://...`` (a fresh schema per test) and drives them over
HTTP, as a load balancer's clients would.  Skipped when PostgreSQL is not
reachable; under ``CI=true`` they fail instead.
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from trio_websocket import WebSocketConnection, open_websocket_url

from tests.helpers import (
    CLIServer,
    Frame,
    parse_sse,
    pid_alive,
    read_frames,
    script,
    start_cli_server,
    write_spec,
)
from trioserve.http._auth import new_key

LEASE = "2s"
HANG = script({"event": "message", "data": {"ready": 1}}, {"hang": True})


async def replicas(
    nursery: trio.Nursery,
    tmp_path: Path,
    store_url: str,
    count: int,
    *args: str,
    launched: list[CLIServer],
) -> list[CLIServer]:
    spec = write_spec(tmp_path)
    started = [
        await start_cli_server(
            nursery,
            tmp_path,
            spec,
            "--store",
            store_url,
            "--turn-lease",
            LEASE,
            "--warm-adapters",
            "0",
            *args,
        )
        for _ in range(count)
    ]
    launched.extend(started)
    return started


async def create(url: str) -> str:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        resp = await client.post("/v1/sessions", json={})
        assert resp.status_code == 201, resp.text
        return str(resp.json()["id"])


async def turn(url: str, session_id: str, text: str = "hi") -> tuple[int, list[Frame]]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        resp = await client.post(f"/v1/sessions/{session_id}/turns", json={"input": text})
        return resp.status_code, parse_sse(resp.text) if resp.status_code == 200 else []


async def turn_record(url: str, session_id: str) -> dict[str, object]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        resp = await client.get(f"/v1/sessions/{session_id}/turns")
        assert resp.status_code == 200, resp.text
        return dict(resp.json()[-1])


@dataclass
class Streaming:
    """A turn streamed in the background: the frames so far, ``done`` when it ends."""

    frames: list[Frame] = field(default_factory=list)
    done: trio.Event = field(default_factory=trio.Event)


async def stream_turn(
    nursery: trio.Nursery, url: str, session_id: str, text: str, *, cut: bool = False
) -> Streaming:
    """Start a turn on ``url`` read in ``nursery``; return once its first message came.

    With ``cut``, the stream must end in a transport error (its server dies).
    """
    streaming = Streaming()
    running = trio.Event()

    async def read() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            path = f"/v1/sessions/{session_id}/turns"
            async with client.stream("POST", path, json={"input": text}) as resp:
                async for frame in read_frames(resp):
                    streaming.frames.append(frame)
                    if frame.event == "message":
                        running.set()
        streaming.done.set()

    async def read_cut() -> None:
        with pytest.raises(httpx.HTTPError):
            await read()

    nursery.start_soon(read_cut if cut else read)
    with trio.fail_after(20):
        await running.wait()
    return streaming


def seqs(frames: list[Frame]) -> list[int]:
    return [f.seq for f in frames if f.id is not None]


async def test_one_turn_per_session_across_three_replicas(
    nursery: trio.Nursery, tmp_path: Path, store_url: str, launched: list[CLIServer]
) -> None:
    servers = await replicas(nursery, tmp_path, store_url, 3, launched=launched)
    sid = await create(servers[0].url)
    statuses: list[int] = []
    slow = script({"sleep": 1}, {"end": "completed"})

    async def one(url: str) -> None:
        status, frames = await turn(url, sid, slow)
        statuses.append(status)
        if status == 200:
            assert frames[-1].event == "session.ended", frames

    async with trio.open_nursery() as racing:
        for i in range(9):
            racing.start_soon(one, servers[i % 3].url)
    assert sorted(statuses) == [200] + [409] * 8
    # Free again on every replica once it ended.
    for server in servers:
        status, frames = await turn(server.url, sid)
        assert status == 200 and frames[-1].data["data"]["reason"] == "completed"


async def test_session_cap_is_exact_across_replicas(
    nursery: trio.Nursery, tmp_path: Path, store_url: str, launched: list[CLIServer]
) -> None:
    servers = await replicas(
        nursery, tmp_path, store_url, 3, "--max-sessions", "7", launched=launched
    )
    statuses: list[int] = []

    async def one(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            statuses.append((await client.post("/v1/sessions", json={})).status_code)

    async with trio.open_nursery() as racing:
        for i in range(45):
            racing.start_soon(one, servers[i % 3].url)
    assert sorted(statuses) == [201] * 7 + [429] * 38
    async with httpx.AsyncClient(base_url=servers[1].url, timeout=30) as client:
        listed = (await client.get("/v1/sessions", params={"status": "active"})).json()
    assert len(listed) == 7


async def test_turn_cap_is_exact_across_replicas(
    nursery: trio.Nursery, tmp_path: Path, store_url: str, launched: list[CLIServer]
) -> None:
    servers = await replicas(
        nursery, tmp_path, store_url, 2, "--max-concurrent-turns", "3", launched=launched
    )
    sids = [await create(servers[0].url) for _ in range(10)]
    statuses: list[int] = []
    slow = script({"sleep": 1.5}, {"end": "completed"})

    async def one(url: str, sid: str) -> None:
        statuses.append((await turn(url, sid, slow))[0])

    async with trio.open_nursery() as racing:
        for i, sid in enumerate(sids):
            racing.start_soon(one, servers[i % 2].url, sid)
    assert sorted(statuses) == [200] * 3 + [429] * 7


async def test_resume_on_another_replica(
    nursery: trio.Nursery, tmp_path: Path, store_url: str, launched: list[CLIServer]
) -> None:
    a, b = await replicas(nursery, tmp_path, store_url, 2, launched=launched)
    sid = await create(a.url)
    ticking = script({"tick": 40, "every": 0.02}, {"end": "completed"})
    first: list[Frame] = []
    async with httpx.AsyncClient(base_url=a.url, timeout=60) as client:
        url = f"/v1/sessions/{sid}/turns"
        body = {"input": ticking, "onDisconnect": "continue"}
        async with client.stream("POST", url, json=body) as resp:
            assert resp.status_code == 200
            async for frame in read_frames(resp):
                first.append(frame)
                if len(first) == 5:
                    break  # the client goes (its turn keeps running: onDisconnect continue)
    cursor = first[-1].seq
    async with httpx.AsyncClient(base_url=b.url, timeout=60) as client:
        resp = await client.get(f"/v1/sessions/{sid}/events", params={"after": cursor})
        assert resp.status_code == 200, resp.text
        rest = parse_sse(resp.text)
    whole = first + rest
    assert seqs(whole) == list(range(1, len(whole) + 1))
    assert [f.data["data"]["i"] for f in whole if f.event == "message"] == list(range(40))
    assert whole[-1].event == "session.ended"


async def test_follow_on_another_replica_sees_every_event_once(
    nursery: trio.Nursery, tmp_path: Path, store_url: str, launched: list[CLIServer]
) -> None:
    a, b = await replicas(nursery, tmp_path, store_url, 2, launched=launched)
    sid = await create(a.url)
    followed: list[Frame] = []
    following = trio.Event()
    done = trio.Event()

    async def follow() -> None:
        async with httpx.AsyncClient(base_url=b.url, timeout=60) as client:
            url = f"/v1/sessions/{sid}/events"
            async with client.stream("GET", url, params={"follow": "true"}) as resp:
                assert resp.status_code == 200
                following.set()
                async for frame in read_frames(resp):
                    followed.append(frame)
                    if sum(f.event == "session.ended" for f in followed) == 2:
                        break
        done.set()

    nursery.start_soon(follow)
    await following.wait()
    ticking = script({"tick": 30, "every": 0.01}, {"end": "completed"})
    for _ in range(2):
        status, frames = await turn(a.url, sid, ticking)
        assert status == 200
    with trio.fail_after(30):
        await done.wait()
    assert seqs(followed) == list(range(1, len(followed) + 1))
    assert len(followed) == 2 * len(frames)


async def test_kill_9_of_the_replica_running_a_turn(
    nursery: trio.Nursery, tmp_path: Path, store_url: str, launched: list[CLIServer]
) -> None:
    a, b = await replicas(nursery, tmp_path, store_url, 2, launched=launched)
    sid = await create(b.url)
    seen = (await stream_turn(nursery, a.url, sid, HANG, cut=True)).frames
    adapter = seen[0].data["data"]["pid"]
    a.signal(signal.SIGKILL)
    await a.wait()
    # B closes the turn once its lease has passed; the adapter died with A (its reaper).
    with trio.fail_after(30):
        while (await turn_record(b.url, sid))["status"] == "running":
            await trio.sleep(0.1)
    record = await turn_record(b.url, sid)
    assert record["status"] == "interrupted", record
    assert not pid_alive(adapter)
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as client:
        log = parse_sse((await client.get(f"/v1/sessions/{sid}/events")).text)
    assert log[: len(seen)] == seen  # nothing a client saw is lost
    assert [f.event for f in log[len(seen) :]] == ["error", "session.ended"]
    assert log[-2].data["data"]["reason"] == "lease_expired"
    assert seqs(log) == list(range(1, len(log) + 1))
    status, frames = await turn(b.url, sid)
    assert status == 200 and frames[-1].data["data"]["reason"] == "completed"


async def test_rolling_restart_with_turns_in_flight(
    nursery: trio.Nursery, tmp_path: Path, store_url: str, launched: list[CLIServer]
) -> None:
    servers = await replicas(nursery, tmp_path, store_url, 2, launched=launched)
    spec = write_spec(tmp_path)
    sids = [await create(servers[0].url) for _ in range(4)]
    ticking = script({"tick": 20, "every": 0.05}, {"end": "completed"})
    results: list[tuple[int, list[Frame]]] = []

    async def one(url: str, sid: str, task_status: trio.TaskStatus[None]) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            path = f"/v1/sessions/{sid}/turns"
            async with client.stream("POST", path, json={"input": ticking}) as resp:
                frames: list[Frame] = []
                async for frame in read_frames(resp):
                    if not frames:
                        task_status.started()  # running
                    frames.append(frame)
                results.append((resp.status_code, frames))

    for i in range(2):  # restart each replica in turn while turns run on both
        async with trio.open_nursery() as turns:
            for j, sid in enumerate(sids):
                await turns.start(one, servers[j % 2].url, sid)
            servers[i].signal(signal.SIGTERM)
            assert await servers[i].wait() == 0
        servers[i] = await start_cli_server(
            nursery, tmp_path, spec, "--store", store_url, "--turn-lease", LEASE
        )
        launched.append(servers[i])
    assert len(results) == 8
    for status, frames in results:
        assert status == 200
        assert frames[-1].data["data"]["reason"] == "completed", frames[-3:]
        assert [f.data["data"]["i"] for f in frames if f.event == "message"] == list(range(20))
    for server in servers:
        status, frames = await turn(server.url, sids[0])
        assert status == 200


async def test_cancel_on_another_replica(
    nursery: trio.Nursery, tmp_path: Path, store_url: str, launched: list[CLIServer]
) -> None:
    a, b = await replicas(nursery, tmp_path, store_url, 2, launched=launched)
    sid = await create(a.url)
    streaming = await stream_turn(nursery, a.url, sid, HANG)
    frames = streaming.frames
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as client:
        resp = await client.delete(f"/v1/sessions/{sid}/turns/current")
        assert (resp.status_code, resp.json()) == (202, {"turnCancelled": True})
    with trio.fail_after(20):
        await streaming.done.wait()
    ends = [f for f in frames if f.event == "session.ended"]
    assert len(ends) == 1 and ends[0].data["data"]["reason"] == "cancelled"
    assert not pid_alive(frames[0].data["data"]["pid"])
    assert (await turn_record(b.url, sid))["status"] == "cancelled"
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as client:
        resp = await client.delete(f"/v1/sessions/{sid}/turns/current")
        assert resp.json()["error"]["reason"] == "no_turn", resp.text  # none runs anywhere
    status, after = await turn(b.url, sid)
    assert status == 200 and after[-1].data["data"]["reason"] == "completed"


async def test_ending_a_session_on_another_replica_stops_its_turn(
    nursery: trio.Nursery, tmp_path: Path, store_url: str, launched: list[CLIServer]
) -> None:
    a, b = await replicas(nursery, tmp_path, store_url, 2, launched=launched)
    sid = await create(a.url)
    streaming = await stream_turn(nursery, a.url, sid, HANG)
    frames = streaming.frames
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as client:
        assert (await client.delete(f"/v1/sessions/{sid}")).status_code == 204
    with trio.fail_after(20):
        await streaming.done.wait()
    # As on the replica running the turn (test_live's test_ending_a_session_stops_its_turn).
    assert frames[-1].event == "session.ended"
    assert frames[-1].data["data"] == {"reason": "cancelled", "message": "session ended"}
    assert not pid_alive(frames[0].data["data"]["pid"])


async def test_the_ttl_spares_a_session_whose_turn_runs_on_another_replica(
    nursery: trio.Nursery, tmp_path: Path, store_url: str, launched: list[CLIServer]
) -> None:
    a, b = await replicas(nursery, tmp_path, store_url, 2, "--session-ttl", "1s", launched=launched)
    sid = await create(a.url)
    # Runs for 3 TTLs; both replicas sweep every second meanwhile.
    status, frames = await turn(a.url, sid, script({"sleep": 3}, {"end": "completed"}))
    assert status == 200 and frames[-1].data["data"]["reason"] == "completed"
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as client:
        record = (await client.get(f"/v1/sessions/{sid}")).json()
    assert record["status"] == "active", record


async def test_tenant_caps_are_exact_across_replicas(
    nursery: trio.Nursery, tmp_path: Path, store_url: str, launched: list[CLIServer]
) -> None:
    key, line = new_key("acme")
    other, other_line = new_key("bolt")
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"{line}\n{other_line}\n")
    caps = ("--max-sessions-per-tenant", "3", "--max-turns-per-tenant", "2")
    servers = await replicas(
        nursery, tmp_path, store_url, 2, "--api-keys", str(keys_file), *caps, launched=launched
    )
    created: list[str] = []
    refused: list[str] = []

    async def create_as(url: str, api_key: str) -> None:
        headers = {"Authorization": f"Bearer {api_key}"}
        async with httpx.AsyncClient(base_url=url, timeout=30, headers=headers) as client:
            resp = await client.post("/v1/sessions", json={})
            if resp.status_code == 201:
                created.append(resp.json()["id"])
            else:
                refused.append(resp.json()["error"]["reason"])

    async with trio.open_nursery() as racing:
        for i in range(12):
            racing.start_soon(create_as, servers[i % 2].url, key)
    assert len(created) == 3 and refused == ["tenant_session_cap"] * 9
    await create_as(servers[1].url, other)  # another tenant has its own cap
    assert len(created) == 4

    statuses: list[int] = []
    slow = script({"sleep": 1.5}, {"end": "completed"})

    async def turn_as(url: str, sid: str) -> None:
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=url, timeout=60, headers=headers) as client:
            resp = await client.post(f"/v1/sessions/{sid}/turns", json={"input": slow})
            statuses.append(resp.status_code)
            if resp.status_code == 429:
                assert resp.json()["error"]["reason"] == "tenant_turn_cap"

    async with trio.open_nursery() as racing:
        for i, sid in enumerate(created[:3]):
            racing.start_soon(turn_as, servers[i % 2].url, sid)
    assert sorted(statuses) == [200, 200, 429]


async def test_a_replica_that_lost_its_lease_stops_writing_the_turn(
    nursery: trio.Nursery, tmp_path: Path, store_url: str, launched: list[CLIServer]
) -> None:
    """A replica frozen longer than the lease (a partition, a stopped VM) comes back to a
    turn the other closed: its next write is refused, the turn ends there, its adapter
    stops, and the log ends with the other's close."""
    a, b = await replicas(nursery, tmp_path, store_url, 2, launched=launched)
    sid = await create(a.url)
    ticking = script({"tick": 100000, "every": 0.02})
    streaming = await stream_turn(nursery, a.url, sid, ticking)
    seen = streaming.frames
    adapter = seen[0].data["data"]["pid"]
    a.signal(signal.SIGSTOP)
    try:
        with trio.fail_after(30):
            while (await turn_record(b.url, sid))["status"] == "running":
                await trio.sleep(0.1)
    finally:
        a.signal(signal.SIGCONT)
    with trio.fail_after(30):
        await streaming.done.wait()
        while pid_alive(adapter):
            await trio.sleep(0.05)
    record = await turn_record(b.url, sid)
    assert (record["status"], record.get("reason")) == ("interrupted", "lease_expired"), record
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as client:
        log = parse_sse((await client.get(f"/v1/sessions/{sid}/events")).text)
    assert seqs(log) == list(range(1, len(log) + 1))
    assert [f.event for f in log[-2:]] == ["error", "session.ended"]
    assert log[-2].data["data"]["reason"] == "lease_expired"
    assert seen == log  # A's client saw only what the store has, to its close
    status, frames = await turn(a.url, sid)  # A takes the next turn
    assert status == 200 and frames[-1].data["data"]["reason"] == "completed"


async def test_websocket_turn_on_one_replica_resumed_and_cancelled_on_another(
    nursery: trio.Nursery, tmp_path: Path, store_url: str, launched: list[CLIServer]
) -> None:
    a, b = await replicas(nursery, tmp_path, store_url, 2, launched=launched)
    sid = await create(a.url)

    def ws_url(url: str) -> str:
        return url.replace("http://", "ws://", 1) + f"/v1/sessions/{sid}/ws"

    async def receive(ws: WebSocketConnection) -> dict[str, Any]:
        with trio.fail_after(20):
            value: dict[str, Any] = json.loads(await ws.get_message())
        return value

    slow = script({"tick": 3, "every": 0.05}, {"hang": True})
    async with open_websocket_url(ws_url(a.url), disconnect_timeout=5) as on_a:
        await on_a.send_message(json.dumps({"type": "turn", "input": slow}))
        first = [await receive(on_a) for _ in range(2)]  # session.started, message 0
        async with open_websocket_url(ws_url(b.url), disconnect_timeout=5) as on_b:
            after = first[-1]["seq"]
            await on_b.send_message(json.dumps({"type": "resume", "after": after}))
            resumed = [await receive(on_b) for _ in range(2)]  # messages 1 and 2, live
            assert [m["seq"] for m in resumed] == [after + 1, after + 2]
            await on_b.send_message(json.dumps({"type": "cancel"}))
            while (message := await receive(on_b))["type"] != "trioserve.resume.end":
                resumed.append(message)
        on_a_rest = []
        while (message := await receive(on_a))["type"] != "trioserve.turn.end":
            on_a_rest.append(message)
    assert message["status"] == "cancelled", message
    assert resumed[-1]["type"] == "session.ended" and resumed == on_a_rest
