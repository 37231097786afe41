"""Stricter HTTP/1.1: what is refused in a request head before any route, never a 5xx.

Each refusal is the envelope with ``Connection: close``; none leaves a
traceback in the log.  The rules are ``trioserve.http._strict``'s.
"""

from __future__ import annotations

import logging
import os

import pytest
import trio
import wsproto
from hypothesis import given, settings
from hypothesis import strategies as st
from werkzeug.exceptions import BadHost
from werkzeug.routing import Map
from wsproto.events import AcceptConnection, CloseConnection, Request

from tests.helpers import GUARD, KEY_A, Raw, ServerFactory, parse_reply, two_tenants
from trioserve.http._strict import valid_host

MALFORMED_HOSTS = [
    "a..b",  # an empty label: werkzeug's BadHost, a 500 before
    "a" * 64 + ".example",  # a label over 63 characters: the same
    ".",
    "..",
    ".example",
    "x" * 254,
    "[::1",  # an unclosed bracket
    "[::1]x",
    "[v1.future]",  # IPvFuture
    "[127.0.0.1]",
    "::1",  # IPv6 without its brackets
    "host:99999",  # odd ports
    "host:-1",
    "host:1a",
    "host:123456",
    "host:80:80",
    "a%41b",  # percent-encoding in the authority
    "%5B::1%5D",
    "user@host",  # user info
    "host/path",
    "host?q",
    "h st",
    "",
    "é.example",  # a raw IDNA name (it is sent as xn--...)
    "xn--\udcff",
]
VALID_HOSTS = ["localhost", "127.0.0.1:8080", "[::1]", "[::1]:80", "localhost.", "a-b_c.example:1"]


def _head(host: str) -> bytes:
    raw = host.encode("utf-8", "surrogateescape")
    return b"GET /healthz HTTP/1.1\r\nHost: " + raw + b"\r\nConnection: close\r\n\r\n"


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/v1/sessions"])
async def test_a_malformed_host_is_a_400_on_every_route(
    start_server: ServerFactory, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    # Any Host allowed, and keys: the 400 comes before both.
    server = await start_server(allowed_hosts=("*",), keys=two_tenants())
    for host in MALFORMED_HOSTS:
        raw = await Raw.open(server.url)
        head = _head(host).replace(b"/healthz", path.encode(), 1)
        await raw.send(head)
        reply = parse_reply(await raw.until_closed())
        assert reply.status == 400, (host, reply)
        assert reply.headers["connection"] == "close"
        error = reply.error()
        assert error["reason"] == "bad_request" and "malformed Host header" in error["message"]
    for host in VALID_HOSTS:
        raw = await Raw.open(server.url)
        await raw.send(_head(host))
        assert parse_reply(await raw.until_closed()).status == 200, host
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize(
    "head",
    [
        b"HEAD /healthz HTTP/1.1\r\nHost: a..b\r\n\r\n",
        b"HEAD /v1/sessions HTTP/1.1\r\nHost: x\r\nAuthorization: a\r\nAuthorization: b\r\n\r\n",
    ],
    ids=["host", "two-authorizations"],
)
async def test_a_refused_head_request_gets_a_head_without_body(
    start_server: ServerFactory, caplog: pytest.LogCaptureFixture, head: bytes
) -> None:
    """Found by ``nox -s fuzz``: the envelope's body after a HEAD's refusal failed in h11
    (a traceback, the connection dropped)."""
    server = await start_server(allowed_hosts=("*",))
    raw = await Raw.open(server.url)
    await raw.send(head)
    data = await raw.until_closed()
    assert data.startswith(b"HTTP/1.1 400 Bad Request\r\n"), data
    assert data.endswith(b"\r\n\r\n") and data.count(b"\r\n\r\n") == 1, data
    assert b"content-type: application/json" in data.lower()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize(
    ("method", "target", "status"),
    [
        ("GET", "?v1/sessions", 400),
        ("POST", "v1/sessions", 400),
        ("GET", "http://127.0.0.1", 400),
        ("GET", "#x", 400),
        ("GET", "*", 400),
        ("GET", "http://127.0.0.1/healthz", None),  # absolute-form: no route matches it (404)
        ("OPTIONS", "*", None),
    ],
)
async def test_a_request_target_without_a_path_is_a_400(
    start_server: ServerFactory,
    caplog: pytest.LogCaptureFixture,
    method: str,
    target: str,
    status: int | None,
) -> None:
    """Found by ``nox -s fuzz``: ``POST ?v1/sessions`` was a 500 and a traceback (quart
    took the path of a target that is not origin-form as empty, and failed on it)."""
    server = await start_server(allowed_hosts=("*",))
    raw = await Raw.open(server.url)
    body = b"{}" if method == "POST" else b""
    head = f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    await raw.send(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    reply = parse_reply(await raw.until_closed())
    if status is None:
        assert reply.status < 500, reply
    else:
        assert reply.status == status, reply
    if status == 400:
        assert "malformed request target" in reply.error()["message"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@settings(max_examples=500, derandomize=True, database=None, deadline=None)
@given(host=st.text(max_size=80) | st.from_regex(r"[a-z0-9.:\[\]_-]{0,70}", fullmatch=True))
def test_every_host_let_through_is_one_werkzeug_can_bind(host: str) -> None:
    """What the check lets through, quart's URL adapter (werkzeug's ``Map.bind``) takes."""
    value = host.encode("utf-8", "surrogateescape")
    if valid_host(value):
        try:
            Map().bind(host)
        except BadHost:
            pytest.fail(f"{host!r} passes the check and fails werkzeug")


@pytest.mark.parametrize("method", ["get", "Get", "M123", "PROPFIND", "BREW"])
async def test_methods_are_case_sensitive_and_unknown_ones_are_501(
    start_server: ServerFactory, method: str
) -> None:
    server = await start_server()
    raw = await Raw.open(server.url)
    await raw.send(raw.head(method, "/healthz"))
    reply = parse_reply(await raw.until_closed())
    assert (reply.status, reply.headers["connection"]) == (501, "close")
    error = reply.error()
    assert error["reason"] == "not_implemented" and repr(method) in error["message"]
    assert (await server.client.get("/healthz")).status_code == 200


async def test_two_authorization_headers_are_a_400(start_server: ServerFactory) -> None:
    server = await start_server(keys=two_tenants())
    raw = await Raw.open(server.url)
    key = f"Authorization: Bearer {KEY_A}"
    await raw.send(raw.head("GET", "/v1/sessions", key, "Authorization: Bearer ts_other"))
    reply = parse_reply(await raw.until_closed())
    assert reply.status == 400 and "one Authorization header" in reply.error()["message"]
    # The same key twice is no better.
    raw = await Raw.open(server.url)
    await raw.send(raw.head("GET", "/v1/sessions", key, key))
    assert parse_reply(await raw.until_closed()).status == 400


@pytest.mark.parametrize(
    "fields",
    [
        ("Transfer-Encoding: identity", " chunked"),  # a folded chunked: honoured before
        ("X-Note: one", "\ttwo", "Content-Length: 2"),
    ],
)
async def test_obs_fold_is_a_400(start_server: ServerFactory, fields: tuple[str, ...]) -> None:
    server = await start_server()
    raw = await Raw.open(server.url)
    body = b"2\r\n{}\r\n0\r\n\r\n" if "chunked" in fields[1] else b"{}"
    await raw.send(raw.head("POST", "/v1/sessions", *fields) + body)
    reply = parse_reply(await raw.until_closed())
    assert reply.status == 400 and "line folding" in reply.error()["message"]
    assert (await server.client.get("/v1/sessions")).json() == []


@pytest.mark.parametrize(
    "size",
    [
        b"1" + b"0" * 16,  # 2^64, its line not finished: refused at the 17th digit
        b"f" * 40,
        b"8000000000000000\r\n",  # 2^63, a whole line
        b"ffffffffffffffff\r\n",
    ],
)
async def test_an_oversized_chunk_size_is_a_400_at_once(
    start_server: ServerFactory, size: bytes
) -> None:
    server = await start_server()
    raw = await Raw.open(server.url)
    await raw.send(raw.head("POST", "/v1/sessions", "Transfer-Encoding: chunked") + size)
    # Not a wait for 2^63 bytes: the answer comes with the connection still open.
    with trio.fail_after(GUARD):
        reply = parse_reply(await raw.until_closed())
    assert reply.status == 400 and "chunk size" in reply.error()["message"]


async def test_a_websocket_text_that_is_not_utf8_closes_1007(start_server: ServerFactory) -> None:
    server = await start_server()
    session = (await server.create())["id"]
    ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    raw = await Raw.open(server.url)
    await raw.send(ws.send(Request(host=raw.host, target=f"/v1/sessions/{session}/ws")))
    with trio.fail_after(GUARD):
        ws.receive_data(await raw.stream.receive_some(65536))
    assert isinstance(next(ws.events()), AcceptConnection)
    # A masked text frame by hand: wsproto would not send bytes that are not UTF-8.
    payload, mask = b"\xff\xfe", os.urandom(4)
    masked = bytes(byte ^ mask[i % 4] for i, byte in enumerate(payload))
    await raw.send(bytes([0x81, 0x80 | len(payload)]) + mask + masked)
    ws.receive_data(await raw.until_closed())
    closes = [e for e in ws.events() if isinstance(e, CloseConnection)]
    assert [c.code for c in closes] == [1007], closes
