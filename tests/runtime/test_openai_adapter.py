"""The openai adapter's pieces without a server: the stream, refusals, history, settings.

And the program itself fed a spec on stdin: what it prints for a spec it
cannot read and for a transport it does not speak, and that it starts
without trio.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.helpers import typed_spec
from tests.helpers.fake_openai import chunk, tool_script, usage_frame
from trioserve.protocol import EVENTS_API_VERSION
from trioserve.runtime.openai_adapter._conversation import conversation, turn_messages
from trioserve.runtime.openai_adapter._errors import for_status, retry_after
from trioserve.runtime.openai_adapter._events import Failure
from trioserve.runtime.openai_adapter._settings import settings_from
from trioserve.runtime.openai_adapter._stream import EventLines, ReplyBuilder
from trioserve.runtime.wire_events import API_VERSION
from trioserve.spec import HistoryEvent, HistoryTurn, TurnContext


def feed(frames: list[bytes]) -> tuple[ReplyBuilder, list[str]]:
    """Frames as the client reads them: split into lines, one byte of a chunk boundary apart."""
    builder, lines, texts = ReplyBuilder(), EventLines(), []
    for line in b"".join(frames).decode().split("\n"):
        data = lines.feed(line)
        if data is not None:
            texts.append(builder.add_data(data))
    return builder, texts


def test_tool_call_pieces_split_across_chunks_join_into_whole_calls() -> None:
    frames = tool_script(("c1", "add", {"a": 2, "b": 3}), ("c2", "shout", {"text": "é"})).frames
    builder, texts = feed([*frames, b"data: [DONE]\n\n"])
    reply = builder.reply()
    assert [(c.id, c.name, json.loads(c.arguments)) for c in reply.tool_calls] == [
        ("c1", "add", {"a": 2, "b": 3}),
        ("c2", "shout", {"text": "é"}),
    ]
    assert reply.finish_reason == "tool_calls" and reply.usage["prompt_tokens"] == 20
    assert "".join(texts) == ""


def test_text_deltas_usage_and_done() -> None:
    frames = [chunk({"role": "assistant"}), chunk({"content": "Hi"}), chunk({"content": " you"})]
    builder, texts = feed([*frames, chunk(finish="stop"), usage_frame(3, 2), b"data: [DONE]\n\n"])
    assert texts == ["", "Hi", " you", "", "", ""]
    reply = builder.reply()
    assert (reply.text, reply.finish_reason, reply.usage["completion_tokens"]) == (
        "Hi you",
        "stop",
        2,
    )


@pytest.mark.parametrize(
    ("chunk_value", "why"),
    [
        ([1, 2], "a chunk is not a JSON object"),
        ({"choices": {"0": {}}}, "'choices' is not a list"),
        ({"choices": [{"delta": "text"}]}, "'delta' is not an object"),
        ({"choices": [{"delta": {"content": 3}}]}, "'delta.content' is not a string"),
        ({"choices": [{"delta": {"tool_calls": [{"index": "0"}]}}]}, "no integer 'index'"),
    ],
)
def test_malformed_chunks_say_what_is_wrong(chunk_value: Any, why: str) -> None:
    with pytest.raises(Failure) as info:
        ReplyBuilder().add(chunk_value)
    assert info.value.reason == "model_stream_malformed" and why in info.value.message


def test_an_error_in_the_stream_is_the_servers_failure() -> None:
    with pytest.raises(Failure) as info:
        ReplyBuilder().add({"error": {"message": "prompt is too long: 9000 tokens"}})
    assert info.value.reason == "context_length_exceeded"
    with pytest.raises(Failure) as info:
        ReplyBuilder().add({"error": "GPU fell over"})
    assert (info.value.reason, "GPU fell over" in info.value.message) == (
        "model_server_error",
        True,
    )


def test_a_reply_without_an_end_or_a_named_call_is_malformed() -> None:
    with pytest.raises(Failure, match="ended before the reply did"):
        feed([chunk({"content": "Hi"})])[0].reply()
    builder, _ = feed(
        [chunk({"tool_calls": [{"index": 0, "id": "c"}]}), chunk(finish="tool_calls")]
    )
    with pytest.raises(Failure, match="tool call 0 has no function name"):
        builder.reply()


def test_retry_after_in_seconds_milliseconds_or_a_date() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert retry_after({"retry-after": "7"}) == 7
    assert retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert retry_after({"retry-after": "Thu, 01 Jan 2026 12:00:30 GMT"}, now=now) == 30
    assert retry_after({"retry-after": "soon"}) is None and retry_after({}) is None


@pytest.mark.parametrize(
    ("status", "body", "reason"),
    [
        (401, b'{"error":{"message":"bad key"}}', "model_auth_failed"),
        (403, b"forbidden", "model_auth_failed"),
        (404, b'{"error":"model not found"}', "model_not_found"),
        (429, b"{}", "model_rate_limited"),
        (
            400,
            b'{"error":{"message":"maximum context length exceeded"}}',
            "context_length_exceeded",
        ),
        (400, b'{"error":{"message":"temperature too high"}}', "model_request_rejected"),
        (503, b"<html>down</html>", "model_server_error"),
    ],
)
def test_refusals_map_to_reasons_quoting_the_server(status: int, body: bytes, reason: str) -> None:
    failure = for_status(status, body, {}, model="m", url="http://127.0.0.1:1/v1")
    assert failure.reason == reason and failure.details["status"] == status
    said = json.loads(body)["error"] if body.startswith(b'{"error"') else None
    if isinstance(said, dict):
        assert said["message"] in failure.message


def test_settings_come_from_the_environment_and_options() -> None:
    env = {
        "OPENAI_BASE_URL": "http://a/v1",
        "TRIOSERVE_OPENAI_BASE_URL": "https://user:pw@model.example:8443/v1/?k=1",
        "OPENAI_API_KEY": "sk-openai",
    }
    settings = settings_from({"toolTimeoutMs": 1500, "maxTokens": 99}, env)
    assert settings.api_key == "sk-openai" and settings.tool_timeout == 1.5
    assert settings.max_tokens == 99 and settings.reply_reserve == 99
    assert settings.shown_url == "https://model.example:8443/v1/"  # no credentials shown
    bare = settings_from({}, {})
    assert (bare.base_url, bare.api_key) == ("https://api.openai.com/v1", None)
    assert (
        settings_from({}, {"TRIOSERVE_OPENAI_API_KEY": "sk-t", "OPENAI_API_KEY": "x"}).api_key
        == "sk-t"
    )


def said(text: str, round_: int = 1, **data: Any) -> HistoryEvent:
    return HistoryEvent(
        type="message",
        data={"role": "assistant", "text": text, "final": True, "round": round_, **data},
    )


def test_an_earlier_turn_becomes_the_messages_the_model_saw() -> None:
    call = {"toolName": "add", "callId": "c1", "args": {"a": 1}, "round": 1}
    turn = HistoryTurn(
        input="add",
        events=[
            said("Let me add."),
            HistoryEvent(type="tool.call", data=call),
            HistoryEvent(
                type="tool.call", data={**call, "callId": "orphan"}
            ),  # no result: left out
            HistoryEvent(type="tool.result", data={"callId": "c1", "content": "2"}),
            said("It is 2.", round_=2),
            HistoryEvent(type="message", data={"role": "assistant", "text": "(another adapter's)"}),
        ],
    )
    assert turn_messages(turn) == [
        {"role": "user", "content": "add"},
        {
            "role": "assistant",
            "content": "Let me add.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 1}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "2"},
        {"role": "assistant", "content": "It is 2."},
        {"role": "assistant", "content": "(another adapter's)"},
    ]


def test_the_history_is_cut_to_the_budget_oldest_turns_first() -> None:
    turns = [HistoryTurn(input=f"question {i}", events=[said("x" * 400)]) for i in range(5)]
    spec = typed_spec("now?", runtime="openai").model_copy(
        update={"trioserve": TurnContext(history=turns)}
    )
    whole = conversation(spec, [], 10_000)
    assert (whole.kept_turns, whole.dropped_turns, len(whole.messages)) == (5, 0, 11)
    cut = conversation(spec, [], 350)
    assert (cut.kept_turns, cut.dropped_turns) == (2, 3)
    assert [m["content"] for m in cut.messages if m["role"] == "user"] == [
        "question 3",
        "question 4",
        "now?",
    ]


def run_adapter(
    stdin: bytes, *args: str
) -> tuple[list[dict[str, Any]], subprocess.CompletedProcess[bytes]]:
    done = subprocess.run(
        [sys.executable, "-m", "trioserve.runtime.openai_adapter", *args],
        input=stdin,
        capture_output=True,
        timeout=60,
    )
    return [json.loads(line) for line in done.stdout.splitlines()], done


def test_a_spec_it_cannot_read_is_an_error_event_not_a_traceback() -> None:
    for stdin, why in ((b"{not json", "is not JSON"), (b'{"v": 1}', "is not valid")):
        events, done = run_adapter(stdin)
        assert [e["type"] for e in events] == ["error", "session.ended"], done.stderr
        assert events[0]["data"]["reason"] == "spec_invalid" and why in events[0]["data"]["message"]
        assert done.returncode == 1 and b"Traceback" not in done.stdout + done.stderr


def test_a_transport_it_does_not_speak_is_named_with_what_it_does() -> None:
    spec = typed_spec("hi", runtime="openai").to_json_dict()
    spec["model"]["provider"] = "openai"
    spec["mcpServers"] = [{"name": "remote", "transport": "sse", "url": "http://127.0.0.1:1/sse"}]
    events, _ = run_adapter(json.dumps(spec).encode())
    assert [e["type"] for e in events] == ["session.started", "error", "session.ended"]
    error = events[1]["data"]
    assert error["reason"] == "mcp_transport_unsupported"
    assert "'sse' is not supported" in error["message"] and "(supported: stdio)" in error["message"]


def test_the_adapter_starts_without_trio_and_prints_the_protocols_api_version() -> None:
    assert API_VERSION == EVENTS_API_VERSION
    code = (
        "import sys, trioserve.runtime.openai_adapter._adapter as a;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('trio', 'mcp')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert loaded.stdout.strip() == "[]", loaded.stdout
