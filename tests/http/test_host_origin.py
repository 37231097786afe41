"""Browser defence over real sockets: Host (DNS rebinding), Origin (CSRF), CORS, preflight."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import trio
from trio_websocket import ConnectionRejected, open_websocket_url

from tests.helpers import (
    RawResponse,
    Server,
    ServerFactory,
    raw_request,
    run_cli,
    script,
    start_cli_server,
    write_spec,
)
from trioserve.http._auth import KeyRing, parse_keys
from trioserve.http._browser import (
    default_hosts,
    host_allowed,
    origin_allowed,
    parse_hosts,
    parse_origins,
    split_host,
)

UI = "https://console.example.com"
EVIL = "https://evil.example"
KEY = "ts_browser-test-key"


def keys() -> KeyRing:
    return parse_keys(f"sha256:{hashlib.sha256(KEY.encode()).hexdigest()} ui\n", "k")


def netloc(server: Server) -> str:
    return urlsplit(server.url).netloc


async def send(
    server: Server,
    method: str,
    target: str,
    *,
    host: str | None = None,
    origin: str | None = None,
    body: bytes = b"",
    extra: list[tuple[str, str]] | None = None,
) -> RawResponse:
    """A request as a browser would send it: its Host and Origin exactly as given."""
    headers = [("Host", host or netloc(server))]
    if origin is not None:
        headers.append(("Origin", origin))
    if body:
        headers.append(("Content-Type", "text/plain;charset=UTF-8"))
    return await raw_request(server.url, method, target, headers + (extra or []), body)


def upgrade(key: str | None = None) -> list[tuple[str, str]]:
    headers = [
        ("Connection", "Upgrade"),
        ("Upgrade", "websocket"),
        ("Sec-WebSocket-Version", "13"),
        ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ]
    return headers + ([("Authorization", f"Bearer {key}")] if key else [])


def assert_envelope(resp: RawResponse, code: int, reason: str, needle: str) -> None:
    assert resp.status == code, resp
    assert resp.headers["content-type"] == "application/json"
    error = resp.json()["error"]
    assert (error["code"], error["reason"]) == (code, reason)
    assert needle in error["message"], error


# -- the rules ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "split"),
    [
        ("127.0.0.1:8080", ("127.0.0.1", "8080")),
        ("LocalHost", ("localhost", None)),
        ("localhost.:80", ("localhost", "80")),
        ("[::1]:8080", ("[::1]", "8080")),
        ("[::1]", ("[::1]", None)),
        ("agents.example.com", ("agents.example.com", None)),
        ("evil.example:8080", ("evil.example", "8080")),
        ("", None),
        ("::1", None),
        ("[nothex]", None),
        ("a b", None),
        ("host:port", None),
        ("host:99999", None),
        ("host:", None),
        ("user@host", None),
        ("-bad-.example", None),
    ],
)
def test_split_host(value: str, split: tuple[str, str | None] | None) -> None:
    assert split_host(value) == split


def test_default_hosts_follow_the_bind() -> None:
    assert default_hosts("127.0.0.1") == ("127.0.0.1", "localhost", "[::1]")
    assert default_hosts("::1") == ("[::1]", "localhost", "127.0.0.1")
    assert default_hosts("localhost") == ("localhost", "127.0.0.1", "[::1]")
    assert default_hosts("0.0.0.0") == ("0.0.0.0", "localhost", "127.0.0.1", "[::1]")
    assert default_hosts("10.1.2.3") == ("10.1.2.3",)
    assert default_hosts("fd00::5") == ("[fd00::5]",)


def test_host_allowed() -> None:
    loopback = default_hosts("127.0.0.1")
    assert host_allowed("127.0.0.1:8080", loopback)
    assert host_allowed("localhost:1", loopback)
    assert host_allowed("[::1]:8080", loopback)
    for forged in ("evil.example:8080", "evil.example", "127.0.0.1.evil.example", "", None):
        assert not host_allowed(forged, loopback)
    listed = parse_hosts("Agents.Example.com, 10.0.0.5:8443")
    assert listed == ("agents.example.com", "10.0.0.5:8443")
    assert host_allowed("agents.example.com:443", listed)
    assert host_allowed("10.0.0.5:8443", listed)
    assert not host_allowed("10.0.0.5:8080", listed)
    assert not host_allowed("127.0.0.1", listed)
    assert host_allowed("anything.at.all:1", ("*",))


def test_parse_origins_and_match() -> None:
    assert parse_origins(f"{UI}, http://localhost:3000/") == (UI, "http://localhost:3000")
    for bad in ("console.example.com", "ftp://x.example", f"{UI}/app", "https://", "*", ""):
        with pytest.raises(ValueError, match="invalid origin"):
            parse_origins(bad)
    assert origin_allowed("HTTPS://Console.Example.com", (UI,))
    assert not origin_allowed("https://console.example.com.evil.example", (UI,))
    assert not origin_allowed("null", (UI,))


# -- Host: DNS rebinding -----------------------------------------------------------


async def test_a_rebinding_host_is_refused_before_anything_runs(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    session = (await server.create())["id"]
    forged = "evil.example:8080"
    for method, target in [
        ("GET", "/v1/sessions"),
        ("POST", "/v1/sessions"),
        ("GET", f"/v1/sessions/{session}/events"),
        ("DELETE", f"/v1/sessions/{session}"),
        ("GET", "/v1/nothing"),
    ]:
        resp = await send(server, method, target, host=forged)
        assert_envelope(resp, 421, "host_not_allowed", "'evil.example:8080'")
        assert "--allowed-hosts" in resp.json()["error"]["message"]
    # A WebSocket handshake naming it is refused too, never accepted.
    resp = await send(server, "GET", f"/v1/sessions/{session}/ws", host=forged, extra=upgrade())
    assert_envelope(resp, 421, "host_not_allowed", "evil.example")
    # Nothing was created or ended; the names of loopback are answered, on any port.
    listed = (await server.client.get("/v1/sessions")).json()
    assert [(s["id"], s["status"]) for s in listed] == [(session, "active")]
    for host in (netloc(server), "localhost:9", "[::1]:8080", "127.0.0.1"):
        assert (await send(server, "GET", "/v1/sessions", host=host)).status == 200, host
    # Health checks answer whatever the Host (probes send the pod's address).
    assert (await send(server, "GET", "/healthz", host=forged)).status == 200
    assert (await send(server, "GET", "/readyz", host=forged)).status == 200


async def test_allowed_hosts_replace_the_defaults(start_server: ServerFactory) -> None:
    server = await start_server(allowed_hosts=("agents.example.com",))
    assert (await send(server, "GET", "/v1/sessions", host="agents.example.com:443")).status == 200
    resp = await send(server, "GET", "/v1/sessions", host=netloc(server))
    assert_envelope(resp, 421, "host_not_allowed", "127.0.0.1")
    anything = await start_server(allowed_hosts=("*",))
    assert (await send(anything, "GET", "/v1/sessions", host="evil.example")).status == 200


# -- Origin: CSRF and WebSocket hijacking --------------------------------------------


async def test_a_cross_origin_text_plain_post_creates_nothing(start_server: ServerFactory) -> None:
    """The request a page can send without a preflight, also to loopback."""
    server = await start_server(cors_origins=(UI,))
    session = (await server.create())["id"]
    body = json.dumps({"input": script({"record": "/dev/null"})}).encode()
    for method, target, payload in [
        ("POST", "/v1/sessions", b'{"inputs":{}}'),
        ("POST", f"/v1/sessions/{session}/turns", body),
        ("DELETE", f"/v1/sessions/{session}", b""),
        ("DELETE", f"/v1/sessions/{session}/turns/current", b""),
        ("GET", f"/v1/sessions/{session}/events", b""),
    ]:
        for origin in (EVIL, "null", f"{UI}.evil.example", "http://console.example.com"):
            resp = await send(server, method, target, origin=origin, body=payload)
            assert_envelope(resp, 403, "origin_not_allowed", repr(origin))
            assert "access-control-allow-origin" not in resp.headers
    listed = (await server.client.get("/v1/sessions")).json()
    assert [(s["id"], s["status"]) for s in listed] == [(session, "active")]
    assert (await server.client.get(f"/v1/sessions/{session}/turns")).json() == []


async def test_without_cors_origins_every_origin_is_refused(start_server: ServerFactory) -> None:
    server = await start_server()
    resp = await send(server, "POST", "/v1/sessions", origin=UI, body=b"{}")
    assert_envelope(resp, 403, "origin_not_allowed", UI)
    assert server.manager.active_sessions == 0
    # curl, the Python client and v0.8 clients send no Origin: unaffected.
    assert (await send(server, "POST", "/v1/sessions", body=b"{}")).status == 201


async def test_a_websocket_from_a_foreign_origin_is_refused(start_server: ServerFactory) -> None:
    server = await start_server(cors_origins=(UI,), keys=keys())
    created = await server.client.post("/v1/sessions", headers={"Authorization": f"Bearer {KEY}"})
    session = created.json()["id"]
    target = f"/v1/sessions/{session}/ws"
    # Even with a valid key (a page that got one still may not use it from elsewhere).
    resp = await send(server, "GET", target, origin=EVIL, extra=upgrade(KEY))
    assert_envelope(resp, 403, "origin_not_allowed", EVIL)
    assert "sec-websocket-accept" not in resp.headers
    url = server.url.replace("http://", "ws://") + target
    headers = [(b"Origin", EVIL.encode()), (b"Authorization", f"Bearer {KEY}".encode())]
    with pytest.raises(ConnectionRejected) as rejected:
        async with open_websocket_url(url, extra_headers=headers):
            pytest.fail("the handshake must be refused")
    assert rejected.value.status_code == 403
    # The listed origin's handshake (with the key) is accepted, and runs a turn.
    assert (await send(server, "GET", target, origin=UI, extra=upgrade(KEY))).status == 101
    headers = [(b"Origin", UI.encode()), (b"Authorization", f"Bearer {KEY}".encode())]
    async with open_websocket_url(url, extra_headers=headers) as ws:
        await ws.send_message(json.dumps({"type": "turn", "input": "hi"}))
        while json.loads(await ws.get_message())["type"] != "trioserve.turn.end":
            pass


# -- CORS for listed origins ---------------------------------------------------------------


def assert_cors(resp: RawResponse, origin: str) -> None:
    assert resp.headers["access-control-allow-origin"] == origin
    assert "Origin" in resp.headers["vary"]
    exposed = {h.strip() for h in resp.headers["access-control-expose-headers"].split(",")}
    assert {"Trioserve-Turn-Id", "Retry-After", "Location"} <= exposed
    assert "access-control-allow-credentials" not in resp.headers  # no cookies, ever


async def test_a_listed_origin_gets_cors_headers(start_server: ServerFactory) -> None:
    server = await start_server(cors_origins=(UI, "http://localhost:3000"))
    resp = await send(server, "POST", "/v1/sessions", origin=UI, body=b"{}")
    assert resp.status == 201
    assert_cors(resp, UI)
    session = resp.json()["id"]
    turn = await send(server, "POST", f"/v1/sessions/{session}/turns", origin=UI, body=b"{}")
    assert turn.status == 200 and turn.headers["trioserve-turn-id"].startswith("t_")
    assert_cors(turn, UI)
    assert b"session.ended" in turn.body
    detached = await send(
        server, "POST", f"/v1/sessions/{session}/turns", origin=UI, body=b'{"detach":true}'
    )
    assert detached.status == 202 and detached.headers["location"].startswith("/v1/sessions/")
    assert_cors(detached, UI)
    # Refusals carry them too, so the page can read why.
    missing = await send(server, "GET", "/v1/sessions/s_nope", origin="http://localhost:3000")
    assert missing.status == 404
    assert_cors(missing, "http://localhost:3000")
    # A request without Origin gets no CORS headers, but Vary all the same (for caches).
    plain = await send(server, "GET", "/v1/sessions")
    assert "access-control-allow-origin" not in plain.headers
    assert "Origin" in plain.headers["vary"]


async def test_preflight_for_a_listed_origin(start_server: ServerFactory) -> None:
    server = await start_server(cors_origins=(UI,), keys=keys())
    request = [
        ("Access-Control-Request-Method", "POST"),
        ("Access-Control-Request-Headers", "authorization, content-type"),
    ]
    for target in ("/v1/sessions", "/v1/sessions/s_any/turns", "/v1/sessions/s_any"):
        # No key needed: browsers send none on a preflight.
        resp = await send(server, "OPTIONS", target, origin=UI, extra=request)
        assert resp.status == 204, (target, resp)
        assert resp.body == b""
        assert resp.headers["access-control-allow-origin"] == UI
        methods = {m.strip() for m in resp.headers["access-control-allow-methods"].split(",")}
        assert {"GET", "POST", "DELETE"} <= methods
        allowed = {
            h.strip().lower() for h in resp.headers["access-control-allow-headers"].split(",")
        }
        assert {"authorization", "content-type", "last-event-id"} <= allowed
        assert int(resp.headers["access-control-max-age"]) > 0
        assert "Origin" in resp.headers["vary"]
    refused = await send(server, "OPTIONS", "/v1/sessions", origin=EVIL, extra=request)
    assert_envelope(refused, 403, "origin_not_allowed", EVIL)
    # An OPTIONS that is no preflight (no Access-Control-Request-Method) is no route.
    plain = await send(
        server, "OPTIONS", "/v1/sessions", extra=[("Authorization", f"Bearer {KEY}")]
    )
    assert plain.status == 405
    # The real request then needs its key as always.
    resp = await send(server, "POST", "/v1/sessions", origin=UI, body=b"{}")
    assert resp.status == 401
    assert_cors(resp, UI)


# -- trioserve run ---------------------------------------------------------------------


def test_bad_host_and_origin_flags_are_one_line_errors(tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    for flag, value, needle in [
        ("--allowed-hosts", "a.example,,b.example", "argument --allowed-hosts: invalid host ''"),
        ("--allowed-hosts", "a b", "invalid host 'a b'"),
        ("--cors-origins", "console.example.com", "argument --cors-origins: invalid origin"),
        ("--cors-origins", f"{UI}/app", f"invalid origin '{UI}/app'"),
    ]:
        result = run_cli(tmp_path, "run", str(spec), flag, value)
        assert result.returncode == 2, result
        assert len(result.stderr.splitlines()) == 1 and needle in result.stderr, result.stderr


async def test_run_flags_reach_the_server(nursery: trio.Nursery, tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    server = await start_cli_server(
        nursery,
        tmp_path,
        spec,
        "--in-memory",
        "--allowed-hosts",
        "agents.example.com,localhost",
        "--allowed-hosts",
        "127.0.0.1",
        "--cors-origins",
        UI,
    )
    fake = Server(server.url, None, None, None)  # type: ignore[arg-type]
    assert (await send(fake, "GET", "/v1/sessions", host="evil.example")).status == 421
    assert (await send(fake, "GET", "/v1/sessions", host="agents.example.com")).status == 200
    assert (await send(fake, "GET", "/v1/sessions")).status == 200
    assert (await send(fake, "POST", "/v1/sessions", origin=EVIL, body=b"{}")).status == 403
    resp = await send(fake, "POST", "/v1/sessions", origin=UI, body=b"{}")
    assert resp.status == 201
    assert_cors(resp, UI)
    server.signal()
    assert await server.wait() == 0
