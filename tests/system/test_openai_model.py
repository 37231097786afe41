"""``runtime.type: openai`` through a real ``trioserve run``: replies, memory, tools, the pool.

The model is the fake OpenAI-compatible server of ``helpers.fake_openai``
(real HTTP and SSE on 127.0.0.1); the tools come from a real MCP server
over stdio (``helpers/mcp_tools.py``, written with the ``mcp`` SDK).
"""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import trio

from tests.helpers import CLIServer, start_cli_server, wait_gone
from tests.helpers.fake_openai import fake_model, text_script, tool_script
from tests.helpers.openai_runtime import (
    mcp_pids,
    new_session,
    of_type,
    reply_text,
    serve,
    turn,
    write_openai_spec,
)
from trioserve.http._app import WARM_HEADER

KEY = "sk-test-secret-4242"


async def test_a_streamed_reply_with_usage_and_timing(
    nursery: trio.Nursery, tmp_path: Path, launched: list[CLIServer]
) -> None:
    spec = write_openai_spec(tmp_path, mcp=False, options={"maxTokens": 64})
    async with fake_model() as model:
        env = {
            "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",  # overridden by trioserve's own
            "TRIOSERVE_OPENAI_BASE_URL": model.url,
            "OPENAI_API_KEY": KEY,
        }
        server = await start_cli_server(nursery, tmp_path, spec, "--in-memory", env=env)
        launched.append(server)
        model.queue(text_script("Hel", "lo, ", "Ada!", usage=(31, 5)))
        frames = await turn(server.url, await new_session(server.url), "Hi, I am Ada.")

    kinds = [f.event for f in frames]
    assert kinds == [
        "session.started",
        "model.request",
        "message",
        "message",
        "message",
        "message",
        "model.response",
        "session.ended",
    ], kinds
    messages = of_type(frames, "message")
    assert [m["text"] for m in messages if m.get("delta")] == ["Hel", "lo, ", "Ada!"]
    assert messages[-1] == {"role": "assistant", "text": "Hello, Ada!", "final": True, "round": 1}
    response = of_type(frames, "model.response")[0]
    assert (response["tokensIn"], response["tokensOut"], response["finishReason"]) == (
        31,
        5,
        "stop",
    )
    assert response["durationMs"] >= response["firstChunkMs"] >= 0
    assert of_type(frames, "session.ended")[0]["reason"] == "completed"
    assert of_type(frames, "session.started")[0]["model"]["name"] == "fake-model"

    # What the model server got: the spec's model, temperature, persona and the input.
    sent = model.requests[0]
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert sent.body["model"] == "fake-model" and sent.body["temperature"] == 0.3
    assert sent.body["stream"] is True and sent.body["max_tokens"] == 64
    assert sent.messages == [
        {
            "role": "system",
            "content": "# Role\nA test assistant\n\n# Instructions\nAnswer briefly.",
        },
        {"role": "user", "content": "Hi, I am Ada."},
    ]
    # The key is in no event and not in the server's log.
    assert KEY not in str([f.data for f in frames]) and KEY not in server.log


async def test_memory_over_three_turns_a_restart_and_workers(
    nursery: trio.Nursery, tmp_path: Path, store_url: str, launched: list[CLIServer]
) -> None:
    spec = write_openai_spec(tmp_path, mcp=False)
    async with fake_model() as model:
        env = {"OPENAI_BASE_URL": model.url}
        first = await start_cli_server(nursery, tmp_path, spec, "--store", store_url, env=env)
        launched.append(first)
        session = await new_session(first.url)
        replies = [reply_text(await turn(first.url, session, text)) for text in ("a", "b", "c")]
        assert replies[2] == 'Reply 2: you said "c". Earlier you said "a" | "b".', replies
        assert [m["role"] for m in model.requests[2].messages] == [
            "system",
            "user",
            "assistant",
            "user",
            "assistant",
            "user",
        ]
        assert model.requests[2].messages[2] == {"role": "assistant", "content": replies[0]}

        # Restarted, now as two workers: the history comes from the store.
        first.signal(signal.SIGTERM)
        assert await first.wait() == 0, first.log
        args = ("--store", store_url, "--workers", "2")
        second = await start_cli_server(nursery, tmp_path, spec, *args, env=env)
        launched.append(second)
        for text in ("d", "e"):
            reply = reply_text(await turn(second.url, session, text))
        assert reply == 'Reply 4: you said "e". Earlier you said "a" | "b" | "c" | "d".', reply


async def test_a_tool_round_trip(
    nursery: trio.Nursery, tmp_path: Path, launched: list[CLIServer]
) -> None:
    spec = write_openai_spec(tmp_path)
    async with fake_model() as model:
        server = await serve(nursery, tmp_path, spec, model, launched)
        model.queue(tool_script(("call_1", "add", {"a": 2, "b": 40})))
        frames = await turn(server.url, await new_session(server.url), "What is 2 + 40?")

    kinds = [f.event for f in frames if f.event != "message"]
    assert kinds == [
        "session.started",
        "model.request",
        "model.response",
        "tool.call",
        "tool.result",
        "model.request",
        "model.response",
        "session.ended",
    ], kinds
    call, result = of_type(frames, "tool.call")[0], of_type(frames, "tool.result")[0]
    assert call == {
        "toolName": "add",
        "callId": "call_1",
        "args": {"a": 2, "b": 40},
        "round": 1,
        "server": "tools",
    }
    assert (result["callId"], result["isError"], result["content"]) == ("call_1", False, "42")
    assert result["durationMs"] >= 0
    assert reply_text(frames) == "The tools said: 42."
    offered = {t["function"]["name"] for t in model.requests[0].body["tools"]}
    assert offered == {"add", "shout", "fail", "hang", "current_time"}
    assert model.requests[1].messages[-1] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "42",
    }
    await _servers_gone(tmp_path)


async def test_two_tool_calls_in_one_message_a_failing_one_and_memory_of_them(
    nursery: trio.Nursery, tmp_path: Path, launched: list[CLIServer]
) -> None:
    spec = write_openai_spec(tmp_path)
    async with fake_model() as model:
        server = await serve(nursery, tmp_path, spec, model, launched)
        session = await new_session(server.url)
        model.queue(
            tool_script(("c1", "shout", {"text": "hi"}), ("c2", "fail", {"message": "no disk"}))
        )
        frames = await turn(server.url, session, "Shout hi, then fail.")
        results = of_type(frames, "tool.result")
        assert [(r["callId"], r["isError"]) for r in results] == [("c1", False), ("c2", True)]
        assert results[0]["content"] == "HI"
        assert results[1]["error"]["reason"] == "tool_error"
        assert "no disk" in results[1]["error"]["message"]
        assert reply_text(frames).startswith("The tools said: HI | ")
        assert of_type(frames, "session.ended")[0]["reason"] == "completed"

        # The next turn's history has the calls and their results, paired.
        await turn(server.url, session, "And now?")
        history = model.requests[-1].messages
        calls = [m for m in history if m.get("tool_calls")]
        assert [c["id"] for c in calls[0]["tool_calls"]] == ["c1", "c2"]
        tools = [m for m in history if m["role"] == "tool"]
        assert [t["tool_call_id"] for t in tools] == ["c1", "c2"]


async def test_a_hanging_tool_is_cut_by_its_deadline(
    nursery: trio.Nursery, tmp_path: Path, launched: list[CLIServer]
) -> None:
    spec = write_openai_spec(tmp_path, options={"toolTimeoutMs": 300})
    async with fake_model() as model:
        server = await serve(nursery, tmp_path, spec, model, launched)
        model.queue(tool_script(("c1", "hang", {})))
        frames = await turn(server.url, await new_session(server.url), "Hang.")
    result = of_type(frames, "tool.result")[0]
    assert result["isError"] is True and result["error"]["reason"] == "tool_timeout"
    assert "toolTimeoutMs" in result["error"]["message"]
    assert of_type(frames, "session.ended")[0]["reason"] == "completed"
    await _servers_gone(tmp_path)


async def test_a_model_asking_for_tools_past_the_bound_fails_the_turn(
    nursery: trio.Nursery, tmp_path: Path, launched: list[CLIServer]
) -> None:
    spec = write_openai_spec(tmp_path, options={"maxToolRounds": 2})
    async with fake_model() as model:
        model.auto_tools = {"add": {"a": 1, "b": 1}}
        server = await serve(nursery, tmp_path, spec, model, launched)
        model.queue(*(tool_script((f"c{i}", "add", {"a": i, "b": 0})) for i in range(3)))
        frames = await turn(server.url, await new_session(server.url), "Add forever.")
    assert len(of_type(frames, "tool.result")) == 2
    assert of_type(frames, "error")[0]["reason"] == "tool_rounds_exceeded"
    assert of_type(frames, "session.ended")[0]["reason"] == "error"


async def test_the_warm_pool_serves_the_adapter(
    nursery: trio.Nursery, tmp_path: Path, launched: list[CLIServer]
) -> None:
    spec = write_openai_spec(tmp_path)
    async with fake_model() as model:
        server = await start_cli_server(
            nursery,
            tmp_path,
            spec,
            "--in-memory",
            "--fork-server",
            "off",  # the pool serves exec'd adapters; a fork server replaces it
            env={"OPENAI_BASE_URL": model.url},
            warm_pool=True,
        )
        launched.append(server)
        assert "openai_adapter --preload-mcp" in server.startup_line
        session = await new_session(server.url)
        for text in ("one", "two"):
            # A turn takes a loaded adapter: waited for, as a loaded machine loads it
            # slowly (the pool starts a cold one rather than wait on a slow load).
            await _warm_adapter_ready(server.url)
            assert reply_text(await turn(server.url, session, text)).startswith("Reply")
        with trio.fail_after(30):
            while server.log.count("adapter=warm") < 2:
                await trio.sleep(0.05)


async def _warm_adapter_ready(url: str) -> None:
    """Return once ``/readyz`` counts a loaded warm adapter."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        with trio.fail_after(60):
            while True:
                ready = (await client.get("/readyz")).headers[WARM_HEADER]
                if int(ready.split("/")[0]) >= 1:
                    return
                await trio.sleep(0.05)


async def _servers_gone(directory: Path) -> None:
    """Every MCP server the turns started has exited."""
    pids = mcp_pids(directory)
    assert pids
    for pid in pids:
        await wait_gone(pid, within=10)
