"""The AG-UI face: runs posted to a real server on 127.0.0.1, every event parsed with the
``ag-ui-protocol`` package's models."""

from __future__ import annotations

import sys
from typing import Any

import trio
from ag_ui.core import Event, EventType
from pydantic import TypeAdapter

from tests.helpers import (
    APPROVAL_ADAPTER,
    KEY_A,
    KEY_B,
    Frame,
    Server,
    ServerFactory,
    auth,
    compiled_spec,
    parse_sse,
    read_frames,
    script,
    two_tenants,
)

EVENT: TypeAdapter[Any] = TypeAdapter(Event)
ECHO_ADAPTER = [sys.executable, "-m", "trioserve.runtime.echo_adapter"]


def run_input(text: str, thread: str = "thread-1", run: str = "run-1") -> dict[str, Any]:
    return {
        "threadId": thread,
        "runId": run,
        "state": {},
        "messages": [
            {"id": "m0", "role": "user", "content": "an earlier message"},
            {"id": "m1", "role": "assistant", "content": "an earlier answer"},
            {"id": "m2", "role": "user", "content": text},
        ],
        "tools": [],
        "context": [],
        "forwardedProps": {},
    }


async def run(
    server: Server, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[list[Any], list[Frame]]:
    """Post a run; its events, each validated by AG-UI's models, and its frames."""
    resp = await server.client.post("/ag-ui", json=body, headers=headers, timeout=120)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "text/event-stream"
    frames = parse_sse(resp.text)
    return [EVENT.validate_python(f.data) for f in frames], frames


def kinds(events: list[Any]) -> list[str]:
    return [e.type.value for e in events]


def joined(events: list[Any]) -> str:
    return "".join(e.delta for e in events if e.type == EventType.TEXT_MESSAGE_CONTENT)


async def test_a_run_is_a_turn_streamed_as_agui_events(start_server: ServerFactory) -> None:
    server = await start_server()
    events, frames = await run(server, run_input("hello"))
    assert kinds(events) == [
        "RUN_STARTED",
        "RAW",  # session.started
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RAW",  # session.ended
        "RUN_FINISHED",
    ]
    started, finished = events[0], events[-1]
    assert (started.thread_id, started.run_id) == ("thread-1", "run-1")
    assert (finished.thread_id, finished.run_id) == ("thread-1", "run-1")
    assert finished.outcome.type == "success"
    assert joined(events) == "echo: hello"  # the last user message is the input
    ids = started.metadata["trioserve"]
    sid, tid = ids["sessionId"], ids["turnId"]
    assert finished.result == {
        "sessionId": sid,
        "turnId": tid,
        "status": "completed",
        "reason": "completed",
        "lastSeq": 3,
    }
    assert events[1].event["type"] == "session.started" and events[1].source == "trioserve"
    # Each frame made from a logged event ends with its seq as the SSE id: one cursor.
    assert [f.id for f in frames] == [None, "1", None, None, "2", "3", None]
    record = (await server.client.get(f"/v1/sessions/{sid}/turns/{tid}")).json()
    assert record["status"] == "completed" and record["input"] == "hello"

    # The thread is the session: the next run continues it.
    events, _ = await run(server, run_input("again", run="run-2"))
    assert events[0].metadata["trioserve"]["sessionId"] == sid
    turns = (await server.client.get(f"/v1/sessions/{sid}/turns")).json()
    assert [t["input"] for t in turns] == ["hello", "again"]
    # A session's own id names it too.
    events, _ = await run(server, run_input("by id", thread=sid, run="run-3"))
    assert events[0].metadata["trioserve"]["sessionId"] == sid
    assert events[-1].result["lastSeq"] == 9


async def test_a_run_posted_again_streams_its_turn_again(start_server: ServerFactory) -> None:
    server = await start_server()
    first, _ = await run(server, run_input("once"))
    sid = first[0].metadata["trioserve"]["sessionId"]
    again, _ = await run(server, run_input("once"))
    assert kinds(again) == kinds(first) and joined(again) == "echo: once"
    assert again[0].metadata == first[0].metadata
    after, after_frames = await run(server, run_input("once"), {"Last-Event-ID": "2"})
    assert kinds(after) == ["RUN_STARTED", "RAW", "RUN_FINISHED"]
    assert [f.id for f in after_frames] == [None, "3", None]
    turns = (await server.client.get(f"/v1/sessions/{sid}/turns")).json()
    assert len(turns) == 1  # nothing ran twice
    # The same runId with another input is refused, naming the key's rule.
    other = await server.client.post("/ag-ui", json=run_input("different"))
    assert other.status_code == 422
    assert other.json()["error"]["reason"] == "idempotency_key_reused"


async def test_messages_tools_and_other_events(start_server: ServerFactory) -> None:
    server = await start_server()
    said = {"role": "assistant"}
    steps = script(
        {"event": "model.request", "data": {"round": 1}},
        {"event": "message", "data": said | {"text": "Hel", "delta": True}},
        {"event": "message", "data": said | {"text": "lo", "delta": True}},
        {"event": "message", "data": said | {"text": "Hello", "final": True}},
        {"event": "tool.call", "data": {"toolName": "add", "callId": "c1", "args": {"a": 1}}},
        {"event": "tool.result", "data": {"toolName": "add", "callId": "c1", "content": "2"}},
        {"event": "message", "data": said | {"text": "It is", "delta": True}},
        {"event": "warning", "data": {"reason": "x"}},
        {"event": "message", "data": said | {"text": "Done."}},
        {"event": "message", "data": {"i": 1}},
        {"end": "completed"},
    )
    events, _ = await run(server, run_input(steps))
    assert kinds(events) == [
        "RUN_STARTED",
        "RAW",  # session.started
        "RAW",  # model.request
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",  # the round's whole text closes its pieces
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",  # closed by the next event
        "RAW",  # warning
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",  # a whole message
        "RAW",  # a message without text
        "RAW",  # session.ended
        "RUN_FINISHED",
    ]
    call = events[7]
    assert (call.tool_call_id, call.tool_call_name) == ("c1", "add")
    assert events[8].delta == '{"a": 1}'
    assert (events[10].tool_call_id, events[10].content) == ("c1", "2")
    assert joined(events) == "HelloIt isDone."
    # Every message's events share its id.
    starts = [e.message_id for e in events if e.type == EventType.TEXT_MESSAGE_START]
    ends = [e.message_id for e in events if e.type == EventType.TEXT_MESSAGE_END]
    assert starts == ends and len(set(starts)) == 3


async def test_failed_and_cancelled_runs(start_server: ServerFactory) -> None:
    server = await start_server()
    failed, _ = await run(server, run_input(script({"exit": 3}), run="crash"))
    assert kinds(failed)[-2:] == ["RAW", "RUN_ERROR"]  # the server's error event, then the end
    assert failed[-1].code == "adapter_exit"
    assert failed[-2].event["type"] == "error"

    # A run cancelled over REST ends RUN_FINISHED with outcome cancelled.
    body = run_input(script({"tick": 1000, "every": 0.01}), run="long")
    seen: list[Any] = []
    async with server.client.stream("POST", "/ag-ui", json=body, timeout=120) as resp:
        async for frame in read_frames(resp):
            if frame.event == "comment":
                continue
            seen.append(EVENT.validate_python(frame.data))
            if len(seen) == 3:
                sid = seen[0].metadata["trioserve"]["sessionId"]
                cancel = await server.client.delete(f"/v1/sessions/{sid}/turns/current")
                assert cancel.status_code == 202
    assert seen[-1].type == EventType.RUN_FINISHED
    assert seen[-1].outcome.type == "cancelled"
    assert seen[-1].result["status"] == "cancelled"


async def test_a_client_that_leaves_cancels_its_run(start_server: ServerFactory) -> None:
    server = await start_server()
    body = run_input(script({"hang": True}), run="left")
    async with server.client.stream("POST", "/ag-ui", json=body, timeout=120) as resp:
        async for frame in read_frames(resp):
            if frame.event != "comment":
                started = EVENT.validate_python(frame.data)
                break
    sid, tid = started.metadata["trioserve"]["sessionId"], started.metadata["trioserve"]["turnId"]
    with trio.fail_after(30):
        while True:
            record = (await server.client.get(f"/v1/sessions/{sid}/turns/{tid}")).json()
            if record["status"] != "running":
                break
            await trio.sleep(0.02)
    assert record["status"] == "cancelled" and record["reason"] == "client_disconnected"


async def test_the_echo_adapter_streams_its_pieces(start_server: ServerFactory) -> None:
    spec = compiled_spec(runtime="echo") | {
        "runtime": {"type": "echo", "options": {"chunkSize": 4}}
    }
    server = await start_server(spec=spec, command=ECHO_ADAPTER)
    events, _ = await run(server, run_input("hi"))
    pieces = [e for e in events if e.type == EventType.TEXT_MESSAGE_CONTENT]
    assert len(pieces) > 1
    assert 'you said "hi"' in joined(events)
    assert kinds(events).count("TEXT_MESSAGE_START") == 1
    assert events[-1].type == EventType.RUN_FINISHED


async def test_tenants_threads_are_their_own(start_server: ServerFactory) -> None:
    server = await start_server(keys=two_tenants())
    refused = await server.client.post("/ag-ui", json=run_input("x"))
    assert refused.status_code == 401
    alpha, _ = await run(server, run_input("mine"), auth(KEY_A))
    sid = alpha[0].metadata["trioserve"]["sessionId"]
    # The same thread name, or alpha's session id, is another thread for beta.
    for thread in ("thread-1", sid):
        beta, _ = await run(server, run_input("theirs", thread=thread, run=thread), auth(KEY_B))
        assert beta[0].metadata["trioserve"]["sessionId"] != sid
    turns = await server.client.get(f"/v1/sessions/{sid}/turns", headers=auth(KEY_A))
    assert [t["input"] for t in turns.json()] == ["mine"]


async def test_hostile_input_is_a_400_naming_the_field(start_server: ServerFactory) -> None:
    server = await start_server()
    good = run_input("x")
    cases: list[tuple[bytes | dict[str, Any] | list[Any], str]] = [
        (b"{not json", "malformed JSON"),
        (b"\xff\xfe", "UTF-8"),
        ([], "RunAgentInput object"),
        ({k: v for k, v in good.items() if k != "threadId"}, "threadId"),
        (good | {"messages": "hello"}, "messages"),
        (good | {"runId": 5}, "runId"),
        (good | {"threadId": "t" * 5000}, "threadId"),
        (good | {"messages": [{"id": "m", "role": "user"}]}, "messages"),
    ]
    for body, named in cases:
        if isinstance(body, bytes):
            resp = await server.client.post("/ag-ui", content=body)
        else:
            resp = await server.client.post("/ag-ui", json=body)
        assert resp.status_code == 400, (body, resp.text)
        error = resp.json()["error"]
        assert error["reason"] == "invalid_request" and named in error["message"], error
    bad_cursor = await server.client.post("/ag-ui", json=good, headers={"Last-Event-ID": "x" * 30})
    assert bad_cursor.status_code == 400
    # Nothing ran: no session was made by any of them.
    assert (await server.client.get("/v1/sessions")).json() == []


async def test_no_ag_ui_serves_no_route(start_server: ServerFactory) -> None:
    server = await start_server(ag_ui=False)
    resp = await server.client.post("/ag-ui", json=run_input("x"))
    assert resp.status_code == 404 and resp.json()["error"]["reason"] == "route_not_found"


async def test_a_run_whose_turn_waits_for_an_approval_ends_with_an_interrupt(
    start_server: ServerFactory,
) -> None:
    """The run ends ``RUN_FINISHED`` with outcome ``interrupt`` (the approval) as its turn
    waits; decided over the REST API, the turn goes on to its end."""
    server = await start_server(command=APPROVAL_ADAPTER, require_approval=("deploy",))
    events, _ = await run(server, run_input("prod"))
    finished = events[-1]
    assert finished.type == EventType.RUN_FINISHED
    assert finished.outcome.type == "interrupt", finished
    (asked,) = finished.outcome.interrupts
    assert (asked.reason, asked.tool_call_id) == ("approval", "deploy-1")
    assert asked.metadata == {"tool": "deploy", "arguments": {"target": "prod"}}
    session_id, turn_id = finished.result["sessionId"], finished.result["turnId"]
    assert finished.result["status"] == "waiting"
    path = f"/v1/sessions/{session_id}/approvals/{asked.id}"
    resp = await server.client.post(path, json={"decision": "approve"})
    assert resp.status_code == 200, resp.text
    events_path = f"/v1/sessions/{session_id}/events"
    resp = await server.client.get(events_path, params={"turn": turn_id}, timeout=60)
    assert parse_sse(resp.text)[-1].data["data"]["reason"] == "completed"
