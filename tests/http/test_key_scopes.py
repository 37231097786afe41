"""Key scopes, key reloads and keys never printed.

The server-wide ``GET /metrics`` needs a key of the ``admin`` scope; a
SIGHUP (``Stop.reload`` in-process) puts the key file's contents in force:
a removed key's new requests get 401 and its open streams are closed with
the reason, the others' streams run on; no message about the file ever
shows a key pasted into it.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx
import pytest
import trio
from trio_websocket import ConnectionClosed, open_websocket_url

from tests.helpers import (
    GUARD,
    KEY_A,
    KEY_B,
    Raw,
    ServerFactory,
    auth,
    key_line,
    run_cli,
    script,
    start_cli_server,
    write_spec,
)
from trioserve.http._auth import KeyFileError, load_keys, parse_keys

ADMIN_KEY = "ts_key-of-the-operators"


def write_keys(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


# -- scopes --------------------------------------------------------------------------


async def test_metrics_need_the_admin_scope(start_server: ServerFactory, tmp_path: Path) -> None:
    path = write_keys(
        tmp_path / "keys",
        key_line(KEY_A, "alpha"),
        key_line(ADMIN_KEY, "ops", "admin"),
    )
    server = await start_server(keys=load_keys(path))
    refused = await server.client.get("/metrics", headers=auth(KEY_A))
    assert refused.status_code == 403
    error = refused.json()["error"]
    assert error["reason"] == "admin_required" and "admin scope" in error["message"]
    assert (await server.client.get("/metrics")).status_code == 401
    allowed = await server.client.get("/metrics", headers=auth(ADMIN_KEY))
    assert allowed.status_code == 200 and "trioserve_http_requests_total" in allowed.text
    # The admin scope is for /metrics: its tenant is a tenant like the others.
    assert (await server.client.get("/v1/sessions", headers=auth(ADMIN_KEY))).json() == []


def test_an_unknown_scope_is_refused_by_line() -> None:
    with pytest.raises(KeyFileError, match=r"k:1: unknown scope 'root' \(known: admin\)"):
        parse_keys(key_line(KEY_A, "alpha", "root"), "k")
    ring = parse_keys(key_line(KEY_A, "alpha", "admin"), "k")
    assert ring.entries[0].scopes == frozenset({"admin"})


@pytest.mark.parametrize(
    "pasted", ["ts_k7Hq2vXz9wPL0f3NrTbYcDmE5sUaG8hJ", "AKIAIOSFODNN7EXAMPLE0secret", "x" * 120]
)
def test_a_raw_key_in_the_key_file_is_never_printed(tmp_path: Path, pasted: str) -> None:
    path = write_keys(tmp_path / "keys", key_line(KEY_A, "alpha"), f"{pasted} beta")
    for args in (
        ["run", str(write_spec(tmp_path)), "--port", "0", "--api-keys", str(path)],
        ["keys", "check", str(path)],
    ):
        result = run_cli(tmp_path, *args)
        assert result.returncode == 2, result.stderr
        assert len(result.stderr.splitlines()) == 1, result.stderr
        assert f"{path}:2: expected 'sha256:' and 64 hex digits" in result.stderr
        assert pasted not in result.stderr and pasted[:12] not in result.stderr


def test_keys_new_and_check(tmp_path: Path) -> None:
    made = run_cli(tmp_path, "keys", "new", "ops", "--admin")
    key, line = made.stdout.splitlines()
    assert line.endswith(" ops admin")
    path = write_keys(tmp_path / "keys", line, key_line(KEY_A, "alpha"))
    checked = run_cli(tmp_path, "keys", "check", str(path))
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.strip() == f"{path}: 2 keys of 2 tenants, 1 with the admin scope"
    assert key not in checked.stdout


# -- reloads -------------------------------------------------------------------------


async def _follow(url: str, session: str, key: str) -> Raw:
    raw = await Raw.open(url)
    reply = await raw.open_stream(
        "GET", f"/v1/sessions/{session}/events?follow=true", [("Authorization", f"Bearer {key}")]
    )
    assert reply.status == 200, reply
    return raw


async def _until(raw: Raw, needle: bytes) -> bytes:
    data = b""
    with trio.fail_after(GUARD):
        while needle not in data:
            chunk = await raw.stream.receive_some(65536)
            assert chunk, data
            data += chunk
    return data


async def test_a_reload_revokes_a_removed_key_and_closes_its_streams(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    path = write_keys(tmp_path / "keys", key_line(KEY_A, "alpha"), key_line(KEY_B, "beta"))
    server = await start_server(keys=load_keys(path))
    sessions = {}
    for key in (KEY_A, KEY_B):
        resp = await server.client.post("/v1/sessions", headers=auth(key))
        sessions[key] = resp.json()["id"]
    a_stream = await _follow(server.url, sessions[KEY_A], KEY_A)
    b_stream = await _follow(server.url, sessions[KEY_B], KEY_B)
    ws_url = server.url.replace("http://", "ws://") + f"/v1/sessions/{sessions[KEY_A]}/ws"
    headers = [(b"Authorization", f"Bearer {KEY_A}".encode())]
    async with open_websocket_url(ws_url, extra_headers=headers, disconnect_timeout=5) as ws:
        await ws.send_message('{"type":"ping"}')
        assert json.loads(await ws.get_message())["type"] == "trioserve.pong"

        write_keys(path, key_line(KEY_B, "beta"))  # A's key removed
        assert server.stop.reload is not None
        server.stop.reload()

        # A's streams are closed, saying why; its new requests are refused.
        assert b": closed: the API key was revoked\n\n" in await _until(a_stream, b"closed")
        with trio.fail_after(GUARD), pytest.raises(ConnectionClosed) as closed:
            while True:
                await ws.get_message()
        reason = closed.value.reason
        assert reason is not None
        assert (reason.code, reason.reason) == (4401, "the API key was revoked")
    refused = await server.client.get("/v1/sessions", headers=auth(KEY_A))
    assert refused.status_code == 401

    # B's stream runs on: a turn of B is followed on it.
    turn = await server.client.post(
        f"/v1/sessions/{sessions[KEY_B]}/turns",
        json={"input": script({"end": "completed"}), "detach": True},
        headers=auth(KEY_B),
    )
    assert turn.status_code == 202
    await _until(b_stream, b"event: session.ended")


async def test_a_bad_key_file_on_reload_keeps_the_keys_in_force(
    start_server: ServerFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_keys(tmp_path / "keys", key_line(KEY_A, "alpha"))
    server = await start_server(keys=load_keys(path))
    pasted = "ts_this-is-a-raw-key-pasted-by-mistake"
    write_keys(path, key_line(KEY_A, "alpha"), f"{pasted} beta")
    assert server.stop.reload is not None
    server.stop.reload()
    assert (await server.client.get("/v1/sessions", headers=auth(KEY_A))).status_code == 200
    errors = [r.getMessage() for r in caplog.records if r.name == "trioserve.http"]
    assert any("API keys not reloaded, those in force stay" in m for m in errors), errors
    assert not any(pasted in m for m in errors)


async def test_sighup_reloads_the_keys_of_a_real_server(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    path = write_keys(tmp_path / "keys", key_line(KEY_A, "alpha"))
    spec = write_spec(tmp_path)
    server = await start_cli_server(nursery, tmp_path, spec, "--api-keys", str(path))
    async with httpx.AsyncClient(base_url=server.url, timeout=GUARD) as client:
        assert (await client.get("/v1/sessions", headers=auth(KEY_B))).status_code == 401
        write_keys(path, key_line(KEY_B, "beta"))
        server.signal(signal.SIGHUP)
        with trio.fail_after(GUARD):
            while "API keys reloaded" not in server.log:
                await trio.sleep(0.05)
        assert (await client.get("/v1/sessions", headers=auth(KEY_B))).status_code == 200
        assert (await client.get("/v1/sessions", headers=auth(KEY_A))).status_code == 401
    assert server.proc.returncode is None  # SIGHUP did not stop it (its default would)
    server.signal()
    assert await server.wait() == 0
