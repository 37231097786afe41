"""A small ``exec`` adapter that implements the approvals extension of the wire protocol
(docs/wire-protocol.md, "Approvals"), with the standard library only.

Its one tool is ``deploy``: each turn calls it with ``{"target": TASK}``.  When the
CompiledSpec's ``trioserve.approval.tools`` match ``deploy`` it asks first
(``approval.requested`` with a ``state`` of its own, then ``session.ended``
``waiting``); resumed (``trioserve.resume``) it checks its state, runs the call
(approved: ``deployed TARGET``, with the person's arguments if edited) or reports the
denial, and ends ``completed``.  Each run appends its pid to ``$APPROVAL_ADAPTER_PIDS``.
"""

from __future__ import annotations

import fnmatch
import json
import os
import sys
from typing import Any


def main() -> int:
    spec = json.loads(sys.stdin.read())
    session = spec.get("sessionId", "")

    def emit(event_type: str, data: dict[str, Any]) -> None:
        event = {"v": 1, "type": event_type, "sessionId": session, "data": data}
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()

    pids = os.environ.get("APPROVAL_ADAPTER_PIDS")
    if pids:
        with open(pids, "a") as f:
            f.write(f"{os.getpid()}\n")
    context = spec.get("trioserve") or {}
    resume = context.get("resume")
    emit("session.started", {"pid": os.getpid(), "resumed": resume is not None})
    arguments = {"target": spec["task"]}
    if resume is None:
        globs = (context.get("approval") or {}).get("tools", [])
        if any(fnmatch.fnmatchcase("deploy", g) for g in globs):
            state = {"planned": arguments, "step": 1}
            data = {"callId": "deploy-1", "tool": "deploy", "arguments": arguments}
            emit("approval.requested", {**data, "state": state})
            emit("session.ended", {"reason": "waiting"})
            return 0
    else:
        state = resume["state"]
        if state != {"planned": arguments, "step": 1} or resume["callId"] != "deploy-1":
            emit("session.ended", {"reason": "error", "message": f"bad state {state!r}"})
            return 1
        if resume["decision"] == "deny":
            text = f"not deployed: {resume.get('reason') or 'denied'}: {resume.get('message')}"
            emit("tool.result", {"callId": "deploy-1", "isError": True, "content": text})
            emit("message", {"role": "assistant", "text": text, "final": True})
            emit("session.ended", {"reason": "completed"})
            return 0
        arguments = resume.get("arguments") or arguments
    emit("tool.call", {"toolName": "deploy", "callId": "deploy-1", "args": arguments})
    emit("tool.result", {"callId": "deploy-1", "content": f"deployed {arguments['target']}"})
    emit("message", {"role": "assistant", "text": f"deployed {arguments['target']}", "final": True})
    emit("session.ended", {"reason": "completed"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
