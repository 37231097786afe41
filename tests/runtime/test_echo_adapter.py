"""The built-in echo adapter, run as a real subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trioserve.runtime._wire import Event, decode_line

ECHO = [sys.executable, "-m", "trioserve.runtime.echo_adapter"]


def _env(state_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["TRIOSERVE_ECHO_STATE_DIR"] = str(state_dir)
    return env


def _spec(task: str, session_id: str = "s_echo1", **options: Any) -> dict[str, Any]:
    runtime: dict[str, Any] = {"type": "echo"}
    if options:
        runtime["options"] = options
    return {
        "v": 1,
        "metadata": {"name": "echo-agent"},
        "model": {"provider": "none", "name": "echo"},
        "task": task,
        "tools": [],
        "extensions": [],
        "skills": [],
        "runtime": runtime,
        "sessionId": session_id,
    }


def _run(state_dir: Path, stdin: bytes) -> tuple[int, list[Event]]:
    proc = subprocess.run(
        ECHO, input=stdin, capture_output=True, env=_env(state_dir), timeout=30, check=False
    )
    assert proc.stdout.endswith(b"\n")
    events = [decode_line(line) for line in proc.stdout.split(b"\n") if line]
    return proc.returncode, events


def _turn(state_dir: Path, task: str, session_id: str = "s_echo1", **options: Any) -> list[Event]:
    code, events = _run(state_dir, json.dumps(_spec(task, session_id, **options)).encode())
    assert code == 0
    return events


def _reply(events: list[Event]) -> str:
    return "".join(e.data["text"] for e in events if e.type == "message")


def test_output_is_a_v1_turn(tmp_path: Path) -> None:
    events = _turn(tmp_path, "hi")
    types = [e.type for e in events]
    assert types[0] == "session.started"
    assert types[-1] == "session.ended"
    assert set(types[1:-1]) == {"message"}
    assert events[-1].end_reason == "completed"
    for event in events:
        obj = event.json()
        assert obj["v"] == 1
        assert obj["sessionId"] == "s_echo1"
        assert obj["ts"].endswith("Z")
    message = next(e for e in events if e.type == "message")
    assert message.data["role"] == "assistant"


def test_first_turn_reply(tmp_path: Path) -> None:
    reply = _reply(_turn(tmp_path, "hi"))
    assert "Turn 1" in reply
    assert "s_echo1" in reply
    assert '"hi"' in reply
    assert "first turn" in reply


def test_second_turn_remembers_the_previous_input(tmp_path: Path) -> None:
    _turn(tmp_path, "hi")
    events = _turn(tmp_path, "bye")
    reply = _reply(events)
    assert "Turn 2" in reply
    assert '"bye"' in reply
    assert 'Before that you said "hi"' in reply
    assert "first turn" not in reply
    assert events[-1].data.get("turn") == 2


def test_third_turn_names_the_second_input(tmp_path: Path) -> None:
    for text in ("one", "two"):
        _turn(tmp_path, text)
    reply = _reply(_turn(tmp_path, "three"))
    assert "Turn 3" in reply
    assert 'Before that you said "two"' in reply


def test_sessions_do_not_share_memory(tmp_path: Path) -> None:
    _turn(tmp_path, "secret for a", session_id="s_a")
    reply_b = _reply(_turn(tmp_path, "hello from b", session_id="s_b"))
    assert "Turn 1" in reply_b
    assert "first turn" in reply_b
    assert "secret for a" not in reply_b
    reply_a = _reply(_turn(tmp_path, "again", session_id="s_a"))
    assert "Turn 2" in reply_a
    assert 'Before that you said "secret for a"' in reply_a


def test_state_lives_in_the_given_directory(tmp_path: Path) -> None:
    _turn(tmp_path, "hi")
    # A fresh state directory means a fresh memory.
    reply = _reply(_turn(tmp_path / "other", "hi again"))
    assert "Turn 1" in reply
    assert any(tmp_path.iterdir())


def test_chunked_reply_is_deltas_that_add_up_to_the_whole_reply(tmp_path: Path) -> None:
    whole = _reply(_turn(tmp_path / "a", "stream me please"))
    events = _turn(tmp_path / "b", "stream me please", chunkSize=5)
    messages = [e for e in events if e.type == "message"]
    assert len(messages) == -(-len(whole) // 5)
    assert len(messages) > 1
    assert "".join(m.data["text"] for m in messages) == whole
    assert all(len(m.data["text"]) <= 5 for m in messages)
    assert all(m.data["delta"] is True for m in messages)
    assert [m.data["index"] for m in messages] == list(range(len(messages)))
    assert [m.data["final"] for m in messages] == [False] * (len(messages) - 1) + [True]
    assert events[-1].end_reason == "completed"


def test_unchunked_reply_is_one_message_without_delta(tmp_path: Path) -> None:
    events = _turn(tmp_path, "hi")
    messages = [e for e in events if e.type == "message"]
    assert len(messages) == 1
    assert "delta" not in messages[0].data


def test_delay_keeps_the_same_chunks(tmp_path: Path) -> None:
    whole = _reply(_turn(tmp_path / "a", "slow"))
    events = _turn(tmp_path / "b", "slow", chunkSize=7, delayMs=1)
    messages = [e for e in events if e.type == "message"]
    assert len(messages) == -(-len(whole) // 7)
    assert "".join(m.data["text"] for m in messages) == whole


@pytest.mark.parametrize("stdin", [b"not json", b"", b"[1, 2]"], ids=["garbage", "empty", "list"])
def test_bad_stdin_is_an_error_turn(tmp_path: Path, stdin: bytes) -> None:
    code, events = _run(tmp_path, stdin)
    assert code == 1
    assert [e.type for e in events] == ["error", "session.ended"]
    assert "spec" in events[0].data["message"]
    assert events[1].end_reason == "error"


def test_sigint_during_a_slow_stream_ends_cancelled(tmp_path: Path) -> None:
    spec = _spec("a long enough input to stream slowly", chunkSize=1, delayMs=60_000)
    proc = subprocess.Popen(
        ECHO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=_env(tmp_path),
    )
    try:
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.write(json.dumps(spec).encode())
        proc.stdin.close()
        started = decode_line(proc.stdout.readline().rstrip(b"\n"))
        assert started.type == "session.started"
        first = decode_line(proc.stdout.readline().rstrip(b"\n"))
        assert first.type == "message"
        assert len(first.data["text"]) == 1
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        rest = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    events = [decode_line(line) for line in rest.split(b"\n") if line]
    assert events, "no events after SIGINT"
    assert events[-1].type == "session.ended"
    assert events[-1].end_reason == "cancelled"
    assert all(e.type == "message" for e in events[:-1])
    assert proc.returncode != 0
