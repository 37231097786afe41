"""Webhooks (issue 20): a turn's end POSTed, signed, to real receivers on 127.0.0.1.

Each test runs a real server (``start_server``) and real receivers
(``tests.helpers.receiver``); signatures are checked by the receiver's
own implementation of the Standard Webhooks rules, not by the library the
server signs with.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import httpx
import pytest
import trio
from standardwebhooks import Webhook

from tests.helpers import (
    APPROVAL_ADAPTER,
    KEY_A,
    KEY_B,
    Receiver,
    Server,
    ServerFactory,
    auth,
    two_tenants,
    verify,
)
from tests.helpers import script as scripted
from tests.helpers.ws import connect, receive
from tests.helpers.ws import send as ws_send
from trioserve.client import BadRequestError, Client
from trioserve.protocol import TURN_END
from trioserve.sessions import WebhookSettings
from trioserve.sessions._webhook_send import open_client, send
from trioserve.sessions._webhook_urls import WebhookPolicy, WebhookRefused

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
DONE = scripted({"event": "message", "data": {"text": "hi"}}, {"end": "completed"})


def settings(**changes: Any) -> WebhookSettings:
    # A long deadline: an answer read late on a loaded machine would be a second attempt.
    base = WebhookSettings(secret=SECRET, allow=("127.0.0.1",), backoff=0.05, timeout=60.0)
    return replace(base, **changes)


async def turn(server: Server, body: dict[str, Any], **headers: str) -> httpx.Response:
    sid = (await server.client.post("/v1/sessions", json={}, headers=headers)).json()["id"]
    return await server.client.post(
        f"/v1/sessions/{sid}/turns", json={"input": DONE} | body, headers=headers, timeout=60
    )


async def pending(server: Server) -> int:
    return await server.manager.store.pending_webhooks()


async def wait_outbox_empty(server: Server) -> None:
    with trio.fail_after(30):
        while await pending(server):
            await trio.sleep(0.02)


async def test_a_turns_end_is_posted_signed_with_its_record(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    receiver = Receiver()
    url = await receiver.start(nursery) + "/hooks/turns?token=abc"
    server = await start_server(webhooks=settings())
    resp = await turn(server, {"webhook": url})
    assert resp.status_code == 200, resp.text
    (got,) = await receiver.wait_for(1)
    verify(SECRET, got)
    assert (got.method, got.path) == ("POST", "/hooks/turns?token=abc")
    assert got.headers["content-type"] == "application/json"
    assert got.headers["webhook-id"].startswith("msg_")
    body = got.json()
    tid = resp.headers["Trioserve-Turn-Id"]
    record = (await server.client.get(f"/v1/sessions/{body['sessionId']}/turns/{tid}")).json()
    assert body["type"] == "turn.ended" and body["data"] == record
    assert record["status"] == "completed" and record["sessionId"] == body["sessionId"]
    await wait_outbox_empty(server)
    # A forged signature is told apart by the same check.
    got.headers["webhook-signature"] = "v1," + "A" * 44
    with pytest.raises(AssertionError):
        verify(SECRET, got)


async def test_a_receiver_failing_twice_gets_three_attempts_of_one_id(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    receiver = Receiver(statuses=[500, 503, 204])
    await receiver.start(nursery)
    server = await start_server(webhooks=settings())
    resp = await turn(server, {"webhook": receiver.url, "detach": True})
    assert resp.status_code == 202, resp.text
    attempts = await receiver.wait_for(3)
    await wait_outbox_empty(server)  # the 204 took it: nothing left to retry
    assert len({a.headers["webhook-id"] for a in attempts}) == 1
    assert len({a.body for a in attempts}) == 1  # the same bytes every time
    for attempt in attempts:
        verify(SECRET, attempt)
    assert attempts[0].json()["data"]["status"] == "completed"
    metrics = (await server.client.get("/metrics")).text
    assert "trioserve_webhook_deliveries_sent_total 1.0" in metrics
    assert "trioserve_webhook_attempts_failed_total 2.0" in metrics
    assert "trioserve_webhook_attempt_seconds_count 3.0" in metrics
    assert len(receiver.requests) == 3


async def test_the_servers_webhook_gets_every_turn_and_a_turns_own_too(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    everything, own = Receiver(), Receiver()
    await everything.start(nursery)
    await own.start(nursery)
    server = await start_server(webhooks=settings(url=everything.url + "/all"))
    assert (await turn(server, {})).status_code == 200
    assert (await turn(server, {"webhook": own.url})).status_code == 200
    seen = await everything.wait_for(2)
    (mine,) = await own.wait_for(1)
    assert len({r.headers["webhook-id"] for r in [*seen, mine]}) == 3
    assert mine.json()["data"]["id"] == seen[1].json()["data"]["id"]
    await wait_outbox_empty(server)


@pytest.mark.parametrize(
    ("webhook", "says"),
    [
        ("http://127.0.0.2:9/x", "not allowed"),  # not in the list
        ("http://169.254.169.254/latest/meta-data", "private, loopback or link-local"),
        ("http://10.1.2.3/", "private, loopback or link-local"),
        ("http://[::1]:9/", "private, loopback or link-local"),
        ("http://[::ffff:127.0.0.1]:9/", "private, loopback or link-local"),
        ("http://localhost:9/", "resolves to"),
        ("ftp://hooks.example/x", "http:// or https://"),
        ("http://user:pw@127.0.0.1/", "user or password"),
        ("not a url", "http:// or https://"),
        (7, "a string"),
    ],
)
async def test_webhooks_to_places_not_allowed_are_refused(
    start_server: ServerFactory, webhook: Any, says: str
) -> None:
    # "*" allows any host, but not a private, loopback or link-local address, literal
    # or resolved; 127.0.0.1 is allowed only because it is listed by itself.
    server = await start_server(webhooks=settings(allow=("*", "127.0.0.1")))
    allowed = server if "not allowed" not in says else await start_server(webhooks=settings())
    resp = await turn(allowed, {"webhook": webhook})
    assert resp.status_code == 400, resp.text
    message = resp.json()["error"]["message"]
    assert "webhook" in message and says in message, message
    assert await pending(allowed) == 0


async def test_a_turns_webhook_is_refused_when_webhooks_are_off(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    resp = await turn(server, {"webhook": "https://hooks.example/x"})
    assert resp.status_code == 400
    assert "--webhook-secret-file" in resp.json()["error"]["message"]


async def test_a_refused_turn_keeps_no_delivery_and_tenants_reach_only_their_own(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    receiver = Receiver()
    await receiver.start(nursery)
    server = await start_server(keys=two_tenants(), webhooks=settings())
    theirs = (await server.client.post("/v1/sessions", json={}, headers=auth(KEY_A))).json()
    path = f"/v1/sessions/{theirs['id']}/turns"
    resp = await server.client.post(
        path, json={"input": DONE, "webhook": receiver.url}, headers=auth(KEY_B)
    )
    assert resp.status_code == 404  # beta cannot see alpha's session, nor hook its turns
    assert await pending(server) == 0
    resp = await server.client.post(
        path, json={"input": DONE, "webhook": receiver.url}, headers=auth(KEY_A)
    )
    assert resp.status_code == 200
    (got,) = await receiver.wait_for(1)
    assert got.json()["sessionId"] == theirs["id"]


async def test_a_redirect_is_not_followed(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    elsewhere = Receiver()
    await elsewhere.start(nursery)
    redirecting = Receiver(statuses=[307, 200], redirect_to=elsewhere.url)
    await redirecting.start(nursery)
    server = await start_server(webhooks=settings())
    await turn(server, {"webhook": redirecting.url, "detach": True})
    await redirecting.wait_for(2)
    await wait_outbox_empty(server)
    first, second = redirecting.requests
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    assert elsewhere.requests == []  # the 307 was an answer, not a new place to go


async def test_a_receiver_that_never_answers_is_given_up_on_and_tried_again(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    hung = Receiver(hang=True)
    await hung.start(nursery)
    server = await start_server(webhooks=settings(timeout=1.0))
    await turn(server, {"webhook": hung.url, "detach": True})
    attempts = await hung.wait_for(2)  # the first attempt hit its deadline: a second one
    assert attempts[0].headers["webhook-id"] == attempts[1].headers["webhook-id"]
    metrics = (await server.client.get("/metrics")).text
    assert "trioserve_webhook_deliveries_sent_total 0.0" in metrics


async def test_a_receivers_long_answer_is_not_read_to_its_end(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    receiver = Receiver(body_bytes=256 * 1024 * 1024)  # far more than the socket buffers
    await receiver.start(nursery)
    server = await start_server(webhooks=settings())
    await turn(server, {"webhook": receiver.url, "detach": True})
    await receiver.wait_for(1)
    await wait_outbox_empty(server)  # delivered: a 2xx, whatever followed
    with trio.fail_after(30):
        while not receiver.cut:
            await trio.sleep(0.02)
    assert len(receiver.requests) == 1


async def test_a_websocket_turn_carries_a_webhook(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    receiver = Receiver()
    await receiver.start(nursery)
    server = await start_server(webhooks=settings())
    sid = (await server.client.post("/v1/sessions", json={})).json()["id"]
    async with connect(server, sid) as ws:
        await ws_send(ws, {"type": "turn", "input": DONE, "webhook": "http://10.0.0.1/"})
        refused = await receive(ws)
        assert refused["type"] == "trioserve.error", refused
        assert "webhook" in refused["error"]["message"]
        await ws_send(ws, {"type": "turn", "input": DONE, "webhook": receiver.url})
        with trio.fail_after(30):
            while (await receive(ws))["type"] != TURN_END:
                pass
    (got,) = await receiver.wait_for(1)
    assert got.json()["sessionId"] == sid


async def test_a_name_that_resolves_to_loopback_is_refused_when_connecting(
    nursery: trio.Nursery,
) -> None:
    receiver = Receiver()
    await receiver.start(nursery)
    port = int(receiver.url.rsplit(":", 1)[1])
    policy = WebhookPolicy(["*"])  # any host, no private address
    with pytest.raises(WebhookRefused, match="resolves to"):
        await policy.addresses("localhost", port)
    client = open_client(policy, 5, 5)
    try:
        attempt = await send(
            client, Webhook(SECRET), f"http://localhost:{port}/", "msg_1", b"{}", 5
        )
    finally:
        await client.aclose()
    assert attempt.status is None and "resolves to" in attempt.detail
    assert receiver.requests == []  # nothing reached it
    listed = WebhookPolicy(["localhost"])  # listed by itself: allowed
    assert "127.0.0.1" in await listed.addresses("localhost", port)


async def test_the_client_detaches_a_turn_with_a_webhook(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    receiver = Receiver()
    await receiver.start(nursery)
    server = await start_server(webhooks=settings())
    async with Client(server.url) as client:
        session = await client.create_session()
        record = await client.detach(session.id, DONE, webhook=receiver.url + "/done")
        with pytest.raises(BadRequestError, match="webhook"):
            await client.detach(session.id, DONE, webhook="http://192.168.1.1/")
    (got,) = await receiver.wait_for(1)
    verify(SECRET, got)
    assert got.json()["data"]["id"] == record.id and got.path == "/done"


async def test_a_turn_waiting_for_an_approval_posts_turn_waiting_then_its_end(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    """A bot can ask a person: ``turn.waiting`` (the turn record and the approval) as the
    turn parks, then ``turn.ended`` once it has ended after the decision; both signed."""
    receiver = Receiver()
    url = await receiver.start(nursery) + "/hooks"
    server = await start_server(
        webhooks=settings(), command=APPROVAL_ADAPTER, require_approval=("deploy",)
    )
    sid = (await server.client.post("/v1/sessions", json={})).json()["id"]
    resp = await server.client.post(
        f"/v1/sessions/{sid}/turns", json={"input": "prod", "detach": True, "webhook": url}
    )
    assert resp.status_code == 202, resp.text
    tid = resp.json()["id"]
    (waiting,) = await receiver.wait_for(1, seconds=120)
    verify(SECRET, waiting)
    body = waiting.json()
    assert (body["type"], body["sessionId"], waiting.path) == ("turn.waiting", sid, "/hooks")
    assert (body["data"]["id"], body["data"]["status"]) == (tid, "waiting")
    approval = body["approval"]
    assert (approval["tool"], approval["arguments"]) == ("deploy", {"target": "prod"})
    assert approval["status"] == "pending" and "state" not in approval
    listed = (await server.client.get(f"/v1/sessions/{sid}/approvals")).json()
    assert [a["approvalId"] for a in listed] == [approval["approvalId"]]
    decided = await server.client.post(
        f"/v1/sessions/{sid}/approvals/{approval['approvalId']}", json={"decision": "approve"}
    )
    assert decided.status_code == 200, decided.text
    _, ended = await receiver.wait_for(2, seconds=120)
    verify(SECRET, ended)
    record = (await server.client.get(f"/v1/sessions/{sid}/turns/{tid}")).json()
    assert ended.json()["type"] == "turn.ended" and ended.json()["data"] == record
    assert record["status"] == "completed"
    assert ended.headers["webhook-id"] != waiting.headers["webhook-id"]
    await wait_outbox_empty(server)
    assert len(receiver.requests) == 2  # one of each, nothing more


async def test_a_crons_fires_carry_its_webhook(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    receiver = Receiver()
    url = await receiver.start(nursery) + "/cron"
    server = await start_server(webhooks=settings())
    body = {"schedule": "@every 1s", "input": DONE, "webhook": url}
    made = await server.client.post("/v1/crons", json=body)
    assert made.status_code == 201, made.text
    got = (await receiver.wait_for(1))[0]  # the first fire's (more may come meanwhile)
    await server.client.patch(f"/v1/crons/{made.json()['id']}", json={"enabled": False})
    verify(SECRET, got)
    sent = got.json()
    assert (sent["type"], got.path, sent["data"]["input"]) == ("turn.ended", "/cron", DONE)
    with trio.fail_after(30):  # the fire's run names its turn (it may be written after the POST)
        while sent["data"]["id"] not in {r["turnId"] for r in await cron_runs(server, made)}:
            await trio.sleep(0.05)


async def cron_runs(server: Server, made: httpx.Response) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = (await server.client.get(f"/v1/crons/{made.json()['id']}")).json()[
        "lastRuns"
    ]
    return runs


@pytest.mark.parametrize(
    ("webhooks", "url", "says"),
    [
        (None, "http://127.0.0.1:9/x", "webhook: webhooks are off on this server"),
        (settings(), "http://evil.test/x", "webhook: host 'evil.test' is not allowed"),
        (settings(allow=("*",)), "http://127.0.0.1:9/x", "webhook: "),  # a loopback address
    ],
)
async def test_a_crons_webhook_is_checked_when_it_is_made_and_changed(
    start_server: ServerFactory, webhooks: WebhookSettings | None, url: str, says: str
) -> None:
    """As a turn's is, not first when the cron fires (its runs would fail one by one)."""
    server = await start_server(webhooks=webhooks or WebhookSettings())  # default: off
    made = await server.client.post("/v1/crons", json={"schedule": "@daily", "webhook": url})
    assert made.status_code == 400 and says in made.json()["error"]["message"], made.text
    assert (await server.client.get("/v1/crons")).json() == []
    cron = (await server.client.post("/v1/crons", json={"schedule": "@daily"})).json()
    changed = await server.client.patch(f"/v1/crons/{cron['id']}", json={"webhook": url})
    assert changed.status_code == 400 and says in changed.json()["error"]["message"]
    kept = (await server.client.get(f"/v1/crons/{cron['id']}")).json()
    assert kept["webhook"] is None and kept["updatedAt"] == cron["updatedAt"]
