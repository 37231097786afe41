"""Double texting across processes: queued turns on PostgreSQL, shared by workers and replicas.

Real ``trioserve run`` processes on loopback ports, one PostgreSQL schema per
test (skipped without PostgreSQL; failed under ``CI=true``): enqueue order
with clients racing across two ``--workers``, and a queued turn that
survives the ``kill -9`` of the server that accepted it.
"""

from __future__ import annotations

import itertools
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.helpers import (
    CLIServer,
    Frame,
    parse_sse,
    read_frames,
    script,
    start_cli_server,
    write_spec,
)

LEASE = "2s"
HANG = script({"event": "message", "data": {"ready": 1}}, {"hang": True})


def said(label: str) -> str:
    return script({"event": "message", "data": {"label": label}}, {"end": "completed"})


async def hang(nursery: trio.Nursery, url: str, sid: str, *, cut: bool = False) -> trio.Event:
    """Run a turn that hangs until it is cancelled; return once it runs (``done`` after)."""
    running, done = trio.Event(), trio.Event()

    async def read() -> None:
        try:
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                path = f"/v1/sessions/{sid}/turns"
                async with client.stream("POST", path, json={"input": HANG}) as resp:
                    async for frame in read_frames(resp):
                        if frame.event == "message":
                            running.set()
        except httpx.HTTPError:
            if not cut:
                raise
        finally:
            done.set()

    nursery.start_soon(read)
    with trio.fail_after(30):
        await running.wait()
    return done


async def records(url: str, sid: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        resp = await client.get(f"/v1/sessions/{sid}/turns")
        assert resp.status_code == 200, resp.text
        return list(resp.json())


# Two workers and seven adapter processes on a loaded 2-core machine: a safety net.
@pytest.mark.timeout(240)
async def test_enqueue_order_across_two_workers(
    nursery: trio.Nursery, tmp_path: Path, store_url: str, launched: list[CLIServer]
) -> None:
    spec = write_spec(tmp_path)
    server = await start_cli_server(
        nursery, tmp_path, spec, "--store", store_url, "--workers", "2", "--turn-lease", LEASE
    )
    launched.append(server)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={})).json()["id"]
    hung = await hang(nursery, server.url, sid)
    streams: dict[str, list[Frame]] = {}
    pids: set[int] = set()
    queued = trio.Event()

    async def enqueue(label: str) -> None:
        frames: list[Frame] = streams.setdefault(label, [])
        # A connection of its own: the two workers share the port, each takes some.
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            body = {"input": said(label), "multitask": "enqueue"}
            path = f"/v1/sessions/{sid}/turns"
            async with client.stream("POST", path, json=body) as resp:
                assert resp.status_code == 200, await resp.aread()
                async for frame in read_frames(resp):
                    frames.append(frame)
                    if sum(len(f) > 0 for f in streams.values()) == 6:
                        queued.set()
                    if frame.event == "session.started":
                        pids.add(frame.data["data"]["ppid"])

    labels = [f"c{i}" for i in range(6)]
    # Bounded: a lost cancel left every stream open on keep-alives (issue 20; the race
    # itself is tests/sessions/test_shared_starts.py).
    with trio.fail_after(120):
        async with trio.open_nursery() as racing:
            for label in labels:
                racing.start_soon(enqueue, label)
            with trio.fail_after(30):
                await queued.wait()
            positions = sorted(streams[label][0].data["data"]["position"] for label in labels)
            assert streams[labels[0]][0].event == "trioserve.queued"
            accepted = [t["id"] for t in await records(server.url, sid)][1:]
            assert len(accepted) == 6
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
                resp = await client.delete(f"/v1/sessions/{sid}/turns/current")
                assert resp.status_code == 202, resp.text
    with trio.fail_after(30):
        await hung.wait()
    assert positions[0] == 1 and len(set(positions)) >= 3  # places counted in the store
    ran = sorted(labels, key=lambda label: streams[label][1].seq)  # first logged event
    turn_of = {label: streams[label][0].data["data"]["turnId"] for label in labels}
    assert [turn_of[label] for label in ran] == accepted, "first come, first served"
    for label in labels:
        events = [f.event for f in streams[label]]
        assert events[-1] == "session.ended", events
        assert [f.data["data"].get("label") for f in streams[label] if f.event == "message"] == [
            label
        ]
    final = await records(server.url, sid)
    assert [t["status"] for t in final] == ["cancelled"] + ["completed"] * 6
    # one after another: each turn's events come after the previous turn's
    spans = [(t["firstSeq"], t["lastSeq"]) for t in final[1:]]
    assert all(a[1] < b[0] for a, b in itertools.pairwise(spans)), spans
    assert len(pids) >= 1


@pytest.mark.timeout(240)
async def test_a_queued_turn_survives_kill_9_of_its_server(
    nursery: trio.Nursery, tmp_path: Path, store_url: str, launched: list[CLIServer]
) -> None:
    spec = write_spec(tmp_path)
    args = ("--store", store_url, "--turn-lease", LEASE)
    a = await start_cli_server(nursery, tmp_path, spec, *args)
    b = await start_cli_server(nursery, tmp_path, spec, *args)
    launched.extend([a, b])
    async with httpx.AsyncClient(base_url=a.url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={})).json()["id"]
        await hang(nursery, a.url, sid, cut=True)
        body = {"input": said("later"), "multitask": "enqueue", "detach": True}
        resp = await client.post(f"/v1/sessions/{sid}/turns", json=body)
        assert resp.status_code == 202 and resp.json()["status"] == "queued", resp.text
        location = resp.headers["Location"]
    a.signal(signal.SIGKILL)
    await a.wait()
    # B closes A's running turn once its lease has passed, adopts the queued one, runs it.
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as client:
        with trio.fail_after(60):
            while (record := (await client.get(location)).json())["status"] != "completed":
                await trio.sleep(0.1)
        log = parse_sse((await client.get(f"/v1/sessions/{sid}/events")).text)
    first = (await records(b.url, sid))[0]
    assert (first["status"], first["reason"]) == ("interrupted", "lease_expired")
    labels = [f.data["data"].get("label") for f in log if f.event == "message"]
    assert labels[-1] == "later"
    assert [f.seq for f in log] == list(range(1, len(log) + 1))
    assert record["firstSeq"] > first["lastSeq"]
    assert "queued turn(s) adopted" in b.log
