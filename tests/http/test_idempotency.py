"""Idempotency keys through a real server: a repeated create or turn runs once.

Each turn here runs a real fake-adapter process that appends its pid to a
file (the ``count`` step), so a test counts the adapter processes that
started, not the answers it got.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import trio
from trio_websocket import WebSocketConnection

from tests.helpers import Frame, Server, ServerFactory, parse_sse, read_frames, script
from tests.helpers.ws import connect, receive, send
from trioserve.http._auth import parse_keys
from trioserve.protocol import IDEMPOTENCY_KEY_HEADER, IDEMPOTENT_REPLAYED_HEADER, TURN_ID_HEADER
from trioserve.stores.base import utcnow

REPLAYED = IDEMPOTENT_REPLAYED_HEADER


def counted(tmp_path: Path, *steps: dict[str, Any]) -> tuple[str, Path]:
    """A turn input whose adapter appends its pid to a file first, and that file."""
    runs = tmp_path / "runs"
    return script({"count": str(runs)}, *steps), runs


def runs(path: Path) -> int:
    """How many adapter processes ran the counted script."""
    return len(path.read_text().splitlines()) if path.exists() else 0


def keyed(key: str, **headers: str) -> dict[str, str]:
    return {IDEMPOTENCY_KEY_HEADER: key, **headers}


async def create(server: Server, key: str, body: Any = None, **headers: str) -> httpx.Response:
    return await server.client.post("/v1/sessions", json=body or {}, headers=keyed(key, **headers))


async def post_turn(
    server: Server, sid: str, key: str, body: dict[str, Any], **headers: str
) -> httpx.Response:
    return await server.client.post(
        f"/v1/sessions/{sid}/turns", json=body, headers=keyed(key, **headers), timeout=60
    )


def events(resp: httpx.Response) -> list[tuple[str, dict[str, Any], str | None]]:
    assert resp.status_code == 200, resp.text
    return [(f.event, f.data, f.id) for f in parse_sse(resp.text)]


async def test_a_repeated_create_answers_the_same_session(start_server: ServerFactory) -> None:
    server = await start_server()
    first = await create(server, "create-1", {"inputs": {"topic": "trio"}})
    again = await create(server, "create-1", {"inputs": {"topic": "trio"}})
    assert first.status_code == again.status_code == 201, (first.text, again.text)
    assert again.json() == first.json()
    assert REPLAYED not in first.headers and again.headers[REPLAYED] == "true"
    other = await create(server, "create-2", {"inputs": {"topic": "trio"}})
    assert other.json()["id"] != first.json()["id"]
    plain = [await server.client.post("/v1/sessions", json={}) for _ in range(2)]
    assert plain[0].json()["id"] != plain[1].json()["id"]  # without a key: two sessions
    listed = (await server.client.get("/v1/sessions")).json()
    assert len(listed) == 4


async def test_a_repeated_turn_runs_once_and_replays_its_stream(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    server = await start_server(processes=True)
    sid = (await server.create())["id"]
    text, counter = counted(tmp_path, {"event": "message", "data": {"n": 1}}, {"end": "completed"})
    first = await post_turn(server, sid, "turn-1", {"input": text})
    again = await post_turn(server, sid, "turn-1", {"input": text})
    assert events(again) == events(first)
    assert [e for e, _, _ in events(first)] == ["session.started", "message", "session.ended"]
    assert again.headers[TURN_ID_HEADER] == first.headers[TURN_ID_HEADER]
    assert REPLAYED not in first.headers and again.headers[REPLAYED] == "true"
    assert runs(counter) == 1
    turns = (await server.client.get(f"/v1/sessions/{sid}/turns")).json()
    assert [t["id"] for t in turns] == [first.headers[TURN_ID_HEADER]]
    # the next turn, with a new key, runs
    third = await post_turn(server, sid, "turn-2", {"input": text})
    assert third.headers[TURN_ID_HEADER] != first.headers[TURN_ID_HEADER]
    assert runs(counter) == 2


async def test_identical_requests_in_parallel_make_one_session_and_run_one_turn(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    server = await start_server(processes=True, max_sessions=1)  # the first takes the slot
    created: list[httpx.Response] = []
    turned: list[httpx.Response] = []

    async def one_create() -> None:
        created.append(await create(server, "same-create"))

    async with trio.open_nursery() as nursery:
        for _ in range(8):
            nursery.start_soon(one_create)
    assert {r.status_code for r in created} == {201}
    assert len({r.json()["id"] for r in created}) == 1
    assert sum(REPLAYED in r.headers for r in created) == 7
    sid = created[0].json()["id"]
    text, counter = counted(tmp_path, {"tick": 3, "every": 0.01}, {"end": "completed"})

    async def one_turn() -> None:
        turned.append(await post_turn(server, sid, "same-turn", {"input": text}))

    async with trio.open_nursery() as nursery:
        for _ in range(8):
            nursery.start_soon(one_turn)
    assert {r.status_code for r in turned} == {200}, [r.text for r in turned]
    assert len({r.headers[TURN_ID_HEADER] for r in turned}) == 1
    assert all(events(r) == events(turned[0]) for r in turned)
    assert runs(counter) == 1
    assert len((await server.client.get(f"/v1/sessions/{sid}/turns")).json()) == 1


async def test_a_repeat_while_the_turn_runs_follows_it_from_its_first_event(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    server = await start_server(processes=True)
    sid = (await server.create())["id"]
    text, counter = counted(tmp_path, {"event": "message", "data": {"ready": 1}}, {"hang": True})
    seen: dict[str, list[Frame]] = {"first": [], "again": []}
    ready = {name: trio.Event() for name in seen}

    async def stream(name: str) -> None:
        body, headers = {"input": text}, keyed("running")
        async with server.client.stream(
            "POST", f"/v1/sessions/{sid}/turns", json=body, headers=headers, timeout=60
        ) as resp:
            assert resp.status_code == 200
            async for frame in read_frames(resp):
                if frame.event != "comment":
                    seen[name].append(frame)
                if frame.data.get("data") == {"ready": 1}:
                    ready[name].set()

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream, "first")
            await ready["first"].wait()
            nursery.start_soon(stream, "again")
            await ready["again"].wait()
            cancelled = await server.client.delete(f"/v1/sessions/{sid}/turns/current")
            assert cancelled.status_code == 202
    first, again = seen["first"], seen["again"]
    assert [(f.event, f.data, f.id) for f in again] == [(f.event, f.data, f.id) for f in first]
    assert [f.event for f in first][:2] == ["session.started", "message"]
    assert first[-1].event == "session.ended" and first[-1].data["data"]["reason"] == "cancelled"
    assert runs(counter) == 1


async def test_a_refused_turn_is_refused_again_and_a_new_key_runs(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    server = await start_server(processes=True)
    sid = (await server.create())["id"]
    hang = script({"hang": True})
    busy = await server.client.post(
        f"/v1/sessions/{sid}/turns", json={"input": hang, "detach": True}
    )
    assert busy.status_code == 202
    text, counter = counted(tmp_path, {"end": "completed"})
    refused = await post_turn(server, sid, "refused", {"input": text})
    assert refused.status_code == 409 and REPLAYED not in refused.headers
    await server.client.delete(f"/v1/sessions/{sid}/turns/current")
    await wait_turn_over(server, sid, busy.headers[TURN_ID_HEADER])
    again = await post_turn(server, sid, "refused", {"input": text})
    assert again.status_code == 409 and again.headers[REPLAYED] == "true"
    assert again.json() == refused.json()
    assert runs(counter) == 0
    fresh = await post_turn(server, sid, "fresh", {"input": text})
    assert fresh.status_code == 200 and runs(counter) == 1


async def wait_turn_over(server: Server, sid: str, tid: str) -> None:
    with trio.fail_after(30):
        while (await server.client.get(f"/v1/sessions/{sid}/turns/{tid}")).json()[
            "status"
        ] == "running":
            await trio.sleep(0.02)


async def test_a_create_over_the_cap_is_refused_again(start_server: ServerFactory) -> None:
    server = await start_server(max_sessions=1)
    sid = (await server.create())["id"]
    refused = await create(server, "capped")
    assert refused.status_code == 429
    assert (await server.client.delete(f"/v1/sessions/{sid}")).status_code == 204
    again = await create(server, "capped")
    assert again.status_code == 429 and again.headers[REPLAYED] == "true"
    assert again.json() == refused.json()
    assert (await create(server, "after")).status_code == 201


async def test_the_same_key_for_another_request_is_a_422_naming_the_header(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    server = await start_server(processes=True)
    sid = (await create(server, "k", {"inputs": {"a": "1"}})).json()["id"]
    other_sid = (await server.create())["id"]
    text, counter = counted(tmp_path, {"end": "completed"})
    assert (await post_turn(server, sid, "t", {"input": text})).status_code == 200
    wrong = [
        await create(server, "k", {"inputs": {"a": "2"}}),  # another body
        await post_turn(server, sid, "k", {"input": text}),  # another route
        await post_turn(server, sid, "t", {"input": text + " "}),  # another input
        await post_turn(server, sid, "t", {"input": text, "detach": True}),
        await post_turn(server, sid, "t", {"input": text, "onDisconnect": "continue"}),
        await post_turn(server, other_sid, "t", {"input": text}),  # another session
    ]
    for resp in wrong:
        assert resp.status_code == 422, resp.text
        error = resp.json()["error"]
        assert error["reason"] == "idempotency_key_reused"
        assert IDEMPOTENCY_KEY_HEADER in error["message"]
    assert runs(counter) == 1
    assert len((await server.client.get("/v1/sessions")).json()) == 2


async def test_another_tenants_identical_key_is_another_request(
    start_server: ServerFactory,
) -> None:
    import hashlib

    def line(key: str, tenant: str) -> str:
        return f"sha256:{hashlib.sha256(key.encode()).hexdigest()} {tenant}"

    ring = parse_keys(f"{line('key-a', 'alpha')}\n{line('key-b', 'beta')}\n", "keys")
    server = await start_server(keys=ring)
    a = await create(server, "shared", Authorization="Bearer key-a")
    b = await create(server, "shared", Authorization="Bearer key-b")
    assert a.status_code == b.status_code == 201
    assert a.json()["id"] != b.json()["id"]
    assert REPLAYED not in b.headers
    a2 = await create(server, "shared", Authorization="Bearer key-a")
    b2 = await create(server, "shared", Authorization="Bearer key-b")
    assert (a2.json()["id"], b2.json()["id"]) == (a.json()["id"], b.json()["id"])


async def post_raw(server: Server, header: bytes) -> tuple[int, dict[str, Any]]:
    """``POST /v1/sessions`` with ``header`` as its own line, byte for byte (httpx would
    refuse some), on a connection the server closes after answering."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    head = b"POST /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    request = head + header + b"\r\nContent-Length: 2\r\n\r\n{}"
    with trio.fail_after(30):
        async with await trio.open_tcp_stream(host, int(port)) as stream:
            await stream.send_all(request)
            received = bytearray()
            while chunk := await stream.receive_some(65536):
                received += chunk
    status_line, _, rest = bytes(received).partition(b"\r\n")
    body = rest.partition(b"\r\n\r\n")[2]
    return int(status_line.split()[1]), json.loads(body)


async def test_a_bad_key_is_a_400_naming_the_header(start_server: ServerFactory) -> None:
    server = await start_server()
    name = IDEMPOTENCY_KEY_HEADER.encode()
    for value in [b"", b" ", b'""', b"x" * 256, b"caf\xc3\xa9", b"caf\xe9", b"tab\there"]:
        status, body = await post_raw(server, name + b": " + value)
        assert status == 400, (value, body)
        assert body["error"]["message"].startswith(f"{IDEMPOTENCY_KEY_HEADER}: "), body
    status, body = await post_raw(server, name + b": a\r\n" + name + b": b")
    assert status == 400 and "one header" in body["error"]["message"]
    quoted = await create(server, '"8e03978e-40d5"')  # a structured-field string
    bare = await create(server, "8e03978e-40d5")
    assert bare.json()["id"] == quoted.json()["id"] and bare.headers[REPLAYED] == "true"
    assert (await create(server, "x" * 255)).status_code == 201
    assert len((await server.client.get("/v1/sessions")).json()) == 2


async def test_a_detached_turn_is_answered_again_with_its_record(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    server = await start_server(processes=True)
    sid = (await server.create())["id"]
    text, counter = counted(tmp_path, {"end": "completed"})
    body = {"input": text, "detach": True}
    first = await post_turn(server, sid, "detached", body)
    assert first.status_code == 202
    tid = first.headers[TURN_ID_HEADER]
    await wait_turn_over(server, sid, tid)
    again = await post_turn(server, sid, "detached", body)
    assert again.status_code == 202 and again.headers[REPLAYED] == "true"
    assert again.headers[TURN_ID_HEADER] == tid
    assert again.headers["Location"] == first.headers["Location"]
    assert again.json()["id"] == tid and again.json()["status"] == "completed"
    assert runs(counter) == 1


async def test_a_websocket_turn_is_repeated_over_websocket_and_http(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    server = await start_server(processes=True)
    sid = (await server.create())["id"]
    text, counter = counted(tmp_path, {"event": "message", "data": {"n": 1}}, {"end": "completed"})
    turn = {"type": "turn", "input": text, "idempotencyKey": "ws-turn"}
    async with connect(server, sid) as ws:
        first = await ws_turn(ws, turn)
        again = await ws_turn(ws, turn)
        await send(ws, {**turn, "idempotencyKey": "caf\u00e9"})
        error = await receive(ws)
    assert again == first and [m["type"] for m in first][:-1] == [
        "session.started",
        "message",
        "session.ended",
    ]
    assert first[-1]["type"] == "trioserve.turn.end" and first[-1]["status"] == "completed"
    assert error["error"]["code"] == 400 and "idempotencyKey" in error["error"]["message"]
    over_http = await post_turn(server, sid, "ws-turn", {"input": text})
    assert over_http.headers[TURN_ID_HEADER] == first[-1]["turnId"]
    assert [d for _, d, _ in events(over_http)] == first[:-1]
    assert runs(counter) == 1


async def ws_turn(ws: WebSocketConnection, turn: dict[str, Any]) -> list[dict[str, Any]]:
    """A turn's messages, its ``trioserve.turn.end`` last."""
    await send(ws, turn)
    messages = [await receive(ws)]
    while messages[-1]["type"] != "trioserve.turn.end":
        messages.append(await receive(ws))
    return messages


async def test_with_no_window_keys_are_ignored(start_server: ServerFactory, tmp_path: Path) -> None:
    server = await start_server(processes=True, idempotency_window=0)
    sid = (await create(server, "ignored")).json()["id"]
    assert (await create(server, "ignored")).json()["id"] != sid
    text, counter = counted(tmp_path, {"end": "completed"})
    for _ in range(2):
        assert REPLAYED not in (await post_turn(server, sid, "t", {"input": text})).headers
    assert runs(counter) == 2


async def test_an_expired_key_is_a_new_request_and_the_sweep_purges_it(
    start_server: ServerFactory,
) -> None:
    server = await start_server(idempotency_window=0.5)
    first = (await create(server, "short")).json()["id"]
    await trio.sleep(0.6)  # the window is over
    second = await create(server, "short")
    assert second.json()["id"] != first and REPLAYED not in second.headers
    store = server.manager.store
    assert await store.find_key(None, "short") is not None
    await trio.sleep(0.6)
    assert await store.find_key(None, "short") is None  # expired: no longer found
    # ... and its row deleted by a sweep: the server's own, every second here (the
    # window's quarter, at least 1 s), may have come first.
    assert (await server.manager.sweep()).keys_purged in (0, 1)
    long_ago = utcnow() - timedelta(days=1)
    assert await store._find_key(None, "short", long_ago) is None
