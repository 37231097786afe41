"""``trioserve run --fork-server auto`` as an operator runs it: who owns the forked turns.

The echo adapter is forked for each turn; the turn's process is the
server's own child (not the fork server's), and neither it nor the fork
server outlives the server: drained, or killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trio

from tests.helpers import (
    FIXTURES,
    CLIServer,
    children,
    pid_alive,
    run_cli,
    start_cli_server,
    wait_gone,
)
from tests.helpers.fake_openai import fake_model, tool_script
from tests.helpers.openai_runtime import (
    new_session,
    of_type,
    reply_text,
    serve,
    turn,
    write_openai_spec,
)

FORK_SERVER = b"trioserve.runtime.forkserver"


def slow_echo_spec(directory: Path, delay_ms: int = 200) -> Path:
    """The echo agent, one character every ``delay_ms``: a turn that runs until stopped."""
    path = directory / "echo.yaml"
    path.write_text(
        "apiVersion: agent-controller.dev/v1alpha1\n"
        "kind: Agent\n"
        "metadata:\n  name: slow-echo\n"
        "spec:\n"
        "  model:\n    provider: anthropic\n    name: claude-sonnet-4-20250514\n"
        "  task: Say hello.\n"
        "  tools: []\n"
        f"  runtime:\n    type: echo\n    options:\n      chunkSize: 1\n      delayMs: {delay_ms}\n"
    )
    return path


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


async def first_pid(lines: AsyncIterator[str]) -> int:
    async for line in lines:
        if line.startswith("data: ") and "session.started" in line:
            return int(json.loads(line[6:])["data"]["pid"])
    raise AssertionError("stream ended before session.started")


async def test_kill_9_of_the_server_leaves_no_forked_turn(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    server = await start_cli_server(
        nursery, tmp_path, slow_echo_spec(tmp_path), "--in-memory", "--fork-server", "auto"
    )
    assert "fork server" in server.startup_line
    (fork_server,) = children(server.proc.pid, FORK_SERVER)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        sid = (await client.post("/v1/sessions")).json()["id"]
        request = client.stream("POST", f"/v1/sessions/{sid}/turns", json={"input": "x" * 200})
        async with request as resp:
            lines = resp.aiter_lines()
            pid = await first_pid(lines)
            assert parent_of(pid) == server.proc.pid  # the server's own child
            assert os.getpgid(pid) == pid  # in its own group
            server.signal(signal.SIGKILL)
            await server.wait()
    await wait_gone(pid)
    await wait_gone(fork_server)


async def test_drain_stops_a_forked_turn_and_the_fork_server(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    server = await start_cli_server(
        nursery,
        tmp_path,
        slow_echo_spec(tmp_path),
        "--in-memory",  # and no --fork-server: auto is the default
        "--shutdown-grace",
        "0.5s",
    )
    (fork_server,) = children(server.proc.pid, FORK_SERVER)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        sid = (await client.post("/v1/sessions")).json()["id"]
        request = client.stream("POST", f"/v1/sessions/{sid}/turns", json={"input": "x" * 200})
        async with request as resp:
            lines = resp.aiter_lines()
            pid = await first_pid(lines)
            server.signal(signal.SIGTERM)
            tail = [line async for line in lines if line.startswith("data: ")]
    assert await server.wait() == 0
    assert not pid_alive(pid) and not pid_alive(fork_server)
    assert '"reason":"cancelled"' in tail[-1]
    assert "adapter=fork" in server.log


async def test_a_killed_fork_server_is_replaced_and_turns_go_on(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    server = await start_cli_server(
        nursery, tmp_path, slow_echo_spec(tmp_path, 5), "--in-memory", "--fork-server", "auto"
    )
    (first,) = children(server.proc.pid, FORK_SERVER)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        sid = (await client.post("/v1/sessions")).json()["id"]
        async with client.stream("POST", f"/v1/sessions/{sid}/turns", json={"input": "ab"}) as resp:
            lines = resp.aiter_lines()
            await first_pid(lines)
            os.kill(first, signal.SIGKILL)  # mid-turn: the turn's process is not its child
            tail = [line async for line in lines if line.startswith("data: ")]
        assert '"reason":"completed"' in tail[-1]
        with trio.fail_after(30):
            while not (now := children(server.proc.pid, FORK_SERVER) - {first}):
                await trio.sleep(0.02)
        (second,) = now
        resp = await client.post(f"/v1/sessions/{sid}/turns", json={"input": "c"})
        assert resp.status_code == 200 and '"reason":"completed"' in resp.text
        ready = (await client.get("/readyz", headers={"Accept": "application/json"})).json()
        fork = ready["forkServer"]
        assert (fork["state"], fork["restarts"], fork["forks"]) == ("ready", 1, 2), fork
        assert ready["warmAdapters"]["target"] == 0  # no pool beside it
        metrics = (await client.get("/metrics")).text
        for line in (
            "trioserve_fork_server_up 1.0",
            "trioserve_fork_server_forks_total 2.0",
            "trioserve_fork_server_restarts_total 1.0",
        ):
            assert line in metrics.splitlines(), line
    server.signal(signal.SIGTERM)
    assert await server.wait() == 0
    await wait_gone(second)
    assert "fork server pid" in server.log and "exited" in server.log


async def test_the_openai_runtime_forked_with_its_mcp_tools(
    nursery: trio.Nursery, tmp_path: Path, launched: list[CLIServer]
) -> None:
    """The model runtime forked (its MCP client preloaded): a tool round trip, memory of the
    turn before, as exec'd turns have them."""
    spec = write_openai_spec(tmp_path)
    async with fake_model() as model:
        server = await serve(nursery, tmp_path, spec, model, launched, "--fork-server", "auto")
        assert "fork server" in server.startup_line
        (fork_server,) = children(server.proc.pid, FORK_SERVER)
        session = await new_session(server.url)
        model.queue(tool_script(("call_1", "add", {"a": 2, "b": 40})))
        frames = await turn(server.url, session, "What is 2 + 40?")
        assert reply_text(frames) == "The tools said: 42."
        assert of_type(frames, "tool.result")[0]["content"] == "42"
        frames = await turn(server.url, session, "And again?")
        assert reply_text(frames).startswith('Reply 2: you said "And again?"')
    with trio.fail_after(30):
        while server.log.count("adapter=fork") < 2:
            await trio.sleep(0.05)
    assert pid_alive(fork_server)


def python_spec(directory: Path, module: str) -> Path:
    """An agent whose adapter is a Python function (``runtime.type: python``)."""
    path = directory / "python.yaml"
    path.write_text(
        "apiVersion: agent-controller.dev/v1alpha1\n"
        "kind: Agent\n"
        "metadata:\n  name: module-agent\n"
        "spec:\n"
        "  model:\n    provider: anthropic\n    name: claude-sonnet-4-20250514\n"
        "  task: report\n"
        "  tools: []\n"
        f"  runtime:\n    type: python\n    module: {module}\n"
    )
    return path


@pytest.mark.parametrize("mode", ["auto", "off"])
async def test_a_python_module_adapter_forked_or_exec_d(
    nursery: trio.Nursery, tmp_path: Path, launched: list[CLIServer], mode: str
) -> None:
    spec = python_spec(tmp_path, "forked_adapter:main")
    env = {"PYTHONPATH": str(FIXTURES / "adapters")}
    server = await start_cli_server(
        nursery, tmp_path, spec, "--in-memory", "--fork-server", mode, env=env
    )
    launched.append(server)
    session = await new_session(server.url)
    reports = []
    for _ in range(2):
        frames = await turn(server.url, session, "report")
        (report,) = [d["report"] for d in of_type(frames, "message")]
        reports.append(report)
    for report in reports:
        assert report["turns"] == 1 and report["fds"] == [] and report["sigint"]
        assert report["ppid"] == server.proc.pid and report["pgid"] == report["pid"]
        assert report["cwd"] == str(tmp_path)
    assert reports[0]["random"] != reports[1]["random"]
    path = "fork" if mode == "auto" else "cold"
    with trio.fail_after(30):
        while server.log.count(f"adapter={path}") < 2:
            await trio.sleep(0.05)


def test_a_module_that_does_not_import_fails_the_start(tmp_path: Path) -> None:
    spec = python_spec(tmp_path, "no_such_adapter:main")
    done = run_cli(
        tmp_path,
        "run",
        str(spec),
        "--port",
        "0",
        "--in-memory",
        "--fork-server",
        "auto",
        env={"PYTHONPATH": str(FIXTURES / "adapters")},
    )
    assert done.returncode == 1, done.stderr
    (line,) = [li for li in done.stderr.splitlines() if "no_such_adapter" in li]
    assert "cannot import no_such_adapter: ModuleNotFoundError" in line
    assert "Traceback" not in done.stderr
