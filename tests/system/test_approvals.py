"""Tool approvals (issue 28) through a real ``trioserve run``, the built-in openai runtime,
the fake model server on 127.0.0.1 and the real MCP server of ``helpers/mcp_tools.py``."""

from __future__ import annotations

import hashlib
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.helpers import CLIServer, start_cli_server
from tests.helpers.fake_openai import fake_model
from tests.helpers.keys import KEY_A, KEY_B, auth, key_line
from tests.helpers.openai_runtime import (
    mcp_pids,
    new_session,
    of_type,
    reply_text,
    serve,
    write_openai_spec,
)
from tests.helpers.procs import children, pid_alive
from tests.helpers.sse import Frame, parse_sse
from trioserve.client import Client, SyncClient


async def pending(url: str, session_id: str, *, within: float = 180) -> dict[str, Any]:
    """The session's first pending approval, once there is one."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        with trio.fail_after(within):
            while True:
                resp = await client.get(f"/v1/sessions/{session_id}/approvals")
                assert resp.status_code == 200, resp.text
                found = [a for a in resp.json() if a["status"] == "pending"]
                if found:
                    first: dict[str, Any] = found[0]
                    return first
                await trio.sleep(0.05)


async def streamed_turn(url: str, session_id: str, text: str, frames: list[Frame]) -> None:
    """Run a turn with its stream open to the end, its frames (heartbeats too) in ``frames``."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        body = {"input": text}
        async with client.stream("POST", f"/v1/sessions/{session_id}/turns", json=body) as resp:
            assert resp.status_code == 200
            buffer = ""
            async for chunk in resp.aiter_text():
                buffer += chunk
                *blocks, buffer = buffer.split("\n\n")
                for block in blocks:
                    parsed = parse_sse(block + "\n\n")
                    frames.append(parsed[0] if parsed else Frame("comment", {}))


async def decide(
    url: str, session_id: str, approval_id: str, body: dict[str, Any]
) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        return await client.post(f"/v1/sessions/{session_id}/approvals/{approval_id}", json=body)


async def test_an_approved_call_runs_after_the_turn_waited_with_its_stream_open(
    nursery: trio.Nursery, tmp_path: Path, launched: list[CLIServer]
) -> None:
    spec = write_openai_spec(tmp_path, options={"requireApproval": "ad*"})
    async with fake_model() as model:
        model.auto_tools = {"add": {"a": 2, "b": 40}}
        server = await serve(nursery, tmp_path, spec, model, launched, "--heartbeat", "1s")
        session_id = await new_session(server.url)
        frames: list[Frame] = []
        done = trio.Event()

        async def run() -> None:
            await streamed_turn(server.url, session_id, "What is 2 + 40?", frames)
            done.set()

        nursery.start_soon(run)
        approval = await pending(server.url, session_id)
        assert (approval["tool"], approval["arguments"]) == ("add", {"a": 2, "b": 40})
        assert "state" not in approval
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            turn = (
                await client.get(f"/v1/sessions/{session_id}/turns/{approval['turnId']}")
            ).json()
        assert turn["status"] == "waiting"
        with trio.fail_after(180):  # the stream stays open: heartbeats while it waits
            while not any(f.event == "comment" for f in frames):
                await trio.sleep(0.05)
        assert len(model.requests) == 1  # nothing ran: the tool waits
        resp = await decide(server.url, session_id, approval["approvalId"], {"decision": "approve"})
        assert resp.status_code == 200, resp.text
        assert resp.json()["status"] == "approved"
        with trio.fail_after(180):
            await done.wait()
        again = await decide(server.url, session_id, approval["approvalId"], {"decision": "deny"})
        assert again.status_code == 409, again.text
        assert again.json()["error"]["reason"] == "approval_decided"
        unknown = await decide(server.url, session_id, "ap_nope", {"decision": "deny"})
        assert unknown.status_code == 404

    kinds = [f.event for f in frames if f.event != "comment"]
    assert kinds.count("session.ended") == 1 and kinds[-1] == "session.ended", kinds
    requested = of_type(frames, "approval.requested")
    assert requested[0]["approvalId"] == approval["approvalId"]
    assert requested[0]["expiresAt"] and requested[0]["tool"] == "add"
    resolved = of_type(frames, "approval.resolved")
    assert resolved[0]["decision"] == "approve"
    assert of_type(frames, "tool.result")[0]["content"] == "42"
    assert reply_text(frames) == "The tools said: 42."
    assert of_type(frames, "session.ended")[0]["reason"] == "completed"
    seqs = [f.seq for f in frames if f.id is not None]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # one log, no gap


async def detached_turn(url: str, session_id: str, text: str, **headers: str) -> str:
    async with httpx.AsyncClient(base_url=url, timeout=30, headers=headers) as client:
        resp = await client.post(
            f"/v1/sessions/{session_id}/turns", json={"input": text, "detach": True}
        )
        assert resp.status_code == 202, resp.text
        turn_id: str = resp.json()["id"]
        return turn_id


async def turn_ended(url: str, session_id: str, turn_id: str, **headers: str) -> list[Frame]:
    """The turn's logged events once it has ended (read through the event log)."""
    async with httpx.AsyncClient(base_url=url, timeout=120, headers=headers) as client:
        resp = await client.get(f"/v1/sessions/{session_id}/events", params={"turn": turn_id})
        assert resp.status_code == 200, resp.text
    frames = parse_sse(resp.text)
    assert frames and frames[-1].event == "session.ended", frames
    return frames


async def running_turns(url: str) -> float:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        text = (await client.get("/metrics")).text
    line = next(x for x in text.splitlines() if x.startswith("trioserve_running_turns "))
    return float(line.split()[1])


async def test_a_denied_call_is_told_to_the_model_and_a_waiting_turn_holds_nothing(
    nursery: trio.Nursery, tmp_path: Path, launched: list[CLIServer]
) -> None:
    spec = write_openai_spec(tmp_path, options={"requireApproval": "add"})
    async with fake_model() as model:
        model.auto_tools = {"add": {"a": 1, "b": 1}}
        # Exec'd adapters, so that each turn's is a child named for it (a fork server, the
        # default, would be one too, for the server's life).
        flags = ("--max-concurrent-turns", "1", "--fork-server", "off")
        server = await serve(nursery, tmp_path, spec, model, launched, *flags)
        first = await new_session(server.url)
        turn_id = await detached_turn(server.url, first, "add 1 and 1")
        approval = await pending(server.url, first)
        # Waiting: no adapter process, no MCP server, no turn slot.
        with trio.fail_after(180):
            while children(server.proc.pid, b"openai_adapter") or any(
                pid_alive(p) for p in mcp_pids(tmp_path)
            ):
                await trio.sleep(0.05)
        assert mcp_pids(tmp_path)  # one ran, and is gone
        assert await running_turns(server.url) == 0
        # the only turn slot is free: another session's turn runs to its end meanwhile
        model.auto_tools = {}
        other = await new_session(server.url)
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            resp = await client.post(f"/v1/sessions/{other}/turns", json={"input": "hi"})
            assert resp.status_code == 200
            assert parse_sse(resp.text)[-1].data["data"]["reason"] == "completed"
            # the waiting session is busy: multitask reject is a 409
            busy = await client.post(f"/v1/sessions/{first}/turns", json={"input": "again"})
            assert busy.status_code == 409, busy.text
        body = {"decision": "deny", "message": "not today"}
        resp = await decide(server.url, first, approval["approvalId"], body)
        assert resp.status_code == 200, resp.text
        frames = await turn_ended(server.url, first, turn_id)
        last = model.requests[-1].messages

    assert of_type(frames, "approval.resolved")[0]["decision"] == "deny"
    result = of_type(frames, "tool.result")[0]
    assert result["isError"] is True and result["error"]["reason"] == "approval_denied"
    assert last[-1]["role"] == "tool" and "denied" in last[-1]["content"]
    assert "not today" in last[-1]["content"]
    assert of_type(frames, "session.ended")[0]["reason"] == "completed"


async def test_a_waiting_turn_survives_kill_9_and_is_approved_after_the_restart(
    nursery: trio.Nursery, tmp_path: Path, launched: list[CLIServer]
) -> None:
    spec = write_openai_spec(tmp_path, options={"requireApproval": "shout"})
    store = f"sqlite:{tmp_path / 'sessions.db'}"
    async with fake_model() as model:
        model.auto_tools = {"shout": {"text": "hello"}}
        env = {"OPENAI_BASE_URL": model.url}
        first = await start_cli_server(nursery, tmp_path, spec, "--store", store, env=env)
        launched.append(first)
        session_id = await new_session(first.url)
        turn_id = await detached_turn(first.url, session_id, "shout hello")
        approval = await pending(first.url, session_id)
        first.signal(signal.SIGKILL)
        await first.wait()
        second = await start_cli_server(nursery, tmp_path, spec, "--store", store, env=env)
        launched.append(second)
        async with httpx.AsyncClient(base_url=second.url, timeout=30) as client:
            turn = (await client.get(f"/v1/sessions/{session_id}/turns/{turn_id}")).json()
        assert turn["status"] == "waiting"  # not interrupted by the restart
        assert (await pending(second.url, session_id))["approvalId"] == approval["approvalId"]
        resp = await decide(second.url, session_id, approval["approvalId"], {"decision": "approve"})
        assert resp.status_code == 200, resp.text
        frames = await turn_ended(second.url, session_id, turn_id)

    assert of_type(frames, "tool.result")[0]["content"] == "HELLO"
    assert reply_text(frames) == "The tools said: HELLO."
    assert of_type(frames, "session.ended")[0]["reason"] == "completed"


async def test_an_unanswered_approval_expires_denied(
    nursery: trio.Nursery, tmp_path: Path, launched: list[CLIServer]
) -> None:
    spec = write_openai_spec(tmp_path)
    async with fake_model() as model:
        model.auto_tools = {"add": {"a": 1, "b": 2}}
        server = await serve(
            nursery,
            tmp_path,
            spec,
            model,
            launched,
            "--require-approval",
            "add,shout",
            "--approval-timeout",
            "1s",
        )
        session_id = await new_session(server.url)
        turn_id = await detached_turn(server.url, session_id, "1 + 2")
        frames = await turn_ended(server.url, session_id, turn_id)
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            listed = (await client.get(f"/v1/sessions/{session_id}/approvals")).json()
        last = model.requests[-1].messages

    assert [(a["status"], a["reason"]) for a in listed] == [("denied", "expired")]
    resolved = of_type(frames, "approval.resolved")[0]
    assert (resolved["decision"], resolved["reason"], resolved["decidedBy"]) == (
        "deny",
        "expired",
        None,
    )
    assert "nobody decided in time" in last[-1]["content"]


APPROVAL_ADAPTER = Path(__file__).parents[1] / "helpers" / "approval_adapter.py"


def write_exec_spec(directory: Path) -> Path:
    command = json.dumps([sys.executable, str(APPROVAL_ADAPTER)])
    path = directory / "deployer.yaml"
    path.write_text(
        "apiVersion: agent-controller.dev/v1alpha1\nkind: Agent\n"
        "metadata:\n  name: deployer\n"
        "spec:\n  model:\n    provider: anthropic\n    name: none\n  task: staging\n  tools: []\n"
        f"  runtime:\n    type: exec\n    command: {command}\n"
        '    options: {requireApproval: "dep*"}\n'
    )
    return path


async def test_the_wire_extension_in_an_exec_adapter_and_tenants_apart(
    nursery: trio.Nursery, tmp_path: Path, launched: list[CLIServer]
) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text(f"{key_line(KEY_A, 'alpha')}\n{key_line(KEY_B, 'beta')}\n")
    pids = tmp_path / "adapter.pids"
    server = await start_cli_server(
        nursery,
        tmp_path,
        write_exec_spec(tmp_path),
        "--in-memory",
        "--api-keys",
        str(keys),
        env={"APPROVAL_ADAPTER_PIDS": str(pids)},
    )
    launched.append(server)
    alpha, beta = auth(KEY_A), auth(KEY_B)
    async with httpx.AsyncClient(base_url=server.url, timeout=30, headers=alpha) as client:
        session_id = (await client.post("/v1/sessions", json={})).json()["id"]
        turn_id = await detached_turn(server.url, session_id, "prod", **alpha)
        with trio.fail_after(180):
            while not (listed := (await client.get(f"/v1/sessions/{session_id}/approvals")).json()):
                await trio.sleep(0.05)
        approval = listed[0]
        assert (approval["tool"], approval["arguments"], approval["callId"]) == (
            "deploy",
            {"target": "prod"},
            "deploy-1",
        )
        path = f"/v1/sessions/{session_id}/approvals"
        async with httpx.AsyncClient(base_url=server.url, timeout=30, headers=beta) as other:
            assert (await other.get(path)).status_code == 404
            refused = await other.post(
                f"{path}/{approval['approvalId']}", json={"decision": "approve"}
            )
            assert refused.status_code == 404
        edited: dict[str, Any] = {"decision": "approve", "arguments": {"target": "canary"}}
        resp = await client.post(f"{path}/{approval['approvalId']}", json=edited)
        assert resp.status_code == 200, resp.text
        frames = await turn_ended(server.url, session_id, turn_id, **alpha)

    key_id = hashlib.sha256(KEY_A.encode()).hexdigest()[:16]
    resolved = of_type(frames, "approval.resolved")[0]
    assert resolved["decidedBy"] == f"alpha/sha256:{key_id}"
    assert KEY_A not in str(frames)
    assert of_type(frames, "tool.result")[-1]["content"] == "deployed canary"
    started = of_type(frames, "session.started")
    assert [s["resumed"] for s in started] == [False, True]  # two runs of one turn
    assert len(pids.read_text().split()) == 2
    kinds = [f.event for f in frames]
    assert kinds.count("session.ended") == 1 and "waiting" not in str(frames[-1].data)


async def test_the_python_clients_and_trioserve_chat_decide(
    nursery: trio.Nursery, tmp_path: Path, launched: list[CLIServer]
) -> None:
    server = await start_cli_server(nursery, tmp_path, write_exec_spec(tmp_path), "--in-memory")
    launched.append(server)
    async with Client(server.url) as client:
        session = await client.create_session()
        turn = await client.detach(session.id, "prod")
        with trio.fail_after(180):
            while not (found := await client.approvals(session.id)):
                await trio.sleep(0.05)
        assert found[0].pending and found[0].tool == "deploy"
        decided = await client.deny(session.id, found[0].id, message="freeze")
        assert (decided.status, decided.decided_by) == ("denied", None)
        frames = await turn_ended(server.url, session.id, turn.id)
        assert of_type(frames, "tool.result")[0]["content"] == "not deployed: denied: freeze"

        second = await client.detach(session.id, "staging")

        def approve_in_thread() -> str:
            with SyncClient(server.url) as sync:
                while not (waiting := [a for a in sync.approvals(session.id) if a.pending]):
                    time.sleep(0.05)
                return sync.approve(session.id, waiting[0].id, arguments={"target": "qa"}).status

        with trio.fail_after(180):
            assert await trio.to_thread.run_sync(approve_in_thread) == "approved"
        frames = await turn_ended(server.url, session.id, second.id)
        assert of_type(frames, "tool.result")[-1]["content"] == "deployed qa"

    for answer, expected in (("y", "deployed prod"), ("n", "not deployed: denied: denied in chat")):
        with trio.fail_after(120):
            done = await trio.run_process(
                [sys.executable, "-m", "trioserve", "chat", server.url],
                stdin=f"prod\n{answer}\n".encode(),
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        out, err = done.stdout.decode(), done.stderr.decode()
        assert done.returncode == 0, err
        assert 'approve deploy {"target": "prod"}? [y/N]' in err
        assert expected in out, out


async def test_a_turn_parked_on_one_replica_continues_on_another_after_kill_9(
    nursery: trio.Nursery, tmp_path: Path, store_url: str, launched: list[CLIServer]
) -> None:
    spec = write_openai_spec(tmp_path, options={"requireApproval": "add"})
    async with fake_model() as model:
        model.auto_tools = {"add": {"a": 20, "b": 22}}
        env = {"OPENAI_BASE_URL": model.url}
        args = ("--store", store_url, "--turn-lease", "2s")
        a = await start_cli_server(nursery, tmp_path, spec, *args, env=env)
        b = await start_cli_server(nursery, tmp_path, spec, *args, env=env)
        launched.extend([a, b])
        session_id = await new_session(a.url)
        turn_id = await detached_turn(a.url, session_id, "20 + 22?")
        approval = await pending(b.url, session_id)  # B sees A's waiting turn
        a.signal(signal.SIGKILL)
        await a.wait()
        await trio.sleep(3)  # past A's lease: nothing of the waiting turn is closed
        async with httpx.AsyncClient(base_url=b.url, timeout=30) as client:
            record = (await client.get(f"/v1/sessions/{session_id}/turns/{turn_id}")).json()
        assert record["status"] == "waiting"
        resp = await decide(b.url, session_id, approval["approvalId"], {"decision": "approve"})
        assert resp.status_code == 200, resp.text
        frames = await turn_ended(b.url, session_id, turn_id)

    assert of_type(frames, "tool.result")[0]["content"] == "42"
    assert of_type(frames, "session.ended")[0]["reason"] == "completed"
    assert [f.event for f in frames].count("session.ended") == 1


async def test_an_interrupting_turn_denies_and_cancels_the_waiting_one(
    nursery: trio.Nursery, tmp_path: Path, launched: list[CLIServer]
) -> None:
    server = await start_cli_server(nursery, tmp_path, write_exec_spec(tmp_path), "--in-memory")
    launched.append(server)
    session_id = await new_session(server.url)
    waiting = await detached_turn(server.url, session_id, "prod")
    approval = await pending(server.url, session_id)
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        queued = await client.post(
            f"/v1/sessions/{session_id}/turns",
            json={"input": "staging", "multitask": "enqueue", "detach": True},
        )
        assert queued.status_code == 202, queued.text
        body = {"input": "qa", "multitask": "interrupt", "detach": True}
        resp = await client.post(f"/v1/sessions/{session_id}/turns", json=body)
        assert resp.status_code == 202, resp.text
        frames = await turn_ended(server.url, session_id, waiting)
        record = (await client.get(f"/v1/sessions/{session_id}/turns/{waiting}")).json()
        with trio.fail_after(180):  # the interrupting turn asks for its own approval
            while (
                len(listed := (await client.get(f"/v1/sessions/{session_id}/approvals")).json()) < 2
            ):
                await trio.sleep(0.05)
    assert (record["status"], record["reason"]) == ("cancelled", "interrupted")
    assert (listed[0]["approvalId"], listed[0]["status"], listed[0]["reason"]) == (
        approval["approvalId"],
        "denied",
        "interrupted",
    )
    assert of_type(frames, "approval.resolved")[0]["reason"] == "interrupted"
    assert of_type(frames, "session.ended")[0]["reason"] == "cancelled"
    # the interrupting turn asked for its own approval: it waits now, the queued one behind it
    assert len([a for a in listed if a["status"] == "pending"]) == 1
