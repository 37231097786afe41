"""AG-UI: the next run's ``resume`` answers the interrupt of a turn waiting for an approval.

Runs posted to a real server on 127.0.0.1 whose adapter
(tests/helpers/approval_adapter.py) asks before its ``deploy`` tool runs;
every event parsed with the ``ag-ui-protocol`` package's models.
"""

from __future__ import annotations

from typing import Any

from ag_ui.core import EventType, RunAgentInput

from tests.helpers import APPROVAL_ADAPTER, KEY_A, KEY_B, Server, ServerFactory, auth, two_tenants
from tests.http.test_agui import joined, kinds, run, run_input


async def interrupted(
    server: Server, text: str, thread: str, run_id: str, headers: dict[str, str] | None = None
) -> tuple[str, str, int]:
    """Post a run that ends with an interrupt: its id, the turn's, and the last seq."""
    events, _ = await run(server, run_input(text, thread, run_id), headers)
    finished = events[-1]
    assert finished.outcome.type == "interrupt", finished
    (asked,) = finished.outcome.interrupts
    return asked.id, finished.result["turnId"], finished.result["lastSeq"]


def resumed(thread: str, run_id: str, *entries: dict[str, Any]) -> dict[str, Any]:
    body = run_input("ignored: the session remembers", thread, run_id)
    body["resume"] = list(entries)
    RunAgentInput.model_validate(body)  # the protocol's own shape
    return body


async def test_resume_answers_the_interrupt_and_streams_the_rest(
    start_server: ServerFactory,
) -> None:
    server = await start_server(command=APPROVAL_ADAPTER, require_approval=("deploy",))
    interrupt, turn_id, last_seq = await interrupted(server, "prod", "t-1", "r-1")
    entry = {"interruptId": interrupt, "status": "resolved", "payload": {"approved": True}}
    events, frames = await run(server, resumed("t-1", "r-2", entry))
    assert kinds(events)[0] == "RUN_STARTED" and events[0].run_id == "r-2"
    assert events[0].metadata["trioserve"]["turnId"] == turn_id  # no new turn: the same one
    assert EventType.TOOL_CALL_START in [e.type for e in events]
    assert joined(events) == "deployed prod"
    finished = events[-1]
    assert finished.type == EventType.RUN_FINISHED and finished.outcome.type == "success"
    assert (finished.result["turnId"], finished.result["status"]) == (turn_id, "completed")
    # The rest of the turn, once: its seqs run on from what the first run had seen.
    seqs = [int(f.id) for f in frames if f.id is not None]
    assert seqs == list(range(last_seq + 1, last_seq + 1 + len(seqs))), seqs
    raw = [e.event for e in events if e.type == EventType.RAW]
    assert raw[0]["type"] == "approval.resolved"
    assert raw[0]["data"]["decision"] == "approve"
    session_id = finished.result["sessionId"]
    turns = (await server.client.get(f"/v1/sessions/{session_id}/turns")).json()
    assert [t["status"] for t in turns] == ["completed"]

    # Cancelled: the approval is denied, the turn goes on to its end.
    interrupt, turn_id, _ = await interrupted(server, "qa", "t-1", "r-3")
    entry = {"interruptId": interrupt, "status": "cancelled"}
    events, _ = await run(server, resumed("t-1", "r-4", entry))
    assert joined(events).startswith("not deployed")
    assert events[-1].outcome.type == "success"

    # Edited arguments.
    interrupt, turn_id, _ = await interrupted(server, "dev", "t-1", "r-5")
    payload = {"approved": True, "editedArgs": {"target": "staging"}}
    entry = {"interruptId": interrupt, "status": "resolved", "payload": payload}
    events, _ = await run(server, resumed("t-1", "r-6", entry))
    assert joined(events) == "deployed staging"


async def test_a_bad_resume_is_a_400_naming_the_field(start_server: ServerFactory) -> None:
    server = await start_server(command=APPROVAL_ADAPTER, require_approval=("deploy",))
    interrupt, _, _ = await interrupted(server, "prod", "t-1", "r-1")

    def entry(payload: Any = None, **fields: Any) -> dict[str, Any]:
        made = {"interruptId": interrupt, "status": "resolved", "payload": payload}
        return made | fields

    cases: list[tuple[list[dict[str, Any]], str]] = [
        ([entry("maybe")], "resume[0].payload"),
        ([entry(None)], "resume[0].payload"),
        ([entry({"approved": "yes"})], "resume[0].payload.approved"),
        ([entry({"colour": 1})], "resume[0].payload.colour"),
        ([entry({"note": "x"})], "resume[0].payload.note"),
        ([entry({"approved": False, "editedArgs": {"a": 1}})], "resume[0].payload.editedArgs"),
        ([entry({"approved": True, "editedArgs": [1]})], "resume[0].payload.editedArgs"),
        ([entry(True, interruptId="ap_nope")], "resume[0].interruptId"),
        ([entry(True, interruptId="x" * 5000)], "resume[0].interruptId"),
        ([entry(True), entry(False)], "resume"),
        ([entry(True, status="later")], "resume"),
    ]
    for entries, field in cases:
        body = run_input("x", "t-1", "r-2")
        body["resume"] = entries
        resp = await server.client.post("/ag-ui", json=body)
        assert resp.status_code == 400, (entries, resp.status_code, resp.text)
        message = resp.json()["error"]["message"]
        assert field in message.replace(".0.", "[0].").replace("resume.0", "resume[0]"), message
    # Nothing was decided: the right answer still is.
    events, _ = await run(server, resumed("t-1", "r-3", entry(True)))
    assert joined(events) == "deployed prod"
    # Answered already: nothing waits.
    resp = await server.client.post("/ag-ui", json=resumed("t-1", "r-4", entry(True)))
    assert resp.status_code == 400 and "resume[0].interruptId" in resp.text


async def test_another_tenants_interrupt_is_not_theirs(start_server: ServerFactory) -> None:
    server = await start_server(
        command=APPROVAL_ADAPTER, require_approval=("deploy",), keys=two_tenants()
    )
    interrupt, _, _ = await interrupted(server, "prod", "t-1", "r-1", auth(KEY_A))
    body = resumed("t-1", "r-2", {"interruptId": interrupt, "status": "resolved", "payload": True})
    resp = await server.client.post("/ag-ui", json=body, headers=auth(KEY_B))
    assert resp.status_code == 400 and "resume[0].interruptId" in resp.text
    events, _ = await run(server, body, auth(KEY_A))
    assert joined(events) == "deployed prod"
