"""A2A: a follow-up message answers an ``input-required`` task by deciding its approval.

The ``a2a-sdk`` package's own client, unmodified, against a real server on
127.0.0.1 whose adapter (tests/helpers/approval_adapter.py) asks before its
``deploy`` tool runs.
"""

from __future__ import annotations

from typing import Any

import pytest
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    Task,
    TaskState,
)
from a2a.utils.errors import A2AError
from google.protobuf import json_format
from google.protobuf.struct_pb2 import Value

from tests.helpers import APPROVAL_ADAPTER, KEY_A, KEY_B, ServerFactory, auth, two_tenants
from tests.http.test_a2a import a2a_client, collect, message, reply_of

INPUT_REQUIRED = TaskState.TASK_STATE_INPUT_REQUIRED
COMPLETED = TaskState.TASK_STATE_COMPLETED


def answer(task: Task, *, text: str = "", data: dict[str, Any] | None = None) -> SendMessageRequest:
    """A follow-up of ``task``: a text part, or a data part."""
    part = Part(text=text)
    if data is not None:
        value = Value()
        value.struct_value.update(data)
        part = Part(data=value, media_type="application/json")
    said = Message(
        message_id=f"answer-{text or 'data'}",
        role=Role.ROLE_USER,
        parts=[part],
        task_id=task.id,
        context_id=task.context_id,
    )
    return SendMessageRequest(message=said)


def asked(task: Task) -> dict[str, Any]:
    """The approval an input-required task waits for (its status message's data part)."""
    assert task.status.state == INPUT_REQUIRED, task.status
    event = json_format.MessageToDict(task.status.message.parts[0].data)
    assert event["type"] == "approval.requested"
    data: dict[str, Any] = event["data"]
    return data


async def test_a_follow_up_message_decides_the_approval(start_server: ServerFactory) -> None:
    server = await start_server(command=APPROVAL_ADAPTER, require_approval=("deploy",))
    async with a2a_client(server, streaming=False) as client:
        (sent,) = await collect(client.send_message(message("prod")))
        approval = asked(sent.task)
        assert (approval["tool"], approval["arguments"]) == ("deploy", {"target": "prod"})
        decision = {"approvalId": approval["approvalId"], "decision": "approve"}
        (done,) = await collect(client.send_message(answer(sent.task, data=decision)))
        # The same task, gone on to its end: no new turn.
        assert done.task.id == sent.task.id and done.task.status.state == COMPLETED
        assert reply_of(done.task) == "deployed prod"
        session_id = sent.task.context_id
        turns = (await server.client.get(f"/v1/sessions/{session_id}/turns")).json()
        assert [t["status"] for t in turns] == ["completed"]
        [decided] = (await server.client.get(f"/v1/sessions/{session_id}/approvals")).json()
        assert decided["status"] == "approved"

        # A text reply, streamed: the task goes back to working, and on to its end.
        (sent,) = await collect(client.send_message(message("qa", session_id)))
        assert sent.task.status.state == INPUT_REQUIRED
    async with a2a_client(server) as client:
        responses = await collect(client.send_message(answer(sent.task, text=" No ")))
        first, last = responses[0], responses[-1]
        assert first.task.id == sent.task.id
        assert first.task.status.state == TaskState.TASK_STATE_WORKING
        assert last.status_update.status.state == COMPLETED
        final = await client.get_task(GetTaskRequest(id=sent.task.id))
        assert reply_of(final).startswith("not deployed")
        seqs = [
            json_format.MessageToDict(r.status_update.status.message.parts[0].data)["seq"]
            for r in responses[1:-1]
            if r.HasField("status_update")
        ]
        assert seqs == sorted(set(seqs))  # nothing twice
        assert "approval.resolved" in [
            json_format.MessageToDict(r.status_update.status.message.parts[0].data)["type"]
            for r in responses[1:-1]
            if r.HasField("status_update")
        ]


async def test_wrong_answers_are_jsonrpc_errors_naming_the_field(
    start_server: ServerFactory,
) -> None:
    server = await start_server(command=APPROVAL_ADAPTER, require_approval=("deploy",))
    async with a2a_client(server, streaming=False) as client:
        (sent,) = await collect(client.send_message(message("dev")))
        task = sent.task
        approval = asked(task)
        wrong: list[tuple[SendMessageRequest, str]] = [
            (answer(task, data={"approvalId": "ap_nope", "decision": "approve"}), "approvalId"),
            (answer(task, data={"approvalId": "x" * 5000, "decision": "approve"}), "approvalId"),
            (answer(task, data={"approvalId": approval["approvalId"]}), "data.decision"),
            (answer(task, data={"decision": "approve", "colour": 1}), "data.colour"),
            (answer(task, data={"decision": "deny", "arguments": {"a": 1}}), "arguments"),
            (answer(task, text="maybe"), "params.message.parts"),
        ]
        for request, field in wrong:
            with pytest.raises(A2AError, match=field):
                await collect(client.send_message(request))
        # None of them decided anything: the task still waits, and is answered once.
        got = await client.get_task(GetTaskRequest(id=task.id))
        assert asked(got)["approvalId"] == approval["approvalId"]
        (done,) = await collect(client.send_message(answer(task, text="yes")))
        assert done.task.status.state == COMPLETED
        with pytest.raises(A2AError, match="not input-required"):
            await collect(client.send_message(answer(task, data={"decision": "approve"})))
        # Raw: the error is -32602, answered 200.
        request = json_format.MessageToDict(answer(task, data={"decision": "approve"}))
        body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": request}
        (sent,) = await collect(client.send_message(message("dev2", task.context_id)))
        body["params"]["message"]["taskId"] = sent.task.id
        body["params"]["message"]["parts"][0]["data"]["approvalId"] = "ap_other"
        resp = await server.client.post("/a2a", json=body)
        assert resp.status_code == 200
        error = resp.json()["error"]
        assert error["code"] == -32602 and "approvalId" in error["message"], error
        await client.cancel_task(CancelTaskRequest(id=sent.task.id))


async def test_another_tenants_task_is_not_found(start_server: ServerFactory) -> None:
    server = await start_server(
        command=APPROVAL_ADAPTER, require_approval=("deploy",), keys=two_tenants()
    )
    async with a2a_client(server, streaming=False, key=KEY_A) as alpha:
        (sent,) = await collect(alpha.send_message(message("prod")))
        approval = asked(sent.task)
    async with a2a_client(server, streaming=False, key=KEY_B) as beta:
        decision = {"approvalId": approval["approvalId"], "decision": "approve"}
        with pytest.raises(A2AError, match="not found"):
            await collect(beta.send_message(answer(sent.task, data=decision)))
        with pytest.raises(A2AError, match="not found"):
            await collect(beta.send_message(answer(sent.task, text="yes")))
    path = f"/v1/sessions/{sent.task.context_id}/approvals"
    [pending] = (await server.client.get(path, headers=auth(KEY_A))).json()
    assert pending["status"] == "pending"
    async with a2a_client(server, streaming=False, key=KEY_A) as alpha:
        (done,) = await collect(alpha.send_message(answer(sent.task, text="yes")))
        assert done.task.status.state == COMPLETED
    [decided] = (await server.client.get(path, headers=auth(KEY_A))).json()
    assert decided["status"] == "approved" and decided["decidedBy"].startswith("alpha/sha256:")
