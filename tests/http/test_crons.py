"""``/v1/crons`` on a real server: turns on a schedule, what a client may ask, tenants apart."""

from __future__ import annotations

import itertools
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.helpers import KEY_A, KEY_B, Server, ServerFactory, auth, script, two_tenants
from trioserve.sessions import WebhookSettings


async def make(server: Server, body: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    resp = await server.client.post("/v1/crons", json=body, **kwargs)
    assert resp.status_code == 201, resp.text
    assert resp.headers["location"] == f"/v1/crons/{resp.json()['id']}"
    return dict(resp.json())


async def runs_once(
    client: httpx.AsyncClient, cron_id: str, count: int, within: float = 60, **kwargs: Any
) -> list[dict[str, Any]]:
    """Wait until the cron has ``count`` finished runs (not ``claimed``); its runs, oldest first."""
    with trio.fail_after(within):
        while True:
            resp = await client.get(f"/v1/crons/{cron_id}", **kwargs)
            assert resp.status_code == 200, resp.text
            done = [r for r in resp.json()["lastRuns"] if r["status"] != "claimed"]
            if len(done) >= count:
                return list(reversed(done))
            await trio.sleep(0.05)


async def test_every_second_runs_three_turns_in_about_three_seconds(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    cron = await make(server, {"schedule": "@every 1s", "input": "tick", "inputs": {"k": "v"}})
    assert cron["nextRunAt"] is not None and cron["enabled"] is True
    runs = await runs_once(server.client, cron["id"], 3)
    resp = await server.client.patch(f"/v1/crons/{cron['id']}", json={"enabled": False})
    assert resp.status_code == 200 and resp.json()["nextRunAt"] is None
    shown = (await server.client.get(f"/v1/crons/{cron['id']}")).json()["lastRuns"][::-1]
    runs = [r for r in shown if r["status"] != "claimed"]  # a fire claimed as it was disabled
    first = runs[:3]
    assert [r["status"] for r in first] == ["started"] * 3, runs
    # One turn per second of the schedule: consecutive slots, each its own new session.
    slots = [trio_time(r["scheduledAt"]) for r in first]
    assert [round(b - a, 3) for a, b in itertools.pairwise(slots)] == [1.0, 1.0]
    assert len({r["sessionId"] for r in runs}) == len(runs)
    assert all(r["latenessSeconds"] >= 0 for r in runs)
    for run in first:
        turns = (await server.client.get(f"/v1/sessions/{run['sessionId']}/turns")).json()
        assert [t["id"] for t in turns] == [run["turnId"]]
        assert turns[0]["input"] == "tick"
    metrics = (await server.client.get("/metrics")).text
    assert 'trioserve_cron_fires_total{outcome="started"}' in metrics
    assert "trioserve_cron_lateness_seconds_count" in metrics


def trio_time(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


async def test_a_cron_on_a_session_skips_or_queues_while_it_is_busy(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    server = await start_server(processes=True)  # the turn waits for a file: a real process
    gate = tmp_path / "gate"
    sid = (await server.create())["id"]
    held = script({"event": "message", "data": {"text": "busy"}}, {"wait": str(gate)})
    resp = await server.client.post(
        f"/v1/sessions/{sid}/turns", json={"input": held, "detach": True}
    )
    assert resp.status_code == 202, resp.text
    skip = await make(server, {"schedule": "@every 1s", "sessionId": sid, "input": "s"})
    queue = await make(
        server, {"schedule": "@every 1s", "sessionId": sid, "input": "q", "multitask": "enqueue"}
    )
    skipped = await runs_once(server.client, skip["id"], 2)
    queued = await runs_once(server.client, queue["id"], 1)
    for cron in (skip, queue):
        await server.client.patch(f"/v1/crons/{cron['id']}", json={"enabled": False})
    assert all((r["status"], r["reason"]) == ("skipped", "busy") for r in skipped), skipped
    assert all(r["turnId"] is None for r in skipped)
    assert queued[0]["status"] == "queued" and queued[0]["turnStatus"] == "queued"
    gate.touch()  # the running turn ends; the queued one runs
    with trio.fail_after(30):
        while True:
            record = await server.client.get(f"/v1/sessions/{sid}/turns/{queued[0]['turnId']}")
            if record.json()["status"] == "completed":
                break
            await trio.sleep(0.05)
    inputs = [t["input"] for t in (await server.client.get(f"/v1/sessions/{sid}/turns")).json()]
    assert inputs.count("s") == 0 and "q" in inputs


SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"schedule": "61 * * * *"}, "schedule: invalid cron expression"),
        ({"schedule": "* * * *"}, "schedule: a cron expression has five fields"),
        ({"schedule": "@every 500ms"}, "schedule: the interval of '@every 500ms' is too short"),
        ({"schedule": "@daily", "timezone": "Mars/Olympus"}, "timezone: unknown time zone"),
        ({}, "schedule: field required"),
        ({"schedule": 5}, "schedule: expected a string"),
        ({"schedule": "@daily", "multitask": "interrupt"}, "multitask: expected"),
        ({"schedule": "@daily", "catchUp": "all"}, "catchUp: expected"),
        ({"schedule": "@daily", "endAt": "tomorrow"}, "endAt: expected an RFC 3339 time"),
        ({"schedule": "@daily", "endAt": "2001-01-01T00:00:00Z"}, "endAt: "),
        ({"schedule": "@daily", "webhook": "ftp://x"}, "webhook: expected an http"),
        ({"schedule": "@daily", "sessionId": "s_nope"}, "sessionId: no session 's_nope'"),
        ({"schedule": "@daily", "sessionId": "s_x", "inputs": {}}, "sessionId, inputs: give one"),
    ],
)
async def test_bad_crons_are_400s_naming_the_field(
    start_server: ServerFactory, body: dict[str, Any], says: str
) -> None:
    server = await start_server()
    resp = await server.client.post("/v1/crons", json=body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["reason"] == "invalid_request" and says in error["message"], error
    assert (await server.client.get("/v1/crons")).json() == []


async def test_patch_reschedules_disables_and_is_checked(start_server: ServerFactory) -> None:
    server = await start_server(webhooks=WebhookSettings(secret=SECRET, allow=("h.test",)))
    cron = await make(server, {"schedule": "0 9 * * *", "timezone": "Europe/Paris"})
    assert cron["nextRunAt"].endswith(("T08:00:00.000Z", "T07:00:00.000Z"))  # 09:00 in Paris
    url = f"/v1/crons/{cron['id']}"
    resp = await server.client.patch(url, json={"schedule": "30 6 * * *", "timezone": "UTC"})
    assert resp.status_code == 200 and resp.json()["nextRunAt"].endswith("T06:30:00.000Z")
    off = (await server.client.patch(url, json={"enabled": False})).json()
    assert (off["enabled"], off["nextRunAt"]) == (False, None)
    kept = (await server.client.patch(url, json={"input": "new"})).json()
    assert (kept["input"], kept["nextRunAt"], kept["schedule"]) == ("new", None, "30 6 * * *")
    on = await server.client.patch(url, json={"enabled": True, "webhook": "https://h.test/x"})
    assert on.json()["nextRunAt"].endswith("T06:30:00.000Z")
    assert on.json()["webhook"] == "https://h.test/x"
    cleared = (await server.client.patch(url, json={"webhook": ""})).json()
    assert cleared["webhook"] is None
    bad = await server.client.patch(url, json={"schedule": "@every 0.5s"})
    assert bad.status_code == 400 and "schedule: " in bad.json()["error"]["message"]
    bad = await server.client.patch(url, json={"timezone": "Nowhere/Land"})
    assert bad.status_code == 400 and "timezone: " in bad.json()["error"]["message"]
    assert (await server.client.get(url)).json()["schedule"] == "30 6 * * *"
    assert (await server.client.delete(url)).status_code == 204
    for method in ("GET", "PATCH", "DELETE"):
        gone = await server.client.request(method, url, json={})
        assert gone.status_code == 404 and gone.json()["error"]["reason"] == "not_found"


async def test_crons_are_paged_newest_first(start_server: ServerFactory) -> None:
    server = await start_server()
    made = [(await make(server, {"schedule": "@hourly"}))["id"] for _ in range(5)]
    first = await server.client.get("/v1/crons", params={"limit": 2})
    assert [c["id"] for c in first.json()] == made[::-1][:2]
    assert "lastRuns" not in first.json()[0]
    token = first.headers["trioserve-next-page"]
    rest = await server.client.get("/v1/crons", params={"before": token})
    assert [c["id"] for c in rest.json()] == made[::-1][2:]
    assert "trioserve-next-page" not in rest.headers
    by_id = await server.client.get("/v1/crons", params={"before": made[1]})
    assert [c["id"] for c in by_id.json()] == [made[0]]
    bad = await server.client.get("/v1/crons", params={"before": "c_unknown"})
    assert bad.status_code == 400 and "before: " in bad.json()["error"]["message"]
    bad = await server.client.get("/v1/crons", params={"limit": "0"})
    assert bad.status_code == 400


async def test_tenants_see_only_their_own_crons_up_to_their_cap(
    start_server: ServerFactory,
) -> None:
    server = await start_server(keys=two_tenants(), max_crons_per_tenant=2)
    a, b = auth(KEY_A), auth(KEY_B)
    sid_a = (await server.client.post("/v1/sessions", json={}, headers=a)).json()["id"]
    cron = await make(server, {"schedule": "@daily", "sessionId": sid_a}, headers=a)
    url = f"/v1/crons/{cron['id']}"
    assert (await server.client.get("/v1/crons", headers=b)).json() == []
    for method in ("GET", "PATCH", "DELETE"):
        resp = await server.client.request(method, url, json={"enabled": False}, headers=b)
        assert resp.status_code == 404, resp.text
    assert (await server.client.get(url, headers=a)).json()["enabled"] is True
    # Another tenant's session is no session of the caller's.
    resp = await server.client.post(
        "/v1/crons", json={"schedule": "@daily", "sessionId": sid_a}, headers=b
    )
    assert resp.status_code == 400 and "sessionId: " in resp.json()["error"]["message"]
    await make(server, {"schedule": "@daily"}, headers=a)
    capped = await server.client.post("/v1/crons", json={"schedule": "@daily"}, headers=a)
    assert capped.status_code == 429 and capped.json()["error"]["reason"] == "cron_cap"
    await make(server, {"schedule": "@daily"}, headers=b)  # beta's count is its own
    assert len((await server.client.get("/v1/crons", headers=a)).json()) == 2
    assert (await server.client.get("/v1/crons")).status_code == 401
