"""``trioserve run`` as a process: startup, drain on SIGTERM, restart, hard stops."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import trio

from tests.helpers import pid_alive, run_cli, script, start_cli_server, wait_gone, write_spec


async def _first_pid(lines: AsyncIterator[str], marker: str = "session.started") -> int:
    """Read the stream up to the frame holding ``marker``; return the adapter's pid.

    ``lines`` must stay referenced by the caller: dropping the iterator would
    close the response, and the server would cancel the turn.
    """
    pid = None
    async for line in lines:
        if line.startswith("data: "):
            pid = pid or int(json.loads(line[6:])["data"]["pid"])
            if marker in line:
                return pid
    raise AssertionError(f"stream ended before {marker}")


async def test_startup_line_and_defaults(nursery: trio.Nursery, tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    server = await start_cli_server(nursery, tmp_path, spec, warm_pool=True)
    line = server.startup_line
    assert server.url.startswith("http://127.0.0.1:")
    assert "'cli-agent'" in line and "runtime exec" in line and "warm adapters 1" in line
    db = tmp_path / "xdg-data" / "trioserve" / "sessions.db"
    assert f"store sqlite:{db}" in line
    assert db.stat().st_mode & 0o777 == 0o600
    assert db.parent.stat().st_mode & 0o777 == 0o700
    with trio.fail_after(20):  # the pool's first load tells the load time
        while "the adapter loads in" not in server.log:
            await trio.sleep(0.05)
    (load_line,) = [li for li in server.log.splitlines() if "the adapter loads in" in li]
    expected = r"trioserve: the adapter loads in \d+\.\d\d s \(\d+\.\d\d s of CPU\)"
    assert re.fullmatch(expected, load_line), load_line
    server.signal(signal.SIGINT)
    assert await server.wait() == 0


async def test_sigterm_drains_in_flight_turn(nursery: trio.Nursery, tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    server = await start_cli_server(nursery, tmp_path, spec, "--in-memory")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        sid = (await client.post("/v1/sessions")).json()["id"]
        body = {
            "input": script(
                {"sleep": 1.5}, {"event": "message", "data": {"late": 1}}, {"end": "completed"}
            )
        }
        async with client.stream("POST", f"/v1/sessions/{sid}/turns", json=body) as resp:
            chunks = resp.aiter_text()
            first = await chunks.__anext__()
            assert "session.started" in first
            server.signal(signal.SIGTERM)
            # While draining: still answering, but not ready and taking nothing new.
            async with httpx.AsyncClient(base_url=server.url, timeout=5) as other:
                with trio.fail_after(5):
                    while (await other.get("/readyz")).status_code != 503:
                        await trio.sleep(0.02)
                refused = await other.post("/v1/sessions")
                assert refused.status_code == 503
                assert refused.json()["error"]["code"] == 503
            rest = "".join([chunk async for chunk in chunks])
    assert '"late": 1' in rest and "session.ended" in rest
    assert await server.wait() == 0


async def test_grace_over_cancels_turn_and_stops_adapter(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path)
    server = await start_cli_server(
        nursery, tmp_path, spec, "--in-memory", "--shutdown-grace", "500ms"
    )
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        sid = (await client.post("/v1/sessions")).json()["id"]
        body = {"input": script({"sleep": 120})}
        async with client.stream("POST", f"/v1/sessions/{sid}/turns", json=body) as resp:
            lines = resp.aiter_lines()
            pid = await _first_pid(lines)
            server.signal(signal.SIGTERM)
            assert await server.wait(within=15) == 0
    assert not pid_alive(pid)


async def test_second_signal_stops_at_once(nursery: trio.Nursery, tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    server = await start_cli_server(
        nursery,
        tmp_path,
        spec,
        "--in-memory",
        "--shutdown-grace",
        "60s",
        "--adapter-stop-grace",
        "60s",
    )
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        sid = (await client.post("/v1/sessions")).json()["id"]
        steps = (
            {"ignore_sigint": True},
            {"event": "message", "data": {"ready": 1}},
            {"hang": True},
        )
        body = {"input": script(*steps)}
        async with client.stream("POST", f"/v1/sessions/{sid}/turns", json=body) as resp:
            lines = resp.aiter_lines()
            pid = await _first_pid(lines, marker='"ready"')
            server.signal(signal.SIGTERM)
            await trio.sleep(0.3)
            assert server.proc.returncode is None, "the first signal waits for the turn"
            server.signal(signal.SIGTERM)
            assert await server.wait(within=10) == 0
    assert not pid_alive(pid)
    # Killed on purpose: said so once, not reported as an adapter that ignored SIGINT.
    log_lines = server.log.splitlines()
    assert "ignored SIGINT" not in server.log
    assert [line.split(" ", 2)[2] for line in log_lines if f"pid {pid}" in line] == [
        f"INFO trioserve.adapter: adapter pid {pid} force-stopped (SIGKILL)"
    ]
    complaints = [line for line in log_lines if " WARNING " in line or " ERROR " in line]
    assert len(complaints) == 1 and "SIGTERM: draining" in complaints[0], complaints
    ended = [line for line in log_lines if "turn ended " in line]
    assert len(ended) == 1 and "status=cancelled reason=server_shutdown" in ended[0]
    assert "exit=SIGKILL" in ended[0]


def adapters_of(pid: int) -> set[int]:
    """The server's children that are adapters (all but its reaper)."""
    found = set()
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read()
        except (OSError, ValueError):
            continue
        if ppid == pid and b"trioserve.runtime.reaper" not in command:
            found.add(int(entry))
    return found


async def test_kill_9_leaves_no_adapter(nursery: trio.Nursery, tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    server = await start_cli_server(nursery, tmp_path, spec, "--in-memory", "--warm-adapters", "2")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        with trio.fail_after(10):
            while (await client.get("/readyz")).headers["trioserve-warm-adapters"] != "2/2":
                await trio.sleep(0.05)
        sid = (await client.post("/v1/sessions")).json()["id"]
        body = {"input": script({"ignore_sigint": True}, {"hang": True})}
        async with client.stream("POST", f"/v1/sessions/{sid}/turns", json=body) as resp:
            lines = resp.aiter_lines()
            pid = await _first_pid(lines)
            with trio.fail_after(10):  # the replacement may wait for the first event
                while len(everything := adapters_of(server.proc.pid)) < 3:
                    await trio.sleep(0.02)
            assert pid in everything  # the turn's and two warm
            server.signal(signal.SIGKILL)
            await server.wait()
    for child in everything:
        await wait_gone(child)


async def test_sessions_survive_restart_with_sqlite(nursery: trio.Nursery, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, runtime="echo", name="echo-agent")
    db = tmp_path / "state" / "sessions.db"
    server = await start_cli_server(nursery, tmp_path, spec, "--store", f"sqlite:{db}")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        sid = (await client.post("/v1/sessions")).json()["id"]
        first = (await client.post(f"/v1/sessions/{sid}/turns", json={"input": "one"})).text
        assert "Turn 1" in first
        ended = (await client.post("/v1/sessions")).json()["id"]
        await client.delete(f"/v1/sessions/{ended}")
    server.signal()
    assert await server.wait() == 0
    # The spec file changes; the stored session keeps the spec it was created with.
    spec.write_text(spec.read_text().replace("name: echo-agent", "name: renamed"))
    server = await start_cli_server(nursery, tmp_path, spec, "--store", f"sqlite:{db}")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        got = (await client.get(f"/v1/sessions/{sid}")).json()
        assert got["status"] == "active" and got["agentName"] == "echo-agent"
        assert (await client.get(f"/v1/sessions/{ended}")).json()["status"] == "ended"
        second = (await client.post(f"/v1/sessions/{sid}/turns", json={"input": "two"})).text
        assert "Turn 2" in second and 'you said \\"one\\"' in second
    server.signal()
    assert await server.wait() == 0


def test_bad_spec_exits_2_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: agent-controller.dev/v1alpha1\nkind: Agent\nmetadata: {}\n")
    result = run_cli(tmp_path, "run", str(bad))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "metadata.name" in lines[0] and "spec" in lines[0]
    assert "Traceback" not in result.stderr
    missing = run_cli(tmp_path, "run", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1


def test_bad_flags_exit_2_with_one_line(tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    for args in (
        ["--port", "99999"],
        ["--session-ttl", "soon"],
        ["--max-sessions", "-1"],
        ["--store", "redis://x"],
        ["--in-memory", "--store", "memory"],
        ["--bogus"],
    ):
        result = run_cli(tmp_path, "run", str(spec), *args)
        assert result.returncode == 2, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)
        assert "Traceback" not in result.stderr


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = run_cli(tmp_path, "run", str(spec), "--in-memory", "--port", str(port))
    assert result.returncode == 1
    assert "address already in use" in result.stderr.lower()
    assert "Traceback" not in result.stderr


async def test_kill_9_mid_turn_then_restart_recovers_the_turn(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path)
    db = tmp_path / "state" / "sessions.db"
    server = await start_cli_server(nursery, tmp_path, spec, "--store", f"sqlite:{db}")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        sid = (await client.post("/v1/sessions")).json()["id"]
        body = {"input": script({"tick": 1000, "every": 0.002}, {"end": "completed"})}
        async with client.stream("POST", f"/v1/sessions/{sid}/turns", json=body) as resp:
            turn_id = resp.headers["trioserve-turn-id"]
            seen = []
            async for line in resp.aiter_lines():
                if line.startswith("id: "):
                    seen.append(int(line[4:]))
                if len(seen) == 50:
                    server.signal(signal.SIGKILL)
                    break
        assert await server.wait() == -signal.SIGKILL
    server = await start_cli_server(nursery, tmp_path, spec, "--store", f"sqlite:{db}")
    assert "interrupted by a restart" in server.log
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        record = (await client.get(f"/v1/sessions/{sid}/turns/{turn_id}")).json()
        assert (record["status"], record["reason"]) == ("interrupted", "server_restart")
        log = (await client.get(f"/v1/sessions/{sid}/events", params={"format": "json"})).json()
        # Everything a client saw was logged; the log then says what happened.
        assert [e["seq"] for e in log] == list(range(1, len(log) + 1))
        assert len(log) >= 50 + 2 and log[-1]["seq"] == record["lastSeq"]
        assert log[-2]["type"] == "error" and log[-2]["data"]["reason"] == "server_restart"
        assert log[-1]["type"] == "session.ended" and log[-1]["data"]["reason"] == "error"
        # The session takes new turns, numbered on without reusing a seq.
        frames = (await client.post(f"/v1/sessions/{sid}/turns", json={"input": "again"})).text
        assert f"id: {log[-1]['seq'] + 1}\n" in frames and "echo: again" in frames
    server.signal()
    assert await server.wait() == 0


async def test_missing_inputs_warn_by_default_and_refuse_with_require_inputs(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path)
    spec.write_text(spec.read_text().replace("task: Say hello.", "task: Hi ${inputs.who}."))
    server = await start_cli_server(nursery, tmp_path, spec, "--in-memory")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        created = await client.post("/v1/sessions", json={"inputs": {"other": "x"}})
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
    server.signal()
    assert await server.wait() == 0
    warned = [line for line in server.log.splitlines() if "no value for inputs" in line]
    assert len(warned) == 1 and " WARNING trioserve.manager: " in warned[0]
    assert warned[0].endswith(
        f"session {sid}: no value for inputs referenced by the spec's task: who (left as written)"
    )

    strict = await start_cli_server(nursery, tmp_path, spec, "--in-memory", "--require-inputs")
    async with httpx.AsyncClient(base_url=strict.url, timeout=30) as client:
        refused = await client.post("/v1/sessions", json={"inputs": {"other": "x"}})
        assert refused.status_code == 400
        assert refused.json()["error"]["message"].endswith("spec's task: who")
        given = await client.post("/v1/sessions", json={"inputs": {"who": "Ada"}})
        assert given.status_code == 201
    strict.signal()
    assert await strict.wait() == 0
    help_text = " ".join(run_cli(tmp_path, "run", "--help").stdout.split())
    assert "--require-inputs refuse (400)" in help_text
    assert "a warning is logged (default: off)" in help_text
