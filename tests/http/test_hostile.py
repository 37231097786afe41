"""Hostile input at a real ``trioserve run``: a 4xx with the envelope, never a 5xx, never poison.

One server per store backend (memory, SQLite, PostgreSQL: the ``backend``
parameter, tests/helpers/backends.py) serves the whole module, the built-in
echo agent behind it.  Hypothesis drives random and malformed
bodies, queries, headers and WebSocket messages at it (a bounded, fixed
set of examples: ``derandomize``, no example database), and each test
ends by checking that the server is still healthy: ``/healthz``, a new
session and a real echo turn, and no traceback in its log.

Requests go through httpx and, where the bytes matter (header values,
request targets), through a plain socket with h11 reading the answer.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import h11
import httpx
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trio_websocket import open_websocket_url

from tests.helpers import STARTUP_URL, Frame, cli_env, parse_sse, write_spec
from tests.helpers.backends import fresh_store_url_sync
from trioserve.http._untrusted import MAX_DEPTH
from trioserve.protocol import MAX_SEQ

EXAMPLES = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclass
class LiveServer:
    """``trioserve run`` in a subprocess, and an httpx client pointed at it."""

    store: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    url: str
    client: httpx.Client

    @property
    def address(self) -> tuple[str, int]:
        parts = urlsplit(self.url)
        assert parts.hostname is not None and parts.port is not None
        return parts.hostname, parts.port

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def create(self) -> str:
        resp = self.client.post("/v1/sessions", json={})
        assert resp.status_code == 201, resp.text
        return str(resp.json()["id"])

    def turn(self, session_id: str, text: str) -> list[Frame]:
        resp = self.client.post(f"/v1/sessions/{session_id}/turns", json={"input": text})
        assert resp.status_code == 200, resp.text
        return parse_sse(resp.text)

    def assert_healthy(self) -> None:
        resp = self.client.get("/healthz")
        assert (resp.status_code, resp.text) == (200, "ok\n")
        session_id = self.create()
        frames = self.turn(session_id, "still there?")
        assert reply(frames) == f'Turn 1 of session {session_id}: you said "still there?".'
        assert "Traceback" not in self.log, self.log


def reply(frames: list[Frame]) -> str:
    """The echo agent's reply in a turn's frames (which must end ``completed``)."""
    assert frames[-1].event == "session.ended", frames
    assert frames[-1].data["data"]["reason"] == "completed", frames
    text = "".join(f.data["data"]["text"] for f in frames if f.event == "message")
    return text.split(" This is the first turn.")[0].split(" Before that")[0]


@pytest.fixture(scope="module")
def store(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The module's store: one per backend (a PostgreSQL schema is dropped at the end)."""
    with fresh_store_url_sync(backend, tmp_path_factory.mktemp(f"store-{backend}")) as url:
        yield url


@pytest.fixture(scope="module")
def server(
    backend: str, store: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp(f"hostile-{backend}")
    spec = write_spec(tmp, runtime="echo", name="hostile")
    log_path = tmp / "server.log"
    with log_path.open("wb") as log:
        command = [sys.executable, "-m", "trioserve", "run", str(spec), "--port", "0"]
        proc = subprocess.Popen(
            [*command, "--store", store, "--shutdown-grace", "5s"],
            stdin=subprocess.DEVNULL,
            stderr=log,
            env=cli_env(tmp),
            cwd=tmp,
        )
    try:
        deadline = time.monotonic() + 30
        while not (match := STARTUP_URL.search(log_path.read_text(errors="replace"))):
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        with httpx.Client(base_url=match.group(1), timeout=60) as client:
            yield LiveServer(backend, proc, log_path, match.group(1), client)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log_path.read_text()
    assert "Traceback" not in log_path.read_text()


@pytest.fixture(scope="module")
def session_id(server: LiveServer) -> str:
    """A session with one finished turn in its log (seqs 1..N)."""
    session_id = server.create()
    server.turn(session_id, "first")
    return session_id


def assert_refusal(status: int, body: bytes, expected: int | None = None) -> dict[str, Any]:
    """No 5xx; a 4xx carries the envelope with ``code`` = the status.  Returns ``error``."""
    assert status < 500, (status, body[:500])
    if expected is not None:
        assert status == expected, (status, body[:500])
    if status < 400:
        return {}
    envelope = json.loads(body)
    assert list(envelope) == ["error"], envelope
    error = envelope["error"]
    assert error["code"] == status, envelope
    assert isinstance(error["reason"], str) and error["reason"], envelope
    assert isinstance(error["message"], str) and error["message"], envelope
    return dict(error)


def check(resp: httpx.Response, expected: int | None = None) -> dict[str, Any]:
    """``assert_refusal`` for an httpx response (a streamed one read if it is a 4xx)."""
    return assert_refusal(
        resp.status_code, resp.read() if resp.status_code >= 400 else b"", expected
    )


# --- a socket, for bytes httpx would not send as they are ----------------------------


def raw_request(
    server: LiveServer,
    method: bytes,
    target: bytes,
    headers: list[tuple[bytes, bytes]] = [],  # noqa: B006 (never mutated)
    body: bytes = b"",
) -> tuple[int, bytes]:
    """Send one request over a fresh socket; the status, and the body of a refusal.

    A 2xx or 3xx answer is not read past its head (it may be an endless stream).
    """
    conn = h11.Connection(h11.CLIENT)
    head = [(b"host", b"127.0.0.1"), (b"connection", b"close"), *headers]
    if method == b"POST":
        head.append((b"content-length", str(len(body)).encode()))
    out = conn.send(h11.Request(method=method, target=target, headers=head))
    if body:
        out += conn.send(h11.Data(data=body))
    out += conn.send(h11.EndOfMessage())
    with socket.create_connection(server.address, timeout=60) as sock:
        sock.sendall(out)
        status, content = 0, b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(sock.recv(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
                if status < 400:
                    return status, b""
            elif isinstance(event, h11.Data):
                content += event.data
            else:
                assert isinstance(event, h11.EndOfMessage | h11.ConnectionClosed), event
                return status, content


# --- WebSocket: one connection per exchange ---------------------------------------------


def ws_exchange(server: LiveServer, session_id: str, message: str | bytes) -> list[dict[str, Any]]:
    """Send ``message`` then a ping; every message up to the pong, decoded.

    Each must be JSON; a ``trioserve.error`` must carry a 4xx envelope.  The
    server closing the connection fails the test.
    """

    async def exchange() -> list[dict[str, Any]]:
        url = server.url.replace("http://", "ws://") + f"/v1/sessions/{session_id}/ws"
        replies: list[Any] = []
        with trio.fail_after(60):
            async with open_websocket_url(url) as ws:
                await ws.send_message(message)
                await ws.send_message('{"type":"ping"}')
                while True:
                    reply = json.loads(await ws.get_message())
                    if reply.get("type") == "trioserve.pong":
                        return replies
                    if reply.get("type") == "trioserve.error":
                        assert list(reply) == ["type", "error"], reply
                        error = reply["error"]
                        assert 400 <= error["code"] < 500, reply
                        assert isinstance(error["reason"], str), reply
                        assert isinstance(error["message"], str), reply
                    replies.append(reply)

    return trio.run(exchange)


def ws_error(server: LiveServer, session_id: str, message: str | bytes) -> dict[str, Any]:
    """The one ``trioserve.error`` a refused message gets."""
    replies = ws_exchange(server, session_id, message)
    assert [r["type"] for r in replies] == ["trioserve.error"], replies
    return dict(replies[0]["error"])


async def ws_turn(server: LiveServer, session_id: str, message: str) -> dict[str, Any]:
    """Send a turn over the WebSocket; its ``session.ended``."""
    url = server.url.replace("http://", "ws://") + f"/v1/sessions/{session_id}/ws"
    with trio.fail_after(60):
        async with open_websocket_url(url) as ws:
            await ws.send_message(message)
            while True:
                event = json.loads(await ws.get_message())
                assert event.get("type") != "trioserve.error", event
                if event.get("type") == "session.ended":
                    return dict(event)


# --- the findings, one by one -------------------------------------------------------------

SURROGATE_TURN = b'{"input":"hi \\ud800"}'


def test_a_lone_surrogate_in_inputs_is_refused_and_stores_nothing(server: LiveServer) -> None:
    before = len(server.client.get("/v1/sessions").json())
    for body, field in [
        (b'{"inputs":{"name":"\\ud800"}}', "inputs.name"),
        (b'{"inputs":{"\\udfff":"x"}}', "inputs"),
    ]:
        error = check(server.client.post("/v1/sessions", content=body), 400)
        assert error["reason"] == "invalid_request"
        assert error["message"].startswith(f"invalid request body: {field}: ")
        assert "not valid Unicode (a lone surrogate" in error["message"]
    assert len(server.client.get("/v1/sessions").json()) == before


def test_a_refused_surrogate_turn_leaves_the_session_working(server: LiveServer) -> None:
    """The poison case: the refused input reaches neither the store nor the adapter."""
    session_id = server.create()
    path = f"/v1/sessions/{session_id}/turns"
    error = check(server.client.post(path, content=SURROGATE_TURN), 400)
    assert error["message"] == (
        "invalid request body: input: not valid Unicode (a lone surrogate in 'hi \\ud800')"
    )
    ws = ws_error(server, session_id, '{"type":"turn","input":"\\udc00"}')
    assert (ws["code"], ws["reason"]) == (400, "invalid_request")
    assert ws["message"].startswith("invalid message: input: not valid Unicode")
    assert server.client.get(path).json() == []  # no turn record
    # The adapter never saw it either: this is the session's first turn.
    assert reply(server.turn(session_id, "hello")) == (
        f'Turn 1 of session {session_id}: you said "hello".'
    )
    check(server.client.post(path, content=SURROGATE_TURN), 400)
    assert reply(server.turn(session_id, "again")).startswith(f"Turn 2 of session {session_id}")
    log = server.client.get(f"/v1/sessions/{session_id}/events", params={"format": "json"})
    assert "\\ud800" not in log.text and "\\udc00" not in log.text


def test_nul_in_a_turn_is_kept_and_nul_in_an_id_finds_nothing(server: LiveServer) -> None:
    """A NUL in what a client writes round-trips on every backend (PostgreSQL's text cannot
    hold one: it was a 500 there); a NUL in an id it names is a 404 or a 400, never a 5xx."""
    session_id = server.create()
    text = "nul \x00 here\x00"
    frames = server.turn(session_id, text)
    assert reply(frames) == f'Turn 1 of session {session_id}: you said "{text}".'
    turns = server.client.get(f"/v1/sessions/{session_id}/turns").json()
    assert [(t["input"], t["status"]) for t in turns] == [(text, "completed")]
    resp = server.client.post("/v1/sessions", json={"inputs": {"topic": "a\x00b"}})
    assert resp.status_code == 201, resp.text
    turn_path = f"/v1/sessions/{session_id}/turns"
    for method, path, status in [
        ("GET", "/v1/sessions/s_%00", 404),
        ("DELETE", "/v1/sessions/%00", 404),
        ("POST", "/v1/sessions/s%00/turns", 404),
        ("GET", f"{turn_path}/t_%00", 404),
        ("GET", f"/v1/sessions/{session_id}/events?turn=%00", 404),
        ("DELETE", f"/v1/sessions/{session_id}%00/turns/current", 404),
        ("GET", "/v1/sessions?before=s_%00", 400),
    ]:
        body = {"input": "x"} if method == "POST" else None
        check(server.client.request(method, path, json=body), status)
    ended = trio.run(ws_turn, server, session_id, '{"type":"turn","input":"ws \\u0000"}')
    assert ended["data"]["reason"] == "completed", ended
    turns = server.client.get(turn_path).json()
    assert [t["input"] for t in turns] == [text, "ws \x00"]


@pytest.mark.parametrize(
    "body",
    [b"[" * 100_000, b'{"input":' * 100_000, b"[" * ((1 << 20) - 10) + b"]" * 10],
    ids=["100k-arrays", "100k-objects", "1MiB"],
)
def test_deep_nesting_is_a_400(server: LiveServer, session_id: str, body: bytes) -> None:
    for path in ("/v1/sessions", f"/v1/sessions/{session_id}/turns"):
        error = check(server.client.post(path, content=body), 400)
        assert error["message"] == (
            "invalid request body: nested too deep"
            f" (more than {MAX_DEPTH} levels of arrays and objects)"
        )


def test_deep_nesting_in_a_websocket_message_is_refused(
    server: LiveServer, session_id: str
) -> None:
    error = ws_error(server, session_id, '{"type":"turn","x":' + "[" * 100_000)
    assert error["message"].startswith("invalid message: nested too deep")


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ({"after": "\u00b2"}, "after"),
        ({"after": "\u0661"}, "after"),
        ({"after": "1" * 4400}, "after"),
        ({"after": str(MAX_SEQ + 1)}, "after"),
        ({"after": "-1"}, "after"),
        ({"after": "+1"}, "after"),
        ({"after": "1e3"}, "after"),
    ],
)
@pytest.mark.parametrize("form", ["sse", "json"])
def test_cursors_are_ascii_digits_in_range(
    server: LiveServer, session_id: str, query: dict[str, str], name: str, form: str
) -> None:
    resp = server.client.get(f"/v1/sessions/{session_id}/events", params={**query, "format": form})
    error = check(resp, 400)
    assert error["message"].startswith(f"{name} must be a non-negative integer")


@pytest.mark.parametrize("value", ["\u00b2", "\u0661", "0", str(2**63), "10001", "1" * 5000])
def test_limit_is_ascii_digits_in_range(server: LiveServer, value: str) -> None:
    error = check(server.client.get("/v1/sessions", params={"limit": value}), 400)
    assert error["message"].startswith("limit must be a positive integer (at most 10000), got ")


def test_limit_at_its_maximum_is_fine(server: LiveServer) -> None:
    resp = server.client.get("/v1/sessions", params={"limit": "10000"})
    assert resp.status_code == 200 and isinstance(resp.json(), list)


@pytest.mark.parametrize(
    "value", [b"\xb2", "\u0661".encode(), b"1" * 4400, str(MAX_SEQ + 1).encode(), b"0x1"]
)
def test_last_event_id_is_ascii_digits_in_range(
    server: LiveServer, session_id: str, value: bytes
) -> None:
    target = f"/v1/sessions/{session_id}/events?format=json".encode()
    status, body = raw_request(server, b"GET", target, [(b"last-event-id", value)])
    error = assert_refusal(status, body, 400)
    assert error["message"].startswith("Last-Event-ID must be a non-negative integer")


def test_a_cursor_at_the_largest_seq_is_past_the_end_not_a_crash(
    server: LiveServer, session_id: str
) -> None:
    resp = server.client.get(
        f"/v1/sessions/{session_id}/events", params={"after": str(MAX_SEQ), "format": "json"}
    )
    assert "past the end" in check(resp, 400)["message"]


@pytest.mark.parametrize("after", [MAX_SEQ + 1, 10**30, -1, 1.5, "1", True])
def test_websocket_resume_after_is_an_integer_in_range(
    server: LiveServer, session_id: str, after: Any
) -> None:
    error = ws_error(server, session_id, json.dumps({"type": "resume", "after": after}))
    assert (error["code"], error["reason"]) == (400, "invalid_request")
    assert error["message"].startswith("invalid resume message: after: ")


# --- random input ---------------------------------------------------------------------------

lone_surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
texts = st.text(max_size=30) | st.text(st.characters() | lone_surrogates, max_size=10)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**63 - 2, max_value=2**70)
    | st.floats()
    | texts
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(texts, children, max_size=4),
    max_leaves=20,
)


def nested_text(depth: int) -> str:
    return '{"input":' + "[" * depth + '"x"' + "]" * depth + "}"


api_fields = st.fixed_dictionaries(
    {},
    optional={
        "input": json_values,
        "inputs": json_values | st.dictionaries(texts, texts, max_size=3),
        "onDisconnect": st.sampled_from(["cancel", "continue", "", "CANCEL"]) | json_values,
        "detach": st.booleans() | json_values,
        "type": st.sampled_from(["turn", "cancel", "ping", "resume"]) | texts,
        "after": st.integers() | json_values,
        "turn": texts | json_values,
    },
)
#: Objects with the API's field names and random values, unknown keys mixed in.
http_field_values = st.builds(
    lambda known, unknown: {**unknown, **known},
    api_fields,
    st.dictionaries(texts, json_values, max_size=2),
)
json_texts = st.one_of(
    json_values.map(json.dumps),
    http_field_values.map(json.dumps),
    st.integers(MAX_DEPTH - 2, 3 * MAX_DEPTH).map(nested_text),
    st.integers(1, 200_000).map(lambda n: "[" * n),
    st.integers(1, 6000).map(lambda n: '{"input":' + "9" * n + "}"),
    st.text(max_size=200),
)
bodies = json_texts.map(lambda text: text.encode(errors="surrogatepass")) | st.binary(max_size=300)


@pytest.mark.parametrize("path", ["/v1/sessions", "/v1/sessions/{session}/turns"])
def test_random_bodies(server: LiveServer, session_id: str, path: str) -> None:
    url = path.format(session=session_id)

    @EXAMPLES
    @given(body=bodies, content_type=st.sampled_from(["application/json", "text/plain", ""]))
    def post(body: bytes, content_type: str) -> None:
        headers = {"content-type": content_type} if content_type else {}
        with server.client.stream("POST", url, content=body, headers=headers) as resp:
            if resp.status_code == 200:  # a turn ran: its stream ends with it
                frames = parse_sse(resp.read().decode())
                assert frames[-1].event == "session.ended", frames
            else:
                check(resp)

    post()
    server.assert_healthy()


query_values = st.text(max_size=20) | st.sampled_from(
    ["0", "1", "true", "false", "json", "sse", "active", "\u00b2", "\u0661", "1" * 5000]
)
queries = st.fixed_dictionaries(
    {},
    optional={
        name: query_values
        for name in ("after", "limit", "status", "turn", "format", "follow", "other")
    },
)


@pytest.mark.parametrize("path", ["/v1/sessions", "/v1/sessions/{session}/events"])
def test_random_queries(server: LiveServer, session_id: str, path: str) -> None:
    url = path.format(session=session_id)

    @EXAMPLES
    @given(params=queries)
    def get(params: dict[str, str]) -> None:
        with server.client.stream("GET", url, params=params) as resp:
            check(resp)  # a 200 may be an endless stream (follow): not read

    get()
    server.assert_healthy()


# What h11 lets through: raw request targets and header values as bytes.
targets = st.lists(
    st.sampled_from(
        [
            *("%ED%A0%80", "%FF", "%00", "%C2%B2", "%", "%%", "&", "=", "?", "/", "//", ".."),
            *("%2F", "after=", "limit=", "turn=", "format=json", "follow=1", "status=", "1"),
        ]
    ),
    max_size=8,
).map("".join)
header_values = st.from_regex(rb"\A(?:[^\x00\s]+(?:[ \t]+[^\x00\s]+)*)?\Z") | st.sampled_from(
    [b"\xb2", "\u0661".encode(), b"1" * 4400, str(2**63).encode(), b"-1", b"0", b"3"]
)
header_names = st.from_regex(rb"\A[-!#$%&'*+.^_`|~0-9a-zA-Z]{1,20}\Z").filter(
    lambda name: (
        name.lower()
        not in {b"host", b"content-length", b"transfer-encoding", b"connection", b"upgrade"}
        | {b"expect", b"te", b"keep-alive", b"content-encoding"}
    )
)


def test_random_targets_and_last_event_ids_over_a_socket(
    server: LiveServer, session_id: str
) -> None:
    @EXAMPLES
    @given(suffix=targets, last_event_id=header_values)
    def get(suffix: str, last_event_id: bytes) -> None:
        target = f"/v1/sessions/{session_id}/events?format=json&{suffix}".encode()
        status, body = raw_request(server, b"GET", target, [(b"last-event-id", last_event_id)])
        assert_refusal(status, body)

    get()
    server.assert_healthy()


def test_random_headers_over_a_socket(server: LiveServer, session_id: str) -> None:
    @EXAMPLES
    @given(
        headers=st.lists(st.tuples(header_names, header_values), max_size=4),
        content_type=header_values,
        body=st.sampled_from([b"", b"{}", b'{"inputs":{}}', SURROGATE_TURN]),
    )
    def post(headers: list[tuple[bytes, bytes]], content_type: bytes, body: bytes) -> None:
        status, content = raw_request(
            server, b"POST", b"/v1/sessions", [(b"content-type", content_type), *headers], body
        )
        assert_refusal(status, content)

    post()
    server.assert_healthy()


ws_messages = (
    json_texts
    | http_field_values.map(lambda fields: json.dumps({**fields, "type": "resume"}))
    | http_field_values.map(lambda fields: json.dumps({**fields, "type": "ping"}))
    | st.binary(max_size=200)
)


def test_random_websocket_messages(server: LiveServer) -> None:
    session_id = server.create()

    @EXAMPLES
    @given(message=ws_messages)
    def exchange(message: str | bytes) -> None:
        ws_exchange(server, session_id, message)

    exchange()
    server.assert_healthy()
