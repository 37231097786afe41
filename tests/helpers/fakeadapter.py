"""A scriptable adapter for tests: speaks wire protocol v1 as told.

Before it reads its stdin, in the order given: ``--startup-stderr TEXT``
writes TEXT to stderr, ``--startup-sleep SECONDS`` sleeps and
``--startup-burn SECONDS`` spins that much CPU time (a slow runtime loading
its libraries), ``--startup-mark PATH`` creates PATH (it has loaded).  It
reads the CompiledSpec from stdin.  A task (the turn input) of the form
``script:<JSON list of steps>`` runs those steps; any other task gets a
plain reply (``session.started``, one ``message`` echoing the task,
``session.ended`` ``completed``).  ``session.started`` always carries the
adapter's pid in ``data.pid`` and its parent's (the server's) in ``data.ppid``.

Steps (objects, one key each unless noted):
  {"event": TYPE, "data": {...}}   emit an event (v, ts, sessionId filled in)
  {"end": REASON}                  emit session.ended with that reason
  {"raw": TEXT}                    write TEXT and a newline to stdout as is
  {"big": N}                       emit a message whose content is N bytes
  {"many": N}                      emit N small message events
  {"tick": N, "every": SECONDS}    emit N message events, data {"i": 0..N-1}, one each SECONDS
  {"stderr": TEXT}                 write TEXT to stderr
  {"sleep": SECONDS}               sleep
  {"hang": true}                   sleep forever
  {"wait": PATH}                   wait until PATH exists (a gate the test opens)
  {"ignore_sigint": true}          ignore SIGINT (and SIGTERM) from now on
  {"child": true}                  start a grandchild (sleep 300) and report its pid
  {"record": PATH}                 write the spec received on stdin to PATH
  {"count": PATH}                  append its pid and a newline to PATH (one line per run)
  {"env": NAME}                    emit a message whose data.env is $NAME (or null)
  {"exit": CODE}                   exit now with CODE
  {"nice": true}                   emit a message whose data.nice is its nice value
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

SESSION = ""


def emit(event_type: str, data: dict[str, Any] | None = None) -> None:
    event = {
        "v": 1,
        "type": event_type,
        "ts": "2026-01-01T00:00:00Z",
        "sessionId": SESSION,
        "data": data or {},
    }
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def startup(argv: list[str]) -> None:
    for flag, value in zip(argv[::2], argv[1::2], strict=True):
        if flag == "--startup-stderr":
            sys.stderr.write(value)
            sys.stderr.flush()
        elif flag == "--startup-sleep":
            time.sleep(float(value))
        elif flag == "--startup-burn":
            until = time.process_time() + float(value)
            while time.process_time() < until:
                pass
        elif flag == "--startup-mark":
            open(value, "w").close()
        else:
            raise SystemExit(f"fakeadapter: unknown flag {flag}")


def main() -> int:
    global SESSION
    startup(sys.argv[1:])
    raw = sys.stdin.read()
    spec = json.loads(raw)
    SESSION = spec.get("sessionId", "")
    task: str = spec.get("task", "")
    emit("session.started", {"pid": os.getpid(), "ppid": os.getppid()})
    if not task.startswith("script:"):
        emit("message", {"role": "assistant", "text": f"echo: {task}"})
        emit("session.ended", {"reason": "completed"})
        return 0
    for step in json.loads(task[len("script:") :]):
        if "event" in step:
            emit(step["event"], step.get("data"))
        elif "end" in step:
            emit("session.ended", {"reason": step["end"]})
        elif "raw" in step:
            sys.stdout.write(step["raw"] + "\n")
            sys.stdout.flush()
        elif "big" in step:
            emit("message", {"role": "assistant", "content": "x" * int(step["big"])})
        elif "many" in step:
            line = '{"v":1,"type":"message","sessionId":"%s","data":{"i":%d}}\n'
            out = sys.stdout
            for i in range(int(step["many"])):
                out.write(line % (SESSION, i))
            out.flush()
        elif "tick" in step:
            for i in range(int(step["tick"])):
                emit("message", {"i": i})
                time.sleep(float(step.get("every", 0.01)))
        elif "stderr" in step:
            sys.stderr.write(step["stderr"])
            sys.stderr.flush()
        elif "sleep" in step:
            time.sleep(float(step["sleep"]))
        elif "hang" in step:
            while True:
                time.sleep(60)
        elif "wait" in step:
            while not os.path.exists(step["wait"]):
                time.sleep(0.01)
        elif "ignore_sigint" in step:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        elif "child" in step:
            child = subprocess.Popen(["sleep", "300"])
            emit("message", {"childPid": child.pid})
        elif "env" in step:
            emit("message", {"env": os.environ.get(step["env"])})
        elif "nice" in step:
            emit("message", {"nice": os.nice(0)})
        elif "record" in step:
            with open(step["record"], "w") as f:
                f.write(raw)
        elif "count" in step:
            with open(step["count"], "a") as f:  # O_APPEND: one whole line per write
                f.write(f"{os.getpid()}\n")
        elif "exit" in step:
            sys.stdout.flush()
            return int(step["exit"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
