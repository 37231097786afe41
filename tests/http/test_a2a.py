"""The A2A face: the ``a2a-sdk`` package's own client, unmodified, against a real server.

The client is plain httpx, so it runs in the test's Trio run; its turns are
the fake adapter's scripts (in-process) and, in one test, the echo adapter.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from a2a.client import ClientConfig, create_client
from a2a.client.client import Client
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)
from a2a.utils.errors import A2AError
from google.protobuf import json_format

from tests.helpers import (
    APPROVAL_ADAPTER,
    KEY_A,
    KEY_B,
    Server,
    ServerFactory,
    auth,
    compiled_spec,
    parse_sse,
    script,
    two_tenants,
)

ECHO_ADAPTER = [sys.executable, "-m", "trioserve.runtime.echo_adapter"]
COMPLETED = TaskState.TASK_STATE_COMPLETED


@asynccontextmanager
async def a2a_client(
    server: Server, *, streaming: bool = True, key: str | None = None
) -> AsyncIterator[Client]:
    headers = auth(key) if key is not None else None
    async with httpx.AsyncClient(headers=headers, timeout=120) as http:
        config = ClientConfig(streaming=streaming, httpx_client=http)
        client = await create_client(server.url, client_config=config)
        yield client


def message(text: str, context: str = "") -> SendMessageRequest:
    said = Message(message_id=f"m-{text[:20]}", role=Role.ROLE_USER, parts=[Part(text=text)])
    if context:
        said.context_id = context
    return SendMessageRequest(message=said)


async def collect(stream: AsyncIterator[StreamResponse]) -> list[StreamResponse]:
    return [response async for response in stream]


async def cut(stream: AsyncIterator[StreamResponse]) -> None:
    """Leave a stream: its connection is closed."""
    assert isinstance(stream, AsyncGenerator)
    await stream.aclose()


def reply_of(task: Task) -> str:
    return "".join(p.text for a in task.artifacts for p in a.parts)


async def test_the_card_is_made_from_the_spec(start_server: ServerFactory) -> None:
    server = await start_server()
    card = (await server.client.get("/.well-known/agent-card.json")).json()
    assert card["name"] == "test-agent" and card["capabilities"]["streaming"] is True
    assert card["supportedInterfaces"] == [
        {"url": f"{server.url}/a2a", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
    ]
    assert [s["id"] for s in card["skills"]] == ["test-agent"]
    assert "securitySchemes" not in card
    text = json.dumps(card)
    assert "/tmp" not in text and "fakeadapter" not in text  # no paths, no command
    keyed = await start_server(keys=two_tenants())
    card = (await keyed.client.get("/.well-known/agent-card.json", headers=auth(KEY_A))).json()
    assert card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"


async def test_send_a_message_blocking_and_streaming(start_server: ServerFactory) -> None:
    server = await start_server()
    async with a2a_client(server, streaming=False) as client:
        [response] = await collect(client.send_message(message("hello")))
        task = response.task
        assert task.status.state == COMPLETED and reply_of(task) == "echo: hello"
        assert [m.role for m in task.history] == [Role.ROLE_USER, Role.ROLE_AGENT]
        assert task.status.message.parts[0].text == "echo: hello"
        session_id, turn_id = task.id.split(".")
        assert task.context_id == session_id
        record = (await server.client.get(f"/v1/sessions/{session_id}/turns/{turn_id}")).json()
        assert record["status"] == "completed"

        # The same context: the next turn of the session.
        [again] = await collect(client.send_message(message("more", task.context_id)))
        assert again.task.context_id == task.context_id
        assert reply_of(again.task) == "echo: more"

    async with a2a_client(server) as client:
        responses = await collect(client.send_message(message("streamed", "my-context")))
        first, *updates, last = responses
        assert first.HasField("task")
        assert first.task.status.state == TaskState.TASK_STATE_WORKING
        kinds = [r.WhichOneof("payload") for r in updates]
        assert kinds == ["status_update", "artifact_update", "status_update"]
        assert updates[1].artifact_update.artifact.parts[0].text == "echo: streamed"
        # Other events are status updates holding the event as a data part.
        data = json_format.MessageToDict(updates[0].status_update.status.message.parts[0])
        assert data["data"]["type"] == "session.started"
        assert last.status_update.status.state == COMPLETED
        # A context named by the client is one session from then on.
        responses = await collect(client.send_message(message("second", "my-context")))
        assert responses[0].task.context_id == first.task.context_id


async def test_get_list_and_cancel_tasks(start_server: ServerFactory) -> None:
    server = await start_server()
    async with a2a_client(server) as client:
        done = (await collect(client.send_message(message("one"))))[0].task
        task = await client.get_task(GetTaskRequest(id=done.id))
        assert task.status.state == COMPLETED and reply_of(task) == "echo: one"

        # A long task, started without waiting, is listed, then cancelled.
        long = message(script({"tick": 100000, "every": 0.01}), done.context_id)
        long.configuration.return_immediately = True
        stream = client.send_message(long)
        started = (await anext(stream)).task
        await cut(stream)
        listed = await client.list_tasks(ListTasksRequest(context_id=done.context_id))
        assert [t.id for t in listed.tasks] == [started.id, done.id]
        assert listed.tasks[0].status.state == TaskState.TASK_STATE_WORKING
        working = await client.list_tasks(ListTasksRequest(status=TaskState.TASK_STATE_WORKING))
        assert [t.id for t in working.tasks] == [started.id]
        cancelled = await client.cancel_task(CancelTaskRequest(id=started.id))
        assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
        with pytest.raises(A2AError, match="cancelled"):
            await client.cancel_task(CancelTaskRequest(id=started.id))
        with pytest.raises(A2AError, match="not found"):
            await client.get_task(GetTaskRequest(id="s_nope.t_nope"))


async def test_resubscribe_after_a_cut_misses_nothing(
    start_server: ServerFactory, tmp_path: Path
) -> None:
    server = await start_server(processes=True)
    gate = trio.Path(tmp_path / "gate")
    said = {"role": "assistant", "delta": True}
    steps = [{"event": "message", "data": said | {"text": t}} for t in "abc"]
    steps += [{"wait": str(gate)}]
    steps += [{"event": "message", "data": said | {"text": t}} for t in "def"]
    steps += [{"end": "completed"}]
    async with a2a_client(server) as client:
        stream = client.send_message(message(script(*steps)))
        seen = [await anext(stream) for _ in range(3)]  # the task, session.started, "a"
        await cut(stream)  # the cut
        task_id = seen[0].task.id
        assert seen[2].artifact_update.artifact.parts[0].text == "a"
        cut_at = int(seen[2].artifact_update.metadata["seq"])
        sid, tid = task_id.split(".")
        with trio.fail_after(30):  # the adapter waits at the gate once "c" is logged
            while (
                len((await server.client.get(f"/v1/sessions/{sid}/events?format=json")).json()) < 4
            ):
                await trio.sleep(0.02)

        # The SDK's resubscribe: the task as it stands, then what follows.
        subscription = client.subscribe(SubscribeToTaskRequest(id=task_id))
        snapshot = await anext(subscription)
        assert snapshot.task.id == task_id and reply_of(snapshot.task) == "abc"
        # With Last-Event-ID: exactly the events after it.
        body = {"jsonrpc": "2.0", "id": 7, "method": "SubscribeToTask", "params": {"id": task_id}}
        headers = {"Last-Event-ID": str(cut_at)}
        async with server.client.stream("POST", "/a2a", json=body, headers=headers) as resp:
            assert resp.headers["content-type"] == "text/event-stream"
            await gate.touch()
            frames = parse_sse((await resp.aread()).decode())
        rest = await collect(subscription)
    pieces = [
        r.artifact_update.artifact.parts[0].text for r in rest if r.HasField("artifact_update")
    ]
    assert pieces == list("def") and rest[-1].status_update.status.state == COMPLETED
    results = [f.data["result"] for f in frames]
    assert results[0]["task"]["id"] == task_id and frames[0].id is None
    texts = [
        r["artifactUpdate"]["artifact"]["parts"][0]["text"]
        for r in results
        if "artifactUpdate" in r
    ]
    assert texts == list("bcdef")
    ids = [int(f.id) for f in frames if f.id is not None]
    assert ids == list(range(cut_at + 1, cut_at + 1 + len(ids)))  # no gap, nothing twice
    last = parse_sse((await server.client.get(f"/v1/sessions/{sid}/events")).text)[-1].seq
    assert ids[-1] == last
    assert results[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
    record = (await server.client.get(f"/v1/sessions/{sid}/turns/{tid}")).json()
    assert record["status"] == "completed"


async def test_tenants_do_not_see_each_others_tasks(start_server: ServerFactory) -> None:
    server = await start_server(keys=two_tenants())
    async with a2a_client(server, key=KEY_A) as alpha:
        task = (await collect(alpha.send_message(message("mine"))))[0].task
    async with a2a_client(server, key=KEY_B) as beta:
        with pytest.raises(A2AError, match="not found"):
            await beta.get_task(GetTaskRequest(id=task.id))
        with pytest.raises(A2AError, match="not found"):
            await beta.cancel_task(CancelTaskRequest(id=task.id))
        assert list((await beta.list_tasks(ListTasksRequest())).tasks) == []
        other = (await collect(beta.send_message(message("theirs", task.context_id))))[0]
        assert other.task.context_id != task.context_id


async def test_hostile_requests_get_jsonrpc_errors(start_server: ServerFactory) -> None:
    server = await start_server()
    cases: list[tuple[Any, int]] = [
        (b"{not json", -32700),
        (b"[]", -32600),
        ({"jsonrpc": "2.0", "id": 1}, -32600),
        ({"jsonrpc": "1.0", "id": 1, "method": "GetTask"}, -32600),
        ({"jsonrpc": "2.0", "id": "x" * 5000, "method": "GetTask"}, -32600),
        ({"jsonrpc": "2.0", "id": 1, "method": "NoSuchMethod"}, -32601),
        ({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": []}, -32602),
        ({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": 5}}, -32602),
        ({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {}}, -32602),
        ({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "t_1"}}, -32001),
        ({"jsonrpc": "2.0", "id": 1, "method": "CancelTask", "params": {"id": "x"}}, -32001),
        ({"jsonrpc": "2.0", "id": 1, "method": "CreateTaskPushNotificationConfig"}, -32003),
        ({"jsonrpc": "2.0", "id": 1, "method": "GetExtendedAgentCard"}, -32007),
    ]
    for body, code in cases:
        if isinstance(body, bytes):
            resp = await server.client.post("/a2a", content=body)
        else:
            resp = await server.client.post("/a2a", json=body)
        assert resp.status_code == 200, (body, resp.text)
        answer = resp.json()
        assert answer["jsonrpc"] == "2.0" and answer["error"]["code"] == code, (body, answer)
    assert (await server.client.get("/v1/sessions")).json() == []


async def test_the_echo_adapter_over_a2a(start_server: ServerFactory) -> None:
    options = {"chunkSize": 4}
    spec = compiled_spec(runtime="echo") | {"runtime": {"type": "echo", "options": options}}
    server = await start_server(spec=spec, command=ECHO_ADAPTER)
    async with a2a_client(server) as client:
        responses = await collect(client.send_message(message("hi")))
        pieces = [
            r.artifact_update.artifact.parts[0].text
            for r in responses
            if r.HasField("artifact_update")
        ]
        assert len(pieces) > 1
        final = responses[-1].status_update.status
        assert final.state == COMPLETED and final.message.parts[0].text == "".join(pieces)


async def test_no_a2a_serves_no_route(start_server: ServerFactory) -> None:
    server = await start_server(a2a=False)
    for method, path in (("GET", "/.well-known/agent-card.json"), ("POST", "/a2a")):
        resp = await server.client.request(method, path)
        assert resp.status_code == 404


async def test_a_task_started_over_a2a_is_resumed_over_sse_and_cancelled_over_rest(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    async with a2a_client(server) as client:
        long = message(script({"tick": 100000, "every": 0.01}))
        long.configuration.return_immediately = True
        stream = client.send_message(long)
        task = (await anext(stream)).task
        await cut(stream)
        sid, tid = task.id.split(".")
        # Resumed over SSE after its first event, cancelled over REST.
        events = f"/v1/sessions/{sid}/events"
        async with server.client.stream("GET", events, headers={"Last-Event-ID": "1"}) as resp:
            lines = resp.aiter_lines()
            async for line in lines:
                if line.startswith("id: "):
                    assert line == "id: 2"
                    break
            cancel = await server.client.delete(f"/v1/sessions/{sid}/turns/current")
            assert cancel.status_code == 202
            async for _ in lines:
                pass  # the stream ends with the turn
        ended = await client.get_task(GetTaskRequest(id=task.id))
        assert ended.status.state == TaskState.TASK_STATE_CANCELED
        record = (await server.client.get(f"/v1/sessions/{sid}/turns/{tid}")).json()
        assert record["status"] == "cancelled"


INPUT_REQUIRED = TaskState.TASK_STATE_INPUT_REQUIRED


async def decide(server: Server, task: Task, decision: str) -> None:
    """Decide the task's pending approval over the REST API."""
    session_id = task.id.split(".")[0]
    path = f"/v1/sessions/{session_id}/approvals"
    (pending,) = [a for a in (await server.client.get(path)).json() if a["status"] == "pending"]
    resp = await server.client.post(f"{path}/{pending['approvalId']}", json={"decision": decision})
    assert resp.status_code == 200, resp.text


async def test_a_task_waiting_for_an_approval_is_input_required(
    start_server: ServerFactory,
) -> None:
    """A turn waiting for a person is an input-required task: a blocking SendMessage answers
    then, GetTask says so, and a stream shows the approval as an input-required update;
    once decided over the REST API the task goes on to its end."""
    server = await start_server(command=APPROVAL_ADAPTER, require_approval=("deploy",))
    async with a2a_client(server, streaming=False) as client:
        (sent,) = await collect(client.send_message(message("prod")))
        task = sent.task
        assert task.status.state == INPUT_REQUIRED
        assert (await client.get_task(GetTaskRequest(id=task.id))).status.state == INPUT_REQUIRED
        await decide(server, task, "approve")
        with trio.fail_after(60):
            while (done := await client.get_task(GetTaskRequest(id=task.id))).status.state in (
                INPUT_REQUIRED,
                TaskState.TASK_STATE_WORKING,
            ):
                await trio.sleep(0.05)
        assert done.status.state == COMPLETED and reply_of(done) == "deployed prod"

    async with a2a_client(server) as client:
        states = []
        async for response in client.send_message(message("qa", task.context_id)):
            if response.HasField("status_update"):
                update = response.status_update.status
                states.append(update.state)
                if update.state == INPUT_REQUIRED:
                    data = json_format.MessageToDict(update.message.parts[0].data)
                    assert (data["type"], data["data"]["tool"]) == ("approval.requested", "deploy")
                    await decide(server, task, "deny")
        assert INPUT_REQUIRED in states and states[-1] == COMPLETED

    async with a2a_client(server, streaming=False) as client:  # cancelled while it waits
        (sent,) = await collect(client.send_message(message("dev", task.context_id)))
        assert sent.task.status.state == INPUT_REQUIRED
        cancelled = await client.cancel_task(CancelTaskRequest(id=sent.task.id))
        assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
