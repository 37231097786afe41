"""MCP elicitation: a call whose turn waits for an approval asks its client to decide it.

The ``mcp`` SDK's own client (handshake era, with an ``elicitation_callback``)
against a real server on 127.0.0.1 whose adapter
(tests/helpers/approval_adapter.py) asks before its ``deploy`` tool runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import mcp_types as types
import trio
from mcp import Client
from mcp.client.session import ClientRequestContext, ElicitationFnT
from mcp.client.streamable_http import streamable_http_client

from tests.helpers import APPROVAL_ADAPTER, Server, ServerFactory


@asynccontextmanager
async def mcp_client(server: Server, elicit: ElicitationFnT | None) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(timeout=120) as http:
        transport = streamable_http_client(f"{server.url}/mcp", http_client=http)
        async with Client(transport, mode="legacy", elicitation_callback=elicit) as client:
            yield client


class Person:
    """Answers each question as told; keeps the questions."""

    def __init__(self, *answers: types.ElicitResult) -> None:
        self.answers = list(answers)
        self.asked: list[types.ElicitRequestParams] = []

    async def __call__(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        self.asked.append(params)
        return self.answers.pop(0)


async def approvals(server: Server, session_id: str) -> list[dict[str, Any]]:
    resp = await server.client.get(f"/v1/sessions/{session_id}/approvals")
    assert resp.status_code == 200, resp.text
    found: list[dict[str, Any]] = resp.json()
    return found


async def test_a_waiting_call_asks_its_client(start_server: ServerFactory) -> None:
    server = await start_server(command=APPROVAL_ADAPTER, require_approval=("deploy",))
    person = Person(
        types.ElicitResult(action="accept", content={"approve": True}),
        types.ElicitResult(action="accept", content={"approve": False, "message": "not today"}),
        types.ElicitResult(action="decline"),
    )
    async with mcp_client(server, person) as client:
        result = await client.call_tool("test-agent", {"message": "prod"})
        out = result.structured_content
        assert out is not None and out["status"] == "completed", out
        assert out["reply"] == "deployed prod"
        [question] = person.asked
        assert isinstance(question, types.ElicitRequestFormParams)
        assert "deploy" in question.message and '"prod"' in question.message
        assert question.requested_schema["required"] == ["approve"]
        sid = out["sessionId"]
        [decided] = await approvals(server, sid)
        assert (decided["status"], decided["decidedBy"]) == ("approved", "mcp")

        denied = await client.call_tool("test-agent", {"message": "qa", "sessionId": sid})
        assert denied.structured_content is not None
        assert denied.structured_content["reply"] == "not deployed: denied: not today"
        declined = await client.call_tool("test-agent", {"message": "dev", "sessionId": sid})
        assert declined.structured_content is not None
        assert declined.structured_content["reply"].startswith("not deployed")
        statuses = [a["status"] for a in await approvals(server, sid)]
        assert statuses == ["approved", "denied", "denied"]


async def test_a_question_left_unanswered_is_withdrawn_once_decided_elsewhere(
    start_server: ServerFactory,
) -> None:
    server = await start_server(command=APPROVAL_ADAPTER, require_approval=("deploy",))
    asked = trio.Event()
    withdrawn = trio.Event()

    async def slow_person(
        context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        asked.set()
        try:
            await trio.sleep_forever()
        finally:
            withdrawn.set()

    results: list[types.CallToolResult] = []
    async with mcp_client(server, slow_person) as client:
        async with trio.open_nursery() as nursery:

            async def call() -> None:
                results.append(await client.call_tool("test-agent", {"message": "prod"}))

            nursery.start_soon(call)
            with trio.fail_after(60):
                await asked.wait()
            [session] = (await server.client.get("/v1/sessions")).json()
            [pending] = await approvals(server, session["id"])
            path = f"/v1/sessions/{session['id']}/approvals/{pending['approvalId']}"
            resp = await server.client.post(path, json={"decision": "approve"})
            assert resp.status_code == 200, resp.text
        [result] = results
        assert result.structured_content is not None
        assert result.structured_content["reply"] == "deployed prod"
        with trio.fail_after(30):  # the server withdrew its question (the client is open)
            await withdrawn.wait()


async def test_a_client_without_elicitation_is_not_asked(start_server: ServerFactory) -> None:
    server = await start_server(command=APPROVAL_ADAPTER, require_approval=("deploy",))
    results: list[types.CallToolResult] = []
    async with mcp_client(server, None) as client, trio.open_nursery() as nursery:

        async def call() -> None:
            results.append(await client.call_tool("test-agent", {"message": "prod"}))

        nursery.start_soon(call)
        with trio.fail_after(60):
            while True:  # the turn waits: its approval is pending, and nobody was asked
                sessions = (await server.client.get("/v1/sessions")).json()
                found = await approvals(server, sessions[0]["id"]) if sessions else []
                if found:
                    break
                await trio.sleep(0.05)
        [pending] = found
        path = f"/v1/sessions/{sessions[0]['id']}/approvals/{pending['approvalId']}"
        resp = await server.client.post(path, json={"decision": "deny"})
        assert resp.status_code == 200, resp.text
    [result] = results
    assert result.structured_content is not None
    assert result.structured_content["reply"].startswith("not deployed")
