"""The built-in ``echo`` runtime adapter: needs no model and no key.

Run as ``python -m trioserve.runtime.echo_adapter``.  It reads a CompiledSpec from
stdin, answers deterministically and speaks wire protocol v1 on stdout:
``session.started``, one or more assistant ``message`` events, then
``session.ended``.  It remembers each session's earlier turns in a small
state file, so its reply names the turn number and the previous input:

    Turn 2 of session s_...: you said "bye". Before that you said "hi".

``runtime.options`` in the spec: ``chunkSize`` (characters per streamed
``message`` event, each with ``data.delta: true``; without it the reply is
one message) and ``delayMs`` (pause between chunks).  The state directory is
``$TRIOSERVE_ECHO_STATE_DIR``, else ``$XDG_STATE_HOME/trioserve/echo``, else
``~/.local/state/trioserve/echo``.  SIGINT or SIGTERM ends the turn with
``session.ended`` ``cancelled``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import time
from types import FrameType
from typing import Any

from trioserve.runtime.wire_events import event_line

_SAFE_ID = re.compile(r"[^A-Za-z0-9_.-]")


class _Stopped(Exception):
    pass


def _emit(session_id: str, event_type: str, data: dict[str, Any]) -> None:
    sys.stdout.write(event_line(session_id, event_type, data))
    sys.stdout.flush()


def state_dir() -> str:
    explicit = os.environ.get("TRIOSERVE_ECHO_STATE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(base, "trioserve", "echo")


# Plain os and open, not pathlib: a forked turn runs as little Python as it can (each
# object it touches copies a page it shared with the fork server).
def _load_state(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            state = json.load(fh)
    except (OSError, ValueError):
        return {"turns": 0, "inputs": []}
    return state if isinstance(state, dict) else {"turns": 0, "inputs": []}


def _save_state(path: str, state: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(state))  # dumps, not dump: one C call
    os.replace(tmp, path)


def reply_for(session_id: str, turn: int, text: str, previous: str | None) -> str:
    """The deterministic reply for turn number ``turn`` (1-based)."""
    reply = f'Turn {turn} of session {session_id}: you said "{text}".'
    if previous is None:
        return reply + " This is the first turn."
    return reply + f' Before that you said "{previous}".'


def _chunks(text: str, size: int | None) -> list[str]:
    if not size:
        return [text]
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise _Stopped


def main() -> int:
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    raw = sys.stdin.read()
    try:
        spec = json.loads(raw)
        if not isinstance(spec, dict):
            raise ValueError("the CompiledSpec must be a JSON object")
    except ValueError as exc:
        _emit("", "error", {"message": f"echo adapter: cannot read the spec on stdin: {exc}"})
        _emit("", "session.ended", {"reason": "error"})
        return 1
    session_id = str(spec.get("sessionId") or "local")
    task = str(spec.get("task") or "").strip()
    options = (spec.get("runtime") or {}).get("options") or {}
    chunk_size = int(options.get("chunkSize") or 0) or None
    delay = float(options.get("delayMs") or 0) / 1000.0
    path = os.path.join(state_dir(), f"{_SAFE_ID.sub('_', session_id)}.json")
    try:
        _emit(session_id, "session.started", {"runtime": "echo", "pid": os.getpid()})
        state = _load_state(path)
        inputs = [str(i) for i in state.get("inputs", [])]
        turn = int(state.get("turns", 0)) + 1
        reply = reply_for(session_id, turn, task, inputs[-1] if inputs else None)
        _save_state(path, {"turns": turn, "inputs": [*inputs, task][-20:]})
        pieces = _chunks(reply, chunk_size)
        for index, piece in enumerate(pieces):
            if index and delay:
                time.sleep(delay)
            data: dict[str, Any] = {"role": "assistant", "text": piece}
            if chunk_size:
                data |= {"delta": True, "index": index, "final": index == len(pieces) - 1}
            _emit(session_id, "message", data)
        _emit(session_id, "session.ended", {"reason": "completed", "turn": turn})
    except _Stopped:
        with contextlib.suppress(OSError):
            _emit(session_id, "session.ended", {"reason": "cancelled"})
        return 130
    except BrokenPipeError:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
