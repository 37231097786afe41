"""A2A push notification configs (issue 27): a task's configs are its turn's webhooks.

The ``a2a-sdk`` client, unmodified, against a real server; the POSTs go to
a real receiver on 127.0.0.1 (``tests.helpers.receiver``), whose own
Standard Webhooks check verifies them.  The configs live in the webhook
outbox, so the main story runs on each store backend.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import httpx
import pytest
import trio
from a2a.client import ClientConfig, create_client
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    ListTaskPushNotificationConfigsRequest,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import A2AError

from tests.helpers import (
    APPROVAL_ADAPTER,
    KEY_A,
    KEY_B,
    Receiver,
    Server,
    ServerFactory,
    script,
    two_tenants,
    verify,
)
from tests.http.test_a2a import a2a_client, collect, cut, message
from trioserve.sessions import WebhookSettings

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
HANG = script({"hang": True})


def settings(**changes: Any) -> WebhookSettings:
    base = WebhookSettings(secret=SECRET, allow=("127.0.0.1",), backoff=0.05, timeout=60.0)
    return replace(base, **changes)


async def started(server: Server, text: str, key: str | None = None) -> str:
    """A task started without waiting for it: its id."""
    async with a2a_client(server, key=key) as client:
        said = message(text)
        said.configuration.return_immediately = True
        stream = client.send_message(said)
        task = (await anext(stream)).task
        await cut(stream)
    return task.id


async def rpc(server: Server, method: str, params: Any) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    resp = await server.client.post("/a2a", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    answer: dict[str, Any] = resp.json()
    return answer


async def test_configs_are_set_listed_deleted_and_the_end_is_posted_signed(
    start_server: ServerFactory, nursery: trio.Nursery, backend_url: str
) -> None:
    receiver = Receiver()
    kept, dropped = await receiver.start(nursery) + "/kept", receiver.url + "/dropped"
    server = await start_server(webhooks=settings(), store=backend_url)
    card = (await server.client.get("/.well-known/agent-card.json")).json()
    assert card["capabilities"]["pushNotifications"] is True
    task_id = await started(server, HANG)
    async with a2a_client(server) as client:
        one = await client.create_task_push_notification_config(
            TaskPushNotificationConfig(task_id=task_id, url=kept, id="mine")
        )
        two = await client.create_task_push_notification_config(
            TaskPushNotificationConfig(task_id=task_id, url=dropped)
        )
        assert one.url == kept and one.task_id == task_id and one.id.startswith("msg_")
        listed = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=task_id)
        )
        assert sorted((c.id, c.url) for c in listed.configs) == sorted(
            [(one.id, kept), (two.id, dropped)]
        )
        got = await client.get_task_push_notification_config(
            GetTaskPushNotificationConfigRequest(task_id=task_id, id=one.id)
        )
        assert got == one
        await client.delete_task_push_notification_config(
            DeleteTaskPushNotificationConfigRequest(task_id=task_id, id=two.id)
        )
        with pytest.raises(A2AError, match="not found"):
            await client.get_task_push_notification_config(
                GetTaskPushNotificationConfigRequest(task_id=task_id, id=two.id)
            )
        with pytest.raises(A2AError, match="not found"):
            await client.delete_task_push_notification_config(
                DeleteTaskPushNotificationConfigRequest(task_id=task_id, id=two.id)
            )
        listed = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=task_id)
        )
        assert [c.id for c in listed.configs] == [one.id]
        assert receiver.requests == []  # nothing before the task's end
        await client.cancel_task(CancelTaskRequest(id=task_id))

    (got_post,) = await receiver.wait_for(1)
    verify(SECRET, got_post)
    assert got_post.path == "/kept" and got_post.headers["webhook-id"] == one.id
    body = got_post.json()
    sid, tid = task_id.split(".")
    assert body["type"] == "turn.ended" and body["sessionId"] == sid
    assert body["data"]["id"] == tid and body["data"]["status"] == "cancelled"
    with trio.fail_after(30):  # a hang guard: the delivered config leaves the outbox
        while await server.manager.store.pending_webhooks():
            await trio.sleep(0.02)
    assert len(receiver.requests) == 1  # the deleted config got nothing


async def test_send_message_configuration_and_a_config_on_an_ended_task(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    receiver = Receiver()
    url = await receiver.start(nursery) + "/send"
    server = await start_server(webhooks=settings())
    push = TaskPushNotificationConfig(url=url)
    async with httpx.AsyncClient(timeout=120) as http:
        config = ClientConfig(streaming=False, httpx_client=http, push_notification_config=push)
        client = await create_client(server.url, client_config=config)
        [response] = await collect(client.send_message(message("hello")))
    task = response.task
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    (first,) = await receiver.wait_for(1)
    verify(SECRET, first)
    assert first.path == "/send" and first.json()["data"]["status"] == "completed"
    assert first.json()["data"]["id"] == task.id.split(".")[1]
    # A config set on a task that has ended: its end is POSTed at once.
    async with a2a_client(server) as client:
        late = await client.create_task_push_notification_config(
            TaskPushNotificationConfig(task_id=task.id, url=receiver.url + "/late")
        )
    second = (await receiver.wait_for(2))[1]
    verify(SECRET, second)
    assert second.path == "/late" and second.headers["webhook-id"] == late.id
    assert second.json()["data"] == first.json()["data"]


async def test_a_task_waiting_for_an_approval_posts_turn_waiting_then_its_end(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    receiver = Receiver()
    url = await receiver.start(nursery) + "/waits"
    server = await start_server(
        command=APPROVAL_ADAPTER, require_approval=("deploy",), webhooks=settings()
    )
    push = TaskPushNotificationConfig(url=url)
    async with httpx.AsyncClient(timeout=120) as http:
        config = ClientConfig(streaming=False, httpx_client=http, push_notification_config=push)
        client = await create_client(server.url, client_config=config)
        [sent] = await collect(client.send_message(message("prod")))
        assert sent.task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        (waiting,) = await receiver.wait_for(1)
        verify(SECRET, waiting)
        body = waiting.json()
        assert body["type"] == "turn.waiting" and body["data"]["status"] == "waiting"
        assert body["approval"]["tool"] == "deploy"
        await client.cancel_task(CancelTaskRequest(id=sent.task.id))
    ended = (await receiver.wait_for(2))[1]
    verify(SECRET, ended)
    assert ended.json()["type"] == "turn.ended" and ended.json()["data"]["status"] == "cancelled"


async def test_a_private_address_is_refused_without_webhook_allow(
    start_server: ServerFactory,
) -> None:
    server = await start_server(webhooks=settings(allow=()))
    task_id = await started(server, HANG)
    url = "http://127.0.0.1:9/hook"
    answer = await rpc(server, "CreateTaskPushNotificationConfig", {"taskId": task_id, "url": url})
    assert answer["error"]["code"] == -32602
    assert answer["error"]["message"].startswith("params.url: ")
    assert "--webhook-allow" in answer["error"]["message"]
    said = {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}
    params = {"message": said, "configuration": {"taskPushNotificationConfig": {"url": url}}}
    answer = await rpc(server, "SendMessage", params)
    assert answer["error"]["code"] == -32602
    where = "params.configuration.taskPushNotificationConfig.url: "
    assert answer["error"]["message"].startswith(where)
    assert len((await server.client.get("/v1/sessions")).json()) == 1  # no turn was started
    await rpc(server, "CancelTask", {"id": task_id})


async def test_another_tenants_task_is_not_found(start_server: ServerFactory) -> None:
    server = await start_server(keys=two_tenants(), webhooks=settings())
    task_id = await started(server, HANG, key=KEY_A)
    async with a2a_client(server, key=KEY_B) as beta:
        with pytest.raises(A2AError, match="not found"):
            await beta.create_task_push_notification_config(
                TaskPushNotificationConfig(task_id=task_id, url="http://127.0.0.1:9/x")
            )
        with pytest.raises(A2AError, match="not found"):
            await beta.list_task_push_notification_configs(
                ListTaskPushNotificationConfigsRequest(task_id=task_id)
            )
    async with a2a_client(server, key=KEY_A) as alpha:
        await alpha.cancel_task(CancelTaskRequest(id=task_id))


async def test_hostile_push_params_get_jsonrpc_errors(start_server: ServerFactory) -> None:
    server = await start_server(webhooks=settings())
    task_id = await started(server, script({"end": "completed"}))
    url = "http://127.0.0.1:9/x"
    create = "CreateTaskPushNotificationConfig"
    cases: list[tuple[str, Any, int, str]] = [
        (create, [], -32602, "params:"),
        (create, {"taskId": 5}, -32602, "params:"),
        (create, {"taskId": task_id}, -32602, "params.url: required"),
        (create, {"taskId": task_id, "url": "ftp://x/y"}, -32602, "params.url:"),
        (create, {"taskId": task_id, "url": "x" * 5000}, -32602, "params.url:"),
        (create, {"taskId": task_id, "url": url, "token": "t"}, -32602, "params.token:"),
        (
            create,
            {"taskId": task_id, "url": url, "authentication": {"scheme": "Bearer"}},
            -32602,
            "params.authentication:",
        ),
        (create, {"taskId": "s_x.t_y", "url": url}, -32001, "not found"),
        (create, {"taskId": "x" * 5000, "url": url}, -32001, "not found"),
        ("GetTaskPushNotificationConfig", {"taskId": task_id, "id": "x"}, -32001, "not found"),
        ("ListTaskPushNotificationConfigs", {"taskId": "nope"}, -32001, "not found"),
        ("DeleteTaskPushNotificationConfig", {"taskId": task_id}, -32001, "not found"),
    ]
    for method, params, code, text in cases:
        answer = await rpc(server, method, params)
        assert answer["error"]["code"] == code, (method, params, answer)
        assert text in answer["error"]["message"], (method, params, answer)
    # Without a webhook secret webhooks are off: the card says so, the methods are -32003.
    plain = await start_server()
    card = (await plain.client.get("/.well-known/agent-card.json")).json()
    assert card["capabilities"].get("pushNotifications", False) is False
    answer = await rpc(plain, create, {"taskId": task_id, "url": url})
    assert answer["error"]["code"] == -32003
