"""examples/fastapi_sse.py: a FastAPI app (served by hypercorn on asyncio) proxies turns
of a real trioserve to a browser as SSE; a browser leaving cancels the turn."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import parse_sse, script
from tests.helpers.server import Server
from tests.helpers.threaded import TrioHost
from trioserve.client import SyncClient

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HANG = script({"event": "message", "data": {"role": "assistant", "text": "hm"}}, {"hang": True})


@pytest.fixture(scope="module")
def trioserve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with TrioHost(tmp_path_factory.mktemp("host")) as host:
        yield host.server()


@pytest.fixture(scope="module")
def app(trioserve: Server) -> Iterator[str]:
    """The example app, served by hypercorn on a socket bound here (its port is known)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    fd = listener.fileno()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hypercorn", "--bind", f"fd://{fd}", "fastapi_sse:app"],
        cwd=EXAMPLES,
        env={**os.environ, "TRIOSERVE_URL": trioserve.url},
        pass_fds=[fd],
        stderr=subprocess.PIPE,
    )
    listener.close()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:  # the socket takes connections at once; wait for the app's answers
            try:
                if httpx.get(url + "/", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "the app did not start"
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_turn_reaches_the_browser_as_sse(app: str) -> None:
    with httpx.Client(base_url=app, timeout=30) as browser:
        assert "EventSource" in browser.get("/").text
        sid = browser.post("/sessions").json()["id"]
        for text in ["hello", "again"]:
            reply = browser.get(f"/sessions/{sid}/turn", params={"input": text})
            assert reply.headers["content-type"].startswith("text/event-stream")
            frames = parse_sse(reply.text)
            assert [f.event for f in frames] == ["session.started", "message", "session.ended"]
            assert frames[1].data["data"]["text"] == f"echo: {text}"
        refused = parse_sse(browser.get("/sessions/s_nope/turn", params={"input": "x"}).text)
        assert [f.event for f in refused] == ["error"]
        assert refused[0].data["error"]["code"] == 404


def test_the_browser_leaving_cancels_the_turn(app: str, trioserve: Server) -> None:
    with httpx.Client(base_url=app, timeout=30) as browser:
        sid = browser.post("/sessions").json()["id"]
        with browser.stream("GET", f"/sessions/{sid}/turn", params={"input": HANG}) as reply:
            lines = reply.iter_lines()
            while next(lines) != "event: message":
                pass
    with SyncClient(trioserve.url) as client:
        record = client.list_turns(sid)[-1]
        while record.running:
            time.sleep(0.02)
            record = client.get_turn(sid, record.id)
    assert (record.status, record.reason) == ("cancelled", "client_disconnected")
