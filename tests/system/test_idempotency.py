"""Idempotency keys across ``trioserve run`` processes: a restart, two replicas racing.

The turns run the fake adapter, which appends its pid to a file first (the
``count`` step): each test counts the adapter processes that started.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.helpers import CLIServer, parse_sse, script, start_cli_server, write_spec
from trioserve.protocol import IDEMPOTENCY_KEY_HEADER, IDEMPOTENT_REPLAYED_HEADER, TURN_ID_HEADER


async def post(url: str, path: str, key: str, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        return await client.post(path, json=body, headers={IDEMPOTENCY_KEY_HEADER: key})


def frames(resp: httpx.Response) -> list[tuple[str, Any, str | None]]:
    assert resp.status_code == 200, resp.text
    return [(f.event, f.data, f.id) for f in parse_sse(resp.text)]


def runs(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


async def test_a_create_and_a_turn_repeated_after_a_restart_run_once(
    nursery: trio.Nursery, tmp_path: Path, launched: list[CLIServer]
) -> None:
    spec, counter = write_spec(tmp_path), tmp_path / "runs"
    store = ("--store", f"sqlite:{tmp_path / 'sessions.db'}")
    server = await start_cli_server(nursery, tmp_path, spec, *store)
    launched.append(server)
    created = await post(server.url, "/v1/sessions", "create", {})
    sid = created.json()["id"]
    text = script({"count": str(counter)}, {"event": "message", "data": {"n": 1}})
    turn = await post(server.url, f"/v1/sessions/{sid}/turns", "turn", {"input": text})
    server.signal(signal.SIGTERM)
    assert await server.wait() == 0

    restarted = await start_cli_server(nursery, tmp_path, spec, *store)
    launched.append(restarted)
    created_again = await post(restarted.url, "/v1/sessions", "create", {})
    # the same session, as it is now (its turn has made it active since)
    assert created_again.json() | {"lastActiveAt": None} == created.json() | {"lastActiveAt": None}
    assert created_again.headers[IDEMPOTENT_REPLAYED_HEADER] == "true"
    again = await post(restarted.url, f"/v1/sessions/{sid}/turns", "turn", {"input": text})
    assert again.headers[TURN_ID_HEADER] == turn.headers[TURN_ID_HEADER]
    assert frames(again) == frames(turn)
    assert runs(counter) == 1


async def test_identical_requests_racing_on_two_replicas_run_once(
    nursery: trio.Nursery, tmp_path: Path, store_url: str, launched: list[CLIServer]
) -> None:
    spec, counter = write_spec(tmp_path), tmp_path / "runs"
    started = [
        await start_cli_server(nursery, tmp_path, spec, "--store", store_url) for _ in range(2)
    ]
    launched.extend(started)
    urls = [s.url for s in started]
    answers: list[httpx.Response] = []

    async def one(url: str, path: str, key: str, body: dict[str, Any]) -> None:
        answers.append(await post(url, path, key, body))

    async with trio.open_nursery() as racing:
        for i in range(8):
            racing.start_soon(one, urls[i % 2], "/v1/sessions", "create", {})
    assert {r.status_code for r in answers} == {201}
    assert len({r.json()["id"] for r in answers}) == 1
    assert sum(IDEMPOTENT_REPLAYED_HEADER in r.headers for r in answers) == 7
    sid = answers[0].json()["id"]

    answers.clear()
    text = script({"count": str(counter)}, {"tick": 3, "every": 0.01}, {"end": "completed"})
    async with trio.open_nursery() as racing:
        for i in range(8):
            racing.start_soon(
                one, urls[i % 2], f"/v1/sessions/{sid}/turns", "turn", {"input": text}
            )
    assert len({r.headers[TURN_ID_HEADER] for r in answers}) == 1
    assert all(frames(r) == frames(answers[0]) for r in answers)
    assert [e for e, _, _ in frames(answers[0])][-1] == "session.ended"
    assert runs(counter) == 1
    async with httpx.AsyncClient(base_url=urls[1], timeout=30) as client:
        assert len((await client.get("/v1/sessions")).json()) == 1
        assert len((await client.get(f"/v1/sessions/{sid}/turns")).json()) == 1
