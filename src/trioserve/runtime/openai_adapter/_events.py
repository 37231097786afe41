"""What the adapter prints: wire events on stdout, and the failures that end a turn.

Every failure the adapter can name is a :class:`Failure` with a machine
``reason`` and a message a user can act on; the turn prints it as an
``error`` event (with ``data.reason``, ``data.message`` and any details),
then ``session.ended`` with reason ``error`` and the same message.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from trioserve.runtime.wire_events import event_line


class Failure(Exception):
    """A failure the turn reports as an ``error`` event (``details`` go into its data)."""

    def __init__(self, reason: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.details = details


class Emitter:
    """Prints one session's events, one line each, flushed at once."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        #: ``session.ended`` was printed: the turn's last event.
        self.ended = False

    def emit(self, event_type: str, data: dict[str, Any]) -> None:
        sys.stdout.write(event_line(self.session_id, event_type, data))
        sys.stdout.flush()
        self.ended |= event_type == "session.ended"

    def started(self, agent: str, model: dict[str, Any]) -> None:
        data = {"runtime": "openai", "pid": os.getpid(), "agentName": agent, "model": model}
        self.emit("session.started", data)

    def failed(self, failure: Failure) -> None:
        """The ``error`` event, then ``session.ended`` ``error``."""
        self.emit(
            "error", {"reason": failure.reason, "message": failure.message, **failure.details}
        )
        self.emit("session.ended", {"reason": "error", "message": failure.message})
