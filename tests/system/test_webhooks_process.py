"""Webhooks across processes (issue 20): real ``trioserve run`` servers, a real receiver.

A ``kill -9`` after a turn's end and before its delivery loses nothing:
the next server on the same store delivers it, with the same
``webhook-id`` (SQLite and PostgreSQL; PostgreSQL's cell skips without a
server, and fails under ``CI=true``).  Two ``--workers`` on PostgreSQL
share one outbox and each delivery is made by one of them.
"""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest
import trio

from tests.helpers import CLIServer, Receiver, script, start_cli_server, verify, write_spec
from trioserve.stores import open_store

SECRET = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"
DONE = script({"event": "message", "data": {"text": "hi"}}, {"end": "completed"})


def hook_flags(tmp_path: Path, receiver: Receiver) -> list[str]:
    secret = tmp_path / "webhook.secret"
    secret.write_text(SECRET + "\n")
    return [
        "--webhook-secret-file",
        str(secret),
        "--webhook-allow",
        "127.0.0.1",
        "--webhook-backoff",
        "0.1s",
        "--webhook-timeout",  # a delivery claimed at the kill waits for its lease: 1s + 5s
        "1s",
    ]


async def pending(store_url: str) -> int:
    store = await open_store(store_url)
    try:
        return await store.pending_webhooks()
    finally:
        await store.close()


@pytest.mark.timeout(240)
@pytest.mark.backends("sqlite", "postgres")
async def test_a_kill_9_between_a_turns_end_and_its_delivery_loses_nothing(
    nursery: trio.Nursery, tmp_path: Path, backend_url: str, launched: list[CLIServer]
) -> None:
    receiver = Receiver(statuses=[503])  # not taking anything yet
    await receiver.start(nursery)
    spec = write_spec(tmp_path)
    args = ["--store", backend_url, *hook_flags(tmp_path, receiver)]
    first = await start_cli_server(nursery, tmp_path, spec, *args)
    launched.append(first)
    async with httpx.AsyncClient(base_url=first.url, timeout=30) as client:
        sid = (await client.post("/v1/sessions", json={})).json()["id"]
        body = {"input": DONE, "webhook": receiver.url + "/hook"}
        resp = await client.post(f"/v1/sessions/{sid}/turns", json=body)
        assert resp.status_code == 200, resp.text
        tid = resp.headers["Trioserve-Turn-Id"]
        record = (await client.get(f"/v1/sessions/{sid}/turns/{tid}")).json()
    assert record["status"] == "completed"  # the turn is over; its webhook is not delivered
    await receiver.wait_for(1)
    first.signal(signal.SIGKILL)
    await first.wait()
    refused = len(receiver.requests)
    receiver.statuses = [200]
    assert await pending(backend_url) == 1  # in the store, through the kill
    second = await start_cli_server(nursery, tmp_path, spec, *args)
    launched.append(second)
    attempts = await receiver.wait_for(refused + 1)
    with trio.fail_after(60):
        while await pending(backend_url):
            await trio.sleep(0.05)
    assert len({a.headers["webhook-id"] for a in attempts}) == 1
    delivered = attempts[refused]
    verify(SECRET, delivered)
    payload = delivered.json()
    assert payload["sessionId"] == sid and payload["data"] == record
    assert len(receiver.requests) == refused + 1  # delivered once, then left alone
    assert "delivered" in second.log


@pytest.mark.timeout(240)
async def test_two_workers_deliver_each_webhook_once(
    nursery: trio.Nursery, tmp_path: Path, store_url: str, launched: list[CLIServer]
) -> None:
    receiver = Receiver()
    await receiver.start(nursery)
    spec = write_spec(tmp_path)
    args = ["--store", store_url, "--workers", "2", *hook_flags(tmp_path, receiver)]
    server = await start_cli_server(nursery, tmp_path, spec, *args)
    launched.append(server)
    turns = 8
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        for _ in range(turns):
            sid = (await client.post("/v1/sessions", json={})).json()["id"]
            body = {"input": DONE, "webhook": receiver.url, "detach": True}
            resp = await client.post(f"/v1/sessions/{sid}/turns", json=body)
            assert resp.status_code == 202, resp.text
    await receiver.wait_for(turns)
    with trio.fail_after(60):
        while await pending(store_url):
            await trio.sleep(0.05)
    ids = [r.headers["webhook-id"] for r in receiver.requests]
    assert len(ids) == turns and len(set(ids)) == turns  # each once, by one worker
    for request in receiver.requests:
        verify(SECRET, request)
