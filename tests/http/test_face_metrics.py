"""The turn metrics say which face started each turn (``protocol``: api, mcp, ag-ui, a2a)."""

from __future__ import annotations

import trio

from tests.helpers import ServerFactory
from tests.http.test_mcp import mcp_client
from tests.observe.test_observe import samples, value


async def test_each_faces_turns_are_counted_under_its_protocol(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    # The v0.8 API.
    sid = (await server.create())["id"]
    resp = await server.client.post(f"/v1/sessions/{sid}/turns", json={"input": "one"})
    assert resp.status_code == 200
    # MCP: a tool call.
    async with mcp_client(server) as client:
        result = await client.call_tool("test-agent", {"message": "two"})
        assert not result.is_error
    # AG-UI: a run.
    run = {
        "threadId": "th",
        "runId": "r1",
        "messages": [{"id": "m", "role": "user", "content": "3"}],
    }
    resp = await server.client.post("/ag-ui", json=run, timeout=60)
    assert resp.status_code == 200 and "RUN_FINISHED" in resp.text
    # A2A: a blocking send, two of them.
    for n in range(2):
        said = {"messageId": f"m{n}", "role": "ROLE_USER", "parts": [{"text": "four"}]}
        body = {"jsonrpc": "2.0", "id": n, "method": "SendMessage", "params": {"message": said}}
        resp = await server.client.post("/a2a", json=body, timeout=60)
        assert resp.json()["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"

    expected = {"api": 1, "mcp": 1, "ag-ui": 1, "a2a": 2}
    with trio.fail_after(30):  # a turn is counted as ended right after its stream ends
        while True:
            found = samples((await server.client.get("/metrics")).text)
            ended = {
                name: value(
                    found,
                    "trioserve_turns_ended_total",
                    status="completed",
                    reason="completed",
                    protocol=name,
                )
                for name in expected
            }
            if ended == expected:
                break
            await trio.sleep(0.05)
    started = {
        name: value(found, "trioserve_turns_started_total", protocol=name) for name in expected
    }
    assert started == expected
