"""API keys and tenants: the key file, 401s, isolation between tenants, per-tenant caps."""

from __future__ import annotations

import hashlib
import hmac
import json
import subprocess
from collections import Counter
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket_url

from tests.helpers import (
    KEY_A,
    KEY_B,
    Server,
    ServerFactory,
    auth,
    key_line,
    parse_sse,
    raw_request,
    run_cli,
    script,
    start_cli_server,
    two_tenants,
    write_spec,
)
from tests.helpers.backends import DURABLE
from trioserve.client import Client, NotFoundError, RateLimitedError, UnauthorizedError
from trioserve.http._auth import (
    KeyFileError,
    bearer_token,
    check_tenant,
    load_keys,
    new_key,
    parse_keys,
)

HANG = script({"event": "message", "data": {"text": "working"}}, {"hang": True})


line = key_line


# -- the key file ------------------------------------------------------------------


def test_key_file_with_comments_blank_lines_and_upper_case_hex() -> None:
    text = (
        "# trioserve keys\n"
        "\n"
        f"{line(KEY_A, 'alpha')}   # the first tenant\n"
        f"   {line('ts_other', 'alpha').upper().replace('SHA256:', 'sha256:')[:-5]}alpha\n"
        f"{line(KEY_B, 'beta.team_2-x')}\n"
    )
    ring = parse_keys(text, "k")
    assert ring.tenant_for(KEY_A) == "alpha"
    assert ring.tenant_for("ts_other") == "alpha"
    assert ring.tenant_for(KEY_B) == "beta.team_2-x"
    assert ring.tenant_for("ts_nope") is None
    assert ring.tenant_for("") is None
    assert ring.tenants == {"alpha", "beta.team_2-x"}


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            "sha256:" + "a" * 64,
            "keys.txt:2: expected 'sha256:<64 hex digits> TENANT [SCOPE...]', got 1 field",
        ),
        ("sha256:" + "a" * 64 + " t extra", "keys.txt:2: unknown scope 'extra'"),
        ("sha256:" + "a" * 63 + " t", "keys.txt:2: expected 'sha256:' and 64 hex digits"),
        ("sha256:" + "g" * 64 + " t", "keys.txt:2: expected 'sha256:' and 64 hex digits"),
        ("md5:" + "a" * 32 + " t", "keys.txt:2: expected 'sha256:' and 64 hex digits"),
        (f"{KEY_A} t", "it looks like a key, not its SHA-256 (see `trioserve keys new`)"),
        ("sha256:" + "a" * 64 + " -bad", "keys.txt:2: invalid tenant name '-bad'"),
        ("sha256:" + "a" * 64 + " " + "x" * 65, "keys.txt:2: invalid tenant name"),
        (line(KEY_A, "alpha"), "keys.txt:2: the same key is already on line 1"),
    ],
)
def test_a_malformed_key_line_names_file_and_line(text: str, needle: str) -> None:
    with pytest.raises(KeyFileError) as caught:
        parse_keys(f"{line(KEY_A, 'alpha')}\n{text}\n", "keys.txt")
    assert needle in str(caught.value)


def test_a_key_file_without_keys_or_unreadable_is_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("# nothing yet\n\n")
    with pytest.raises(KeyFileError, match=f"{empty}: no keys"):
        load_keys(empty)
    with pytest.raises(KeyFileError, match=f"cannot read key file {tmp_path / 'missing'}"):
        load_keys(tmp_path / "missing")
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(KeyFileError, match=f"{binary}: not UTF-8"):
        load_keys(binary)


def test_every_entry_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """``hmac.compare_digest`` against every entry, also after a match: no early exit."""
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    keys = [f"ts_{i}" for i in range(5)]
    ring = parse_keys("\n".join(line(k, f"t{i}") for i, k in enumerate(keys)), "k")
    for wanted in (keys[0], keys[4], "ts_unknown"):
        calls.clear()
        ring.tenant_for(wanted)
        assert len(calls) == 5
        assert all(b == hashlib.sha256(wanted.encode()).digest() for _, b in calls)
        assert [a for a, _ in calls] == [e.digest for e in ring.entries]


def test_new_key_round_trips_and_checks_the_tenant() -> None:
    key, entry = new_key("acme")
    assert key.startswith("ts_") and len(key) > 40
    assert parse_keys(entry, "k").tenant_for(key) == "acme"
    assert new_key("acme")[0] != key
    with pytest.raises(ValueError, match="invalid tenant name 'a b'"):
        new_key("a b")
    assert check_tenant("A.b_c-9") == "A.b_c-9"


@pytest.mark.parametrize(
    ("header", "token"),
    [
        (None, None),
        ("Bearer abc", "abc"),
        ("bearer  abc ", "abc"),
        ("BEARER abc", "abc"),
        ("Bearer", None),
        ("Bearer ", None),
        ("Basic abc", None),
        ("abc", None),
    ],
)
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


# -- 401 --------------------------------------------------------------------------


def assert_401(status: int, headers: Mapping[str, str], body: Any, *, invalid: bool) -> None:
    """The 401 of a missing (``invalid=False``) or a wrong key."""
    assert status == 401
    challenge = headers["www-authenticate"]
    assert challenge.startswith('Bearer realm="trioserve"')
    assert ('error="invalid_token"' in challenge) is invalid
    assert headers["content-type"] == "application/json"
    error = body["error"]
    assert (error["code"], error["reason"]) == (401, "unauthorized")
    assert ("not valid" if invalid else "Authorization: Bearer KEY") in error["message"]


async def test_every_route_but_health_needs_a_key(start_server: ServerFactory) -> None:
    server = await start_server(keys=two_tenants())
    session = (await server.client.post("/v1/sessions", headers=auth(KEY_A))).json()["id"]
    routes = [
        ("POST", "/v1/sessions"),
        ("GET", "/v1/sessions"),
        ("GET", f"/v1/sessions/{session}"),
        ("DELETE", f"/v1/sessions/{session}"),
        ("POST", f"/v1/sessions/{session}/turns"),
        ("GET", f"/v1/sessions/{session}/turns"),
        ("GET", f"/v1/sessions/{session}/events"),
        ("DELETE", f"/v1/sessions/{session}/turns/current"),
        ("GET", "/v1/nothing"),  # an unknown route: 401 too, routes are not revealed
    ]
    for method, path in routes:
        for headers, invalid in (
            ({}, False),
            ({"Authorization": "Basic dXNlcjpwdw=="}, False),
            (auth("ts_wrong"), True),
            (auth(KEY_A + "x"), True),
        ):
            resp = await server.client.request(method, path, headers=headers)
            assert resp.status_code == 401, (method, path, resp.text)
            assert_401(resp.status_code, resp.headers, resp.json(), invalid=invalid)
    assert (await server.client.get(f"/v1/sessions/{session}")).status_code == 401
    assert (await server.client.get("/healthz")).text == "ok\n"
    assert (await server.client.get("/readyz")).status_code == 200
    # Nothing was changed by the refused calls.
    resp = await server.client.get("/v1/sessions", headers=auth(KEY_A))
    assert [(s["id"], s["status"]) for s in resp.json()] == [(session, "active")]
    assert server.manager.turns_in_flight == 0


async def test_a_websocket_without_a_key_is_refused_before_accepting(
    start_server: ServerFactory,
) -> None:
    server = await start_server(keys=two_tenants())
    session = (await server.client.post("/v1/sessions", headers=auth(KEY_A))).json()["id"]
    upgrade = [
        ("Host", server.url.removeprefix("http://")),
        ("Connection", "Upgrade"),
        ("Upgrade", "websocket"),
        ("Sec-WebSocket-Version", "13"),
        ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ]
    target = f"/v1/sessions/{session}/ws"
    for extra, invalid in (([], False), ([("Authorization", "Bearer ts_wrong")], True)):
        resp = await raw_request(server.url, "GET", target, upgrade + extra)
        assert "sec-websocket-accept" not in resp.headers
        assert_401(resp.status, resp.headers, resp.json(), invalid=invalid)
    # The same handshake with the key is accepted.
    with_key = [*upgrade, ("Authorization", f"Bearer {KEY_A}")]
    assert (await raw_request(server.url, "GET", target, with_key)).status == 101
    # trio-websocket sees the refusal as such.
    url = server.url.replace("http://", "ws://") + target
    with pytest.raises(ConnectionRejected) as rejected:
        async with open_websocket_url(url):
            pytest.fail("the handshake must be refused")
    assert rejected.value.status_code == 401


# -- two tenants -------------------------------------------------------------------


async def as_tenant(
    server: Server, key: str, method: str, path: str, headers: Mapping[str, str] = {}, **kw: Any
) -> httpx.Response:
    return await server.client.request(method, path, headers={**auth(key), **headers}, **kw)


async def test_a_tenant_never_sees_another_tenants_session(start_server: ServerFactory) -> None:
    server = await start_server(keys=two_tenants())
    a = (await as_tenant(server, KEY_A, "POST", "/v1/sessions")).json()["id"]
    b = (await as_tenant(server, KEY_B, "POST", "/v1/sessions")).json()["id"]
    resp = await as_tenant(server, KEY_A, "POST", f"/v1/sessions/{a}/turns", json={"input": "hi"})
    assert resp.status_code == 200
    turn_id = resp.headers["trioserve-turn-id"]
    base = f"/v1/sessions/{a}"
    unknown = "s_doesnotexist0"

    async def refused(method: str, path: str, **kw: Any) -> None:
        """``beta`` gets exactly what it gets for a session that does not exist."""
        resp = await as_tenant(server, KEY_B, method, path, **kw)
        twin = await as_tenant(server, KEY_B, method, path.replace(a, unknown), **kw)
        assert resp.status_code == twin.status_code == 404, (method, path, resp.text)
        assert resp.json() == json.loads(twin.text.replace(unknown, a)), (method, path)
        assert resp.json()["error"]["reason"] == "not_found"

    await refused("GET", base)
    await refused("GET", f"{base}/turns")
    await refused("GET", f"{base}/turns/{turn_id}")
    await refused("GET", f"{base}/events")
    await refused("GET", f"{base}/events?format=json")
    await refused("GET", f"{base}/events?follow=true")
    await refused("GET", f"{base}/events", headers={"Last-Event-ID": "1"})
    await refused("POST", f"{base}/turns", json={"input": "steal"})
    await refused("POST", f"{base}/turns", json={"input": "steal", "detach": True})
    await refused("DELETE", f"{base}/turns/current")  # not no_turn: that would tell
    await refused("DELETE", base)
    # The lists: each tenant sees its own only, filters and limits included.
    for key, own in ((KEY_A, a), (KEY_B, b)):
        for query in ("", "?status=active", "?limit=5"):
            listed = (await as_tenant(server, key, "GET", f"/v1/sessions{query}")).json()
            assert [s["id"] for s in listed] == [own]
    # Paging: another tenant's session id is no cursor (as an unknown id), and
    # pages hold the caller's sessions only.
    for cursor in (a, unknown):
        resp = await as_tenant(server, KEY_B, "GET", f"/v1/sessions?before={cursor}")
        assert resp.status_code == 400
        assert resp.json()["error"]["message"] == (
            f"before: {cursor!r} is neither a page token nor the id of a session"
        )
    more_b = [
        (await as_tenant(server, KEY_B, "POST", "/v1/sessions")).json()["id"] for _ in range(3)
    ]
    seen, query = [], "?limit=2"
    while True:
        resp = await as_tenant(server, KEY_B, "GET", f"/v1/sessions{query}")
        seen += [s["id"] for s in resp.json()]
        if "trioserve-next-page" not in resp.headers:
            break
        query = f"?limit=2&before={resp.headers['trioserve-next-page']}"
    assert sorted(seen) == sorted([b, *more_b])
    # alpha's session is untouched, its turn and log intact.
    session = (await as_tenant(server, KEY_A, "GET", base)).json()
    assert session["status"] == "active"
    turns = (await as_tenant(server, KEY_A, "GET", f"{base}/turns")).json()
    assert [t["id"] for t in turns] == [turn_id]
    log = (await as_tenant(server, KEY_A, "GET", f"{base}/events?format=json")).json()
    assert log[-1]["type"] == "session.ended" and len(log) == turns[0]["lastSeq"]
    # Over WebSocket: beta's connection to alpha's session is closed as unknown.
    url = server.url.replace("http://", "ws://") + f"{base}/ws"
    headers = [(b"Authorization", f"Bearer {KEY_B}".encode())]
    async with open_websocket_url(url, extra_headers=headers) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            await ws.get_message()
    reason = closed.value.reason
    assert reason is not None
    assert reason.code == 4404
    assert reason.reason == f"session {a} not found"
    # alpha's own WebSocket works: a turn, then a resume of the log.
    headers = [(b"Authorization", f"Bearer {KEY_A}".encode())]
    async with open_websocket_url(url, extra_headers=headers) as ws:
        await ws.send_message(json.dumps({"type": "resume", "after": 0}))
        seen = []
        while (message := json.loads(await ws.get_message()))["type"] != "trioserve.resume.end":
            seen.append(message["seq"])
        assert seen == list(range(1, len(log) + 1))


async def test_another_tenant_cannot_cancel_or_end_a_running_turn(
    start_server: ServerFactory,
) -> None:
    server = await start_server(keys=two_tenants())
    a = (await as_tenant(server, KEY_A, "POST", "/v1/sessions")).json()["id"]
    body = {"input": script({"tick": 3, "every": 0.3}, {"end": "completed"})}
    async with server.client.stream(
        "POST", f"/v1/sessions/{a}/turns", json=body, headers=auth(KEY_A)
    ) as stream:
        assert stream.status_code == 200
        # beta tries to stop alpha's turn while it runs.
        assert (
            await as_tenant(server, KEY_B, "DELETE", f"/v1/sessions/{a}/turns/current")
        ).status_code == 404
        assert (await as_tenant(server, KEY_B, "DELETE", f"/v1/sessions/{a}")).status_code == 404
        text = (await stream.aread()).decode()
    frames = parse_sse(text)
    assert [f.data["data"].get("i") for f in frames if f.event == "message"] == [0, 1, 2]
    assert frames[-1].data["data"]["reason"] == "completed"
    assert (await as_tenant(server, KEY_A, "GET", f"/v1/sessions/{a}")).json()["status"] == "active"


@pytest.mark.backends(*DURABLE)
async def test_sessions_made_without_keys_belong_to_no_tenant(
    start_server: ServerFactory, backend_url: str
) -> None:
    """A store from a server without keys: its sessions are nobody's once keys are on."""
    store = backend_url
    open_server = await start_server(store=store)
    old = (await open_server.create())["id"]
    open_server.stop.drain.set()
    with trio.fail_after(30):
        await open_server.done.wait()
    server = await start_server(store=store, keys=two_tenants())
    assert (await as_tenant(server, KEY_A, "GET", f"/v1/sessions/{old}")).status_code == 404
    assert (await as_tenant(server, KEY_A, "GET", "/v1/sessions")).json() == []


# -- per-tenant caps ---------------------------------------------------------------


async def test_the_tenant_session_cap_is_exact_under_concurrency(
    start_server: ServerFactory,
) -> None:
    server = await start_server(keys=two_tenants(), max_sessions_per_tenant=5, max_sessions=8)
    codes: Counter[tuple[int, str]] = Counter()

    async def create(key: str) -> None:
        resp = await as_tenant(server, key, "POST", "/v1/sessions")
        reason = "" if resp.status_code == 201 else resp.json()["error"]["reason"]
        if resp.status_code == 429:
            assert resp.headers["retry-after"] == "1"
            if reason == "tenant_session_cap":
                assert resp.json()["error"]["message"].endswith("(max 5)")
        codes[(resp.status_code, reason)] += 1

    async with trio.open_nursery() as nursery:
        for _ in range(60):
            nursery.start_soon(create, KEY_A)
    assert codes == {(201, ""): 5, (429, "tenant_session_cap"): 55}
    # beta has its own five, and then the global cap (8) says no first.
    codes.clear()
    async with trio.open_nursery() as nursery:
        for _ in range(20):
            nursery.start_soon(create, KEY_B)
    assert codes == {(201, ""): 3, (429, "session_cap"): 17}
    # Ending a session frees the tenant's slot (and only it gets it).
    first = (await as_tenant(server, KEY_A, "GET", "/v1/sessions")).json()[0]["id"]
    assert (await as_tenant(server, KEY_A, "DELETE", f"/v1/sessions/{first}")).status_code == 204
    assert (await as_tenant(server, KEY_A, "POST", "/v1/sessions")).status_code == 201
    resp = await as_tenant(server, KEY_A, "POST", "/v1/sessions")
    assert resp.json()["error"]["reason"] == "tenant_session_cap"


@pytest.mark.backends(*DURABLE)
async def test_the_tenant_session_cap_counts_sessions_found_at_start(
    start_server: ServerFactory, backend_url: str
) -> None:
    store = backend_url
    first = await start_server(store=store, keys=two_tenants(), max_sessions_per_tenant=3)
    for _ in range(3):
        assert (await as_tenant(first, KEY_A, "POST", "/v1/sessions")).status_code == 201
    first.stop.drain.set()
    with trio.fail_after(30):
        await first.done.wait()
    server = await start_server(store=store, keys=two_tenants(), max_sessions_per_tenant=3)
    resp = await as_tenant(server, KEY_A, "POST", "/v1/sessions")
    assert resp.status_code == 429 and resp.json()["error"]["reason"] == "tenant_session_cap"
    assert (await as_tenant(server, KEY_B, "POST", "/v1/sessions")).status_code == 201


async def test_the_tenant_turn_cap_is_exact_under_concurrency(
    start_server: ServerFactory,
) -> None:
    server = await start_server(
        keys=two_tenants(), max_turns_per_tenant=3, max_concurrent_turns=6, warm_adapters=0
    )
    sessions = [
        (await as_tenant(server, KEY_A, "POST", "/v1/sessions")).json()["id"] for _ in range(15)
    ]
    other = (await as_tenant(server, KEY_B, "POST", "/v1/sessions")).json()["id"]
    codes: Counter[tuple[int, str]] = Counter()
    body = {"input": script({"sleep": 3}, {"end": "completed"})}

    async def turn(session_id: str) -> None:
        async with server.client.stream(
            "POST", f"/v1/sessions/{session_id}/turns", json=body, headers=auth(KEY_A)
        ) as resp:
            reason = ""
            if resp.status_code != 200:
                reason = json.loads(await resp.aread())["error"]["reason"]
                assert resp.headers["retry-after"] == "1"
            codes[(resp.status_code, reason)] += 1
            await resp.aread()

    async with trio.open_nursery() as nursery:
        for session_id in sessions:
            nursery.start_soon(turn, session_id)
        with trio.fail_after(10):
            while sum(codes.values()) < 15:
                await trio.sleep(0.01)
        assert codes == {(200, ""): 3, (429, "tenant_turn_cap"): 12}
        # While alpha holds its three, beta still runs a turn.
        resp = await as_tenant(
            server, KEY_B, "POST", f"/v1/sessions/{other}/turns", json={"input": "hi"}
        )
        assert resp.status_code == 200 and "session.ended" in resp.text
    # Every slot is free again afterwards.
    assert server.manager.turns_in_flight == 0
    resp = await as_tenant(server, KEY_A, "POST", f"/v1/sessions/{sessions[0]}/turns", json={})
    assert resp.status_code == 200


async def test_without_keys_there_are_no_tenant_caps(start_server: ServerFactory) -> None:
    server = await start_server(max_sessions_per_tenant=1, max_turns_per_tenant=1)
    for _ in range(3):
        await server.create()


# -- the client ----------------------------------------------------------------------


async def test_the_client_sends_its_key_over_http_and_websocket(
    start_server: ServerFactory,
) -> None:
    server = await start_server(keys=two_tenants())
    async with Client(server.url) as anonymous:
        with pytest.raises(UnauthorizedError) as caught:
            await anonymous.list_sessions()
        assert (caught.value.code, caught.value.reason) == (401, "unauthorized")
        assert await anonymous.health()
    async with (
        Client(server.url, api_key=KEY_A) as alpha,
        Client(server.url, api_key=KEY_B) as beta,
    ):
        session = await alpha.create_session()
        for transport in ("sse", "websocket"):
            async with alpha.turn(session.id, "hi", transport=transport) as events:
                types = [event.type async for event in events]
            assert types[-1] == "session.ended"
            with pytest.raises(NotFoundError):
                async with beta.turn(session.id, "hi", transport=transport) as events:
                    pytest.fail("beta must not reach alpha's session")
        async with alpha.events(session.id, transport="websocket") as events:
            assert len([e async for e in events]) == len(await alpha.export(session.id))
        assert [s.id for s in await alpha.list_sessions()] == [session.id]
        assert await beta.list_sessions() == []
        with pytest.raises(RateLimitedError):
            async with Client(server.url, api_key=KEY_B) as many:
                for _ in range(101):
                    await many.create_session()


# -- trioserve keys / run ---------------------------------------------------------------


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


async def test_keys_new_round_trips_through_a_served_key_file(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    made = run_cli(tmp_path, "keys", "new", "acme")
    assert made.returncode == 0, made.stderr
    key, entry = made.stdout.splitlines()
    assert key.startswith("ts_") and entry.startswith("sha256:") and entry.endswith(" acme")
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text(f"# made by trioserve keys new\n{entry}\n")
    spec = write_spec(tmp_path)
    server = await start_cli_server(
        nursery, tmp_path, spec, "--in-memory", "--api-keys", str(keys_file)
    )
    assert "API keys of 1 tenant)" in server.startup_line
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        assert (await client.get("/v1/sessions")).status_code == 401
        assert (await client.get("/healthz")).status_code == 200
        resp = await client.post("/v1/sessions", headers=auth(key))
        assert resp.status_code == 201
        session = resp.json()["id"]
    # trioserve sessions: --api-key, or TRIOSERVE_API_KEY.
    listed = await trio.to_thread.run_sync(
        partial(run_cli, tmp_path, "sessions", server.url, "--api-key", key)
    )
    assert listed.returncode == 0 and session in listed.stdout, listed
    listed = await trio.to_thread.run_sync(
        partial(run_cli, tmp_path, "sessions", server.url, env={"TRIOSERVE_API_KEY": key})
    )
    assert listed.returncode == 0 and session in listed.stdout, listed
    refused = await trio.to_thread.run_sync(partial(run_cli, tmp_path, "sessions", server.url))
    assert refused.returncode == 1 and "401 unauthorized" in refused.stderr, refused
    server.signal()
    assert await server.wait() == 0


def test_keys_new_refuses_a_bad_tenant_name(tmp_path: Path) -> None:
    error = one_line_error(run_cli(tmp_path, "keys", "new", "no spaces"))
    assert "invalid tenant name 'no spaces'" in error


def test_a_malformed_key_file_stops_run_naming_file_and_line(tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text(f"# keys\n{line(KEY_A, 'alpha')}\n{KEY_B} beta\n")
    error = one_line_error(run_cli(tmp_path, "run", str(spec), "--api-keys", str(keys_file)))
    assert f"{keys_file}:3: expected 'sha256:' and 64 hex digits" in error
    # The same from TRIOSERVE_API_KEYS_FILE.
    env = {"TRIOSERVE_API_KEYS_FILE": str(keys_file)}
    error = one_line_error(run_cli(tmp_path, "run", str(spec), env=env))
    assert f"{keys_file}:3:" in error
    # And keys exclude --insecure-no-auth.
    error = one_line_error(run_cli(tmp_path, "run", str(spec), "--insecure-no-auth", env=env))
    assert "--insecure-no-auth and --api-keys" in error


async def test_a_non_loopback_bind_needs_keys_or_insecure_no_auth(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path)
    error = one_line_error(
        await trio.to_thread.run_sync(
            partial(run_cli, tmp_path, "run", str(spec), "--host", "0.0.0.0", "--port", "0")
        )
    )
    assert error.startswith("trioserve: refusing to serve on 0.0.0.0 without API keys")
    assert "--api-keys FILE" in error and "--insecure-no-auth" in error
    server = await start_cli_server(
        nursery, tmp_path, spec, "--in-memory", "--host", "0.0.0.0", "--insecure-no-auth"
    )
    assert server.url.startswith("http://0.0.0.0:") and "no API keys)" in server.startup_line
    assert "--insecure-no-auth: serving on 0.0.0.0 without authentication" in server.log
    port = server.url.rsplit(":", 1)[1]
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        assert (await client.post("/v1/sessions")).status_code == 201
    server.signal()
    assert await server.wait() == 0
