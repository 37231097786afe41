"""``GET /v1/sessions`` in pages, and the retention purge, over a real server on each store
backend (``backend_url``: tests/helpers/backends.py)."""

from __future__ import annotations

import base64
import re
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
import trio
import trio.lowlevel

from tests.helpers import ServerFactory, script
from trioserve.http._paging import decode_token, encode_token
from trioserve.protocol import NEXT_PAGE_HEADER
from trioserve.stores import SessionKey
from trioserve.stores.base import utcnow

_LINK = re.compile(r'<(?P<target>[^>]+)>; rel="next"')


def ids(resp: httpx.Response) -> list[str]:
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert isinstance(body, list)  # a v0.8 client parses an array, paged or not
    return [s["id"] for s in body]


def next_link(resp: httpx.Response) -> str | None:
    """The next page's target, checked against the token header (both or neither)."""
    token = resp.headers.get(NEXT_PAGE_HEADER)
    link = resp.headers.get("Link")
    if token is None:
        assert link is None, link
        return None
    assert link is not None
    match = _LINK.fullmatch(link)
    assert match is not None, link
    target = match["target"]
    assert target.startswith("/v1/sessions?") and target.endswith(f"before={token}"), target
    return target


async def all_pages(
    client: httpx.AsyncClient, first: str, first_read: trio.Event | None = None
) -> list[list[str]]:
    """Follow the ``Link: rel="next"`` targets from ``first``; each page's ids.
    ``first_read`` is set once the first page has been answered."""
    pages: list[list[str]] = []
    target: str | None = first
    while target is not None:
        resp = await client.get(target)
        pages.append(ids(resp))
        target = next_link(resp)
        if first_read is not None:
            first_read.set()
    return pages


async def create_many(client: httpx.AsyncClient, n: int) -> list[str]:
    created = []
    for _ in range(n):
        resp = await client.post("/v1/sessions")
        assert resp.status_code == 201, resp.text
        created.append(resp.json()["id"])
    return created


async def test_pages_stitch_to_the_whole_list_while_sessions_are_created(
    start_server: ServerFactory, backend_url: str
) -> None:
    server = await start_server(store=backend_url)
    client = server.client
    created = await create_many(client, 30)
    for sid in created[::3]:
        assert (await client.delete(f"/v1/sessions/{sid}")).status_code == 204
    await server.turn(created[4], "touch")  # activity moves a session up
    whole = ids(await client.get("/v1/sessions"))
    assert sorted(whole) == sorted(created) and whole[0] == created[4]
    ended = ids(await client.get("/v1/sessions?status=ended"))
    assert sorted(ended) == sorted(created[::3])

    newer: list[str] = []
    stop, first_read = trio.Event(), trio.Event()

    async def keep_creating() -> None:
        # From the second page on: a session created before the first page was read
        # is on it (a create and the first read race on two connections).
        await first_read.wait()
        while not stop.is_set():
            newer.extend(await create_many(client, 1))
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(keep_creating)
        pages = await all_pages(client, "/v1/sessions?limit=4", first_read)
        filtered = await all_pages(client, "/v1/sessions?status=ended&limit=3")
        stop.set()
    assert newer  # sessions were created while the pages were read
    # the pages hold exactly the sessions there were at the start, in order, once each
    assert [sid for page in pages for sid in page] == whole
    assert [len(page) for page in pages] == [4] * 7 + [2]
    assert [sid for page in filtered for sid in page] == ended
    assert [len(page) for page in filtered] == [3] * 3 + [1]
    # the new ones are ahead of them
    latest = ids(await client.get("/v1/sessions"))
    assert latest == list(reversed(newer)) + whole


async def test_a_full_last_page_has_no_next_link(start_server: ServerFactory) -> None:
    server = await start_server()
    created = await create_many(server.client, 6)
    pages = await all_pages(server.client, "/v1/sessions?limit=3")
    assert pages == [created[:2:-1], created[2::-1]]  # two full pages, no third empty one
    resp = await server.client.get("/v1/sessions")  # no limit: everything, as v0.8
    assert ids(resp) == created[::-1] and next_link(resp) is None
    resp = await server.client.get("/v1/sessions?limit=6")
    assert ids(resp) == created[::-1] and next_link(resp) is None


async def test_the_link_keeps_the_other_parameters(start_server: ServerFactory) -> None:
    server = await start_server()
    created = await create_many(server.client, 5)
    resp = await server.client.get("/v1/sessions", params={"status": "active", "limit": "2"})
    assert ids(resp) == [created[4], created[3]]
    token = resp.headers[NEXT_PAGE_HEADER]
    assert resp.headers["Link"] == (
        f'</v1/sessions?status=active&limit=2&before={token}>; rel="next"'
    )
    # the token is the position of the page's last session, in the list's order
    session = (await server.client.get(f"/v1/sessions/{created[3]}")).json()
    key = decode_token(token)
    assert key is not None and key.id == created[3]
    assert (
        key.last_active_at.isoformat(timespec="milliseconds")[:23] == (session["lastActiveAt"][:23])
    )
    # a new "before" replaces the old one in the next link
    resp = await server.client.get(f"/v1/sessions?before={token}&limit=2&before={token}")
    assert ids(resp) == [created[2], created[1]]


async def test_before_takes_a_session_id(start_server: ServerFactory) -> None:
    server = await start_server()
    created = await create_many(server.client, 5)
    resp = await server.client.get(f"/v1/sessions?before={created[3]}")
    assert ids(resp) == created[2::-1] and next_link(resp) is None
    resp = await server.client.get(f"/v1/sessions?before={created[3]}&limit=2")
    assert ids(resp) == [created[2], created[1]]
    assert decode_token(resp.headers[NEXT_PAGE_HEADER]) is not None
    assert ids(await server.client.get(f"/v1/sessions?before={created[0]}")) == []


async def test_a_token_outlives_its_session(start_server: ServerFactory) -> None:
    server = await start_server(session_retention=1e-6, session_ttl=0, event_retention=0)
    created = await create_many(server.client, 5)
    first = await server.client.get("/v1/sessions?limit=2")
    assert ids(first) == [created[4], created[3]]
    await server.client.delete(f"/v1/sessions/{created[3]}")
    await trio.sleep(0.01)  # so that it ended before the cutoff
    assert (await server.manager.sweep()).sessions_purged == 1
    assert (await server.client.get(f"/v1/sessions/{created[3]}")).status_code == 404
    token = first.headers[NEXT_PAGE_HEADER]
    assert ids(await server.client.get(f"/v1/sessions?before={token}")) == created[2::-1]
    # its id no longer stands for a position
    resp = await server.client.get(f"/v1/sessions?before={created[3]}")
    assert_400(resp, "before", created[3])


def assert_400(resp: httpx.Response, *needles: str) -> None:
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == 400 and error["reason"] == "invalid_request", error
    for needle in needles:
        assert needle in error["message"], error


@pytest.mark.parametrize(
    "value",
    ["0", "-1", "+5", "1.5", "abc", " 5", "5 ", "10001", "99999999999999999999", "9" * 5000,
     "\uff11\uff10", "\u00b2", "0x10", "1e3"],
)  # fmt: skip
async def test_bad_limits_are_a_400_naming_limit(start_server: ServerFactory, value: str) -> None:
    server = await start_server()
    resp = await server.client.get("/v1/sessions", params={"limit": value})
    assert_400(resp, "limit must be a positive integer (at most 10000)")
    assert len(resp.content) < 300  # a huge value is not echoed back whole


async def test_limits_in_range(start_server: ServerFactory) -> None:
    server = await start_server()
    created = await create_many(server.client, 3)
    for value, expected in (("1", 1), ("0002", 2), ("10000", 3), ("", 3)):
        resp = await server.client.get("/v1/sessions", params={"limit": value})
        assert len(ids(resp)) == expected, value
    assert ids(await server.client.get("/v1/sessions?limit=1")) == [created[2]]


def forged(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode()


@pytest.mark.parametrize(
    "value",
    [
        "",
        "nope",
        "s_unknown0000",
        "x" * 513,
        forged("12:"),  # no id
        forged("x12:s_1"),  # no time
        forged("99999999999999999999:s_1"),  # beyond year 9999
        forged("12:s_1") + "=",  # padded: not a token we made
        "%00",  # the three characters (the query says %2500)
    ],
)
async def test_bad_cursors_are_a_400_naming_before(
    start_server: ServerFactory, backend_url: str, value: str
) -> None:
    server = await start_server(store=backend_url)
    await create_many(server.client, 2)
    # Encoded here: httpx before 0.28 sent a "%" in params as it was (%00, a NUL).
    resp = await server.client.get(f"/v1/sessions?{urlencode({'before': value, 'limit': 1})}")
    assert_400(resp, "before")
    assert len(resp.content) < 400


# A NUL in the id: no session has one, on any backend (PostgreSQL's text cannot hold one).
async def test_a_nul_cursor_is_a_400_naming_before(
    start_server: ServerFactory, backend_url: str
) -> None:
    server = await start_server(store=backend_url)
    await create_many(server.client, 2)
    resp = await server.client.get("/v1/sessions", params={"before": "\x00", "limit": "1"})
    assert resp.request.url.query == b"before=%00&limit=1"
    assert_400(resp, "before")


async def test_bad_cursors_at_the_socket(start_server: ServerFactory) -> None:
    """The raw bytes of a request with a broken cursor: one clean JSON 400, connection reusable."""
    server = await start_server()
    port = int(server.url.rsplit(":", 1)[1])
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        for target in (
            "/v1/sessions?before=%ff%fe",
            "/v1/sessions?before=%ed%a0%80",  # a lone surrogate, as UTF-8 would have it
            "/v1/sessions?before=s_%00",
            "/v1/sessions?limit=%ef%bc%91",
        ):
            request = f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
            await stream.send_all(request)
            head, body = await read_response(stream)
            assert head.startswith(b"HTTP/1.1 400 "), head
            assert b'"code":400' in body and b'"invalid_request"' in body
            assert b"connection: close" not in head.lower()


async def read_response(stream: trio.SocketStream) -> tuple[bytes, bytes]:
    data = b""
    with trio.fail_after(10):
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: (\d+)", head)[1])  # type: ignore[index]
        while len(body) < length:
            body += await stream.receive_some(65536)
    return head, body


def test_tokens_round_trip() -> None:
    key = SessionKey(utcnow(), "s_mxyz01234567")
    token = encode_token(key)
    assert re.fullmatch(r"[A-Za-z0-9_-]+", token)
    assert decode_token(token) == key
    assert decode_token("s_mxyz01234567") is None  # an id is not a token


# -- retention -----------------------------------------------------------------------------


async def test_retention_purges_ended_sessions_with_their_turns_and_logs(
    start_server: ServerFactory, backend_url: str
) -> None:
    server = await start_server(store=backend_url, session_retention=1e-6, event_retention=0)
    client = server.client
    ended, kept, idle = await create_many(client, 3)
    await server.turn(ended, "hello")
    assert len((await client.get(f"/v1/sessions/{ended}/turns")).json()) == 1
    await server.turn(kept, "hello")
    await client.delete(f"/v1/sessions/{ended}")
    await trio.sleep(0.01)  # so that it ended before the cutoff
    swept = await server.manager.sweep()
    assert swept.sessions_purged == 1 and swept.expired == []
    for path in ("", "/turns", "/events", "/events?format=json"):
        resp = await client.get(f"/v1/sessions/{ended}{path}")
        assert resp.status_code == 404, (path, resp.text)
    assert (await client.delete(f"/v1/sessions/{ended}")).status_code == 404
    assert sorted(ids(await client.get("/v1/sessions"))) == sorted([kept, idle])
    assert ids(await client.get("/v1/sessions?status=ended")) == []
    # active sessions stay, with their logs
    log = (await client.get(f"/v1/sessions/{kept}/events?format=json")).json()
    assert [e["type"] for e in log][-1] == "session.ended"
    assert (await server.manager.sweep()).sessions_purged == 0


async def test_retention_zero_keeps_ended_sessions(start_server: ServerFactory) -> None:
    server = await start_server(session_retention=0, session_ttl=0, event_retention=0)
    (sid,) = await create_many(server.client, 1)
    await server.client.delete(f"/v1/sessions/{sid}")
    await trio.sleep(0.01)
    assert (await server.manager.sweep()).sessions_purged == 0
    assert (await server.client.get(f"/v1/sessions/{sid}")).json()["status"] == "ended"


async def test_the_sweep_runs_for_the_retention_alone(start_server: ServerFactory) -> None:
    """No TTL, no event retention: the sweep still wakes up (every second) to purge."""
    server = await start_server(session_ttl=0, event_retention=0, session_retention=0.5)
    (sid,) = await create_many(server.client, 1)
    await server.client.delete(f"/v1/sessions/{sid}")
    with trio.fail_after(10):  # a hang guard: the sweep runs every second
        while (await server.client.get(f"/v1/sessions/{sid}")).status_code != 404:
            await trio.sleep(0.1)


async def test_a_session_in_a_detached_turn_is_not_purged(start_server: ServerFactory) -> None:
    server = await start_server(session_retention=1e-6, session_ttl=0)
    (sid,) = await create_many(server.client, 1)
    body: dict[str, Any] = {"input": script({"sleep": 30}), "detach": True}
    resp = await server.client.post(f"/v1/sessions/{sid}/turns", json=body)
    assert resp.status_code == 202, resp.text
    await trio.sleep(0.01)
    assert (await server.manager.sweep()).sessions_purged == 0
    assert (await server.client.get(f"/v1/sessions/{sid}")).json()["status"] == "active"
    await server.client.delete(f"/v1/sessions/{sid}/turns/current")
