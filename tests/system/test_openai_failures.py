"""``runtime.type: openai`` through a real ``trioserve run``: failures and cancels.

Each failure is an ``error`` event with a machine reason and a message that
says what to do, then ``session.ended`` ``error``: never a traceback.  A
cancel mid-stream or mid-tool ends the turn ``cancelled`` and leaves no
adapter and no MCP server running.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.helpers import CLIServer, Frame, read_frames, start_cli_server, wait_gone
from tests.helpers.fake_openai import Script, chunk, fake_model, refusal, text_script, tool_script
from tests.helpers.openai_runtime import (
    mcp_pids,
    new_session,
    of_type,
    serve,
    turn,
    write_openai_spec,
)


def closed_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


FAILURES: list[tuple[str, Script, str, str]] = [
    ("401", refusal(401, "Incorrect API key provided"), "model_auth_failed", "OPENAI_API_KEY"),
    (
        "429",
        refusal(429, "Rate limit reached", [("retry-after", "7")]),
        "model_rate_limited",
        "retry after 7 s",
    ),
    (
        "context",
        refusal(
            400,
            "This model's maximum context length is 8192 tokens",
            code="context_length_exceeded",
        ),
        "context_length_exceeded",
        "runtime.options.contextTokens",
    ),
    (
        "malformed",
        Script([chunk({"content": "Hi"}), b"data: {not json\n\n"]),
        "model_stream_malformed",
        "a chunk is not JSON",
    ),
    (
        "unfinished",
        Script([chunk({"content": "Hi"})], end="eof"),
        "model_stream_malformed",
        "the stream ended before the reply did",
    ),
    (
        "dropped",
        Script([chunk({"content": "Hi"})], end="close"),
        "model_connection_lost",
        "broke before the reply ended",
    ),
    ("404", refusal(404, "model 'fake-model' not found"), "model_not_found", "spec.model.name"),
    ("500", refusal(500, "boom"), "model_server_error", "(500: boom)"),
]


async def test_each_model_failure_is_an_error_event_then_an_error_end(
    nursery: trio.Nursery, tmp_path: Path, launched: list[CLIServer]
) -> None:
    """One server and one session for every case: each turn gets the next refusal."""
    spec = write_openai_spec(tmp_path, mcp=False)
    async with fake_model() as model:
        model.queue(*(script for _, script, _, _ in FAILURES))
        server = await serve(nursery, tmp_path, spec, model, launched)
        session = await new_session(server.url)
        for case, _, reason, hint in FAILURES:
            error = _one_error(await turn(server.url, session, case))
            assert (case, error["reason"]) == (case, reason)
            assert hint in error["message"], (case, error["message"])
            if case == "429":
                assert error["retryAfter"] == 7


async def test_an_unreachable_model_server_is_an_error_event_then_an_error_end(
    nursery: trio.Nursery, tmp_path: Path, launched: list[CLIServer]
) -> None:
    spec = write_openai_spec(tmp_path, mcp=False)
    url = f"http://127.0.0.1:{closed_port()}/v1"
    server = await start_cli_server(
        nursery, tmp_path, spec, "--in-memory", env={"OPENAI_BASE_URL": url}
    )
    launched.append(server)
    error = _one_error(await turn(server.url, await new_session(server.url), "hi"))
    assert error["reason"] == "model_unreachable"
    assert "is it running?" in error["message"] and "OPENAI_BASE_URL" in error["message"]


def _one_error(frames: list[Frame]) -> dict[str, Any]:
    """The turn's one ``error`` event, checked to end the turn with its message."""
    errors = of_type(frames, "error")
    assert len(errors) == 1, frames
    end = of_type(frames, "session.ended")[0]
    assert end == {"reason": "error", "message": errors[0]["message"]}
    assert "Traceback" not in str([f.data for f in frames])
    return errors[0]


async def test_an_mcp_server_that_cannot_start_is_an_error_naming_it(
    nursery: trio.Nursery, tmp_path: Path, launched: list[CLIServer]
) -> None:
    spec = write_openai_spec(tmp_path, command=str(tmp_path / "no-such-mcp-server"))
    async with fake_model() as model:
        server = await serve(nursery, tmp_path, spec, model, launched)
        frames = await turn(server.url, await new_session(server.url), "hi")
        assert model.requests == []
    error = of_type(frames, "error")[0]
    assert error["reason"] == "mcp_server_failed"
    assert "MCP server 'tools'" in error["message"] and "No such file" in error["message"]
    assert of_type(frames, "session.ended")[0]["reason"] == "error"


@pytest.mark.parametrize("where", ["mid-stream", "mid-tool"])
async def test_a_cancel_ends_the_turn_and_leaves_no_process(
    nursery: trio.Nursery, tmp_path: Path, launched: list[CLIServer], where: str
) -> None:
    spec = write_openai_spec(tmp_path, options={"toolTimeoutMs": 600_000})
    async with fake_model() as model:
        if where == "mid-stream":
            model.queue(Script(text_script("Once", " upon", " a time").frames[:3], end="hang"))
            waits_for = "message"
        else:
            model.queue(tool_script(("c1", "hang", {})))
            waits_for = "tool.call"
        server = await serve(nursery, tmp_path, spec, model, launched)
        session = await new_session(server.url)
        frames = await _cancelled_turn(server.url, session, waits_for)
        assert [f.event for f in frames][-1] == "session.ended"
        assert of_type(frames, "session.ended")[0]["reason"] == "cancelled"
        assert not of_type(frames, "error"), frames
        adapter = of_type(frames, "session.started")[0]["pid"]
        await wait_gone(adapter, within=10)
        pids = mcp_pids(tmp_path)
        assert len(pids) == 1
        await wait_gone(pids[0], within=10)
        # The session goes on: the next turn is served.
        assert of_type(await turn(server.url, session, "again"), "session.ended")[0] == {
            "reason": "completed",
            "rounds": 1,
            "usage": {"tokensIn": 11, "tokensOut": 7},
        }


async def _cancelled_turn(url: str, session: str, waits_for: str) -> list[Frame]:
    """Start a turn, cancel it once an event of ``waits_for`` arrived; every frame it sent."""
    frames: list[Frame] = []
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        path = f"/v1/sessions/{session}/turns"
        async with client.stream("POST", path, json={"input": "go"}) as resp:
            assert resp.status_code == 200
            async for frame in read_frames(resp):
                frames.append(frame)
                if (
                    frame.event == waits_for
                    and len([f for f in frames if f.event == waits_for]) == 1
                ):
                    cancel = await client.delete(f"/v1/sessions/{session}/turns/current")
                    assert cancel.status_code in (202, 204), cancel.text
    return [f for f in frames if f.event != "comment"]
