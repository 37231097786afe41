"""Caps, single-flight and the TTL sweep, under real concurrency."""

from __future__ import annotations

from collections import Counter

import trio

from tests.helpers import ServerFactory, script


async def test_session_cap_is_exact_under_concurrency(start_server: ServerFactory) -> None:
    server = await start_server(max_sessions=100)
    codes: Counter[int] = Counter()

    async def create() -> None:
        resp = await server.client.post("/v1/sessions")
        codes[resp.status_code] += 1
        if resp.status_code == 429:
            assert resp.json()["error"]["code"] == 429
            assert "max 100" in resp.json()["error"]["message"]

    async with trio.open_nursery() as nursery:
        for _ in range(300):
            nursery.start_soon(create)
    assert codes == {201: 100, 429: 200}
    active = (await server.client.get("/v1/sessions?status=active")).json()
    assert len(active) == 100
    # Ending a session frees its slot.
    await server.client.delete(f"/v1/sessions/{active[0]['id']}")
    assert (await server.client.post("/v1/sessions")).status_code == 201
    assert (await server.client.post("/v1/sessions")).status_code == 429


async def test_turn_cap_is_exact_under_concurrency(start_server: ServerFactory) -> None:
    server = await start_server(max_concurrent_turns=4)
    sessions = [(await server.create())["id"] for _ in range(20)]
    codes: Counter[int] = Counter()

    async def turn(session_id: str) -> None:
        # An admitted turn runs until its client leaves: none ends (and frees its slot)
        # before every request has been answered, however slowly they arrive.
        url = f"/v1/sessions/{session_id}/turns"
        async with server.client.stream(
            "POST", url, json={"input": script({"hang": True})}
        ) as resp:
            codes[resp.status_code] += 1
            await resp.aread()

    async with trio.open_nursery() as nursery:
        for session_id in sessions:
            nursery.start_soon(turn, session_id)
        with trio.fail_after(20):
            while sum(codes.values()) < 20:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert codes == {200: 4, 429: 16}
    # Every slot is free again once the clients have left.
    with trio.fail_after(10):
        while server.manager.turns_in_flight:
            await trio.sleep(0.01)
    frames = await server.turn(sessions[0], "after")
    assert frames[-1].data["data"]["reason"] == "completed"


async def test_single_flight_per_session(start_server: ServerFactory) -> None:
    server = await start_server()
    session_id = (await server.create())["id"]
    codes: Counter[int] = Counter()

    async def turn() -> None:
        url = f"/v1/sessions/{session_id}/turns"
        async with server.client.stream(
            "POST", url, json={"input": script({"sleep": 1}, {"end": "completed"})}
        ) as resp:
            codes[resp.status_code] += 1
            await resp.aread()

    async with trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(turn)
    assert codes == {200: 1, 409: 9}


async def test_sequential_turns_never_see_409(start_server: ServerFactory) -> None:
    """Once a stream has ended, the session's lock is already free."""
    server = await start_server()
    session_id = (await server.create())["id"]
    for i in range(20):
        frames = await server.turn(session_id, f"turn {i}")
        assert frames[-1].data["data"]["reason"] == "completed"


async def test_ttl_sweep_expires_idle_sessions(start_server: ServerFactory) -> None:
    server = await start_server(session_ttl=1.0)
    idle = (await server.create())["id"]
    busy = (await server.create())["id"]
    ended = (await server.create())["id"]
    await server.client.delete(f"/v1/sessions/{ended}")
    stream_open = trio.Event()

    async def long_turn() -> None:
        url = f"/v1/sessions/{busy}/turns"
        body = {"input": script({"sleep": 3.5}, {"end": "completed"})}
        async with server.client.stream("POST", url, json=body) as resp:
            stream_open.set()
            await resp.aread()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(long_turn)
        await stream_open.wait()
        with trio.fail_after(5):
            while (await server.client.get(f"/v1/sessions/{idle}")).json()["status"] != "expired":
                await trio.sleep(0.1)
        # The session in a turn longer than the TTL is never expired.
        assert (await server.client.get(f"/v1/sessions/{busy}")).json()["status"] == "active"
    # Last activity was updated when the turn ended: still active right after.
    assert (await server.client.get(f"/v1/sessions/{busy}")).json()["status"] == "active"
    assert (await server.client.get(f"/v1/sessions/{ended}")).json()["status"] == "ended"
    resp = await server.client.post(f"/v1/sessions/{idle}/turns", json={"input": "x"})
    assert resp.status_code == 404 and "expired" in resp.json()["error"]["message"]
    assert (await server.client.delete(f"/v1/sessions/{idle}")).status_code == 204
    assert (await server.client.get(f"/v1/sessions/{idle}")).json()["status"] == "expired"
    expired = (await server.client.get("/v1/sessions?status=expired")).json()
    assert [s["id"] for s in expired] == [idle]


async def test_expiry_frees_session_slots(start_server: ServerFactory) -> None:
    server = await start_server(session_ttl=1.0, max_sessions=1)
    await server.create()
    assert (await server.client.post("/v1/sessions")).status_code == 429
    with trio.fail_after(5):
        while (await server.client.post("/v1/sessions")).status_code != 201:
            await trio.sleep(0.1)
