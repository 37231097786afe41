"""Wire events as the built-in adapters print them (one JSON object per line).

Shared by the adapter programs (``echo_adapter``, ``openai_adapter``); it
imports nothing but the standard library, so they start without trio.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Final

#: The ``apiVersion`` of the events (``trioserve.protocol.EVENTS_API_VERSION``).
API_VERSION: Final = "agent-controller.dev/events/v1alpha1"


def now() -> str:
    """The current time as the events' ``ts``: RFC 3339, UTC, milliseconds."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def event_line(session_id: str, event_type: str, data: dict[str, Any]) -> str:
    """One event as a line of compact JSON, newline included."""
    event = {
        "v": 1,
        "apiVersion": API_VERSION,
        "type": event_type,
        "ts": now(),
        "sessionId": session_id,
        "data": data,
    }
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False) + "\n"
