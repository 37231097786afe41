"""A session's earlier turns, read from its event log, for the adapters that remember.

A model adapter runs one turn and exits; what the session said before
comes from the one place that holds it for every process and across
restarts: the store's event log.  ``turn_context`` reads the session's
completed turns, newest first, keeping each turn's input and its
``message`` (whole messages, not ``delta: true`` chunks), ``tool.call``
and ``tool.result`` events, until :data:`MAX_TURNS` turns or
:data:`MAX_BYTES` of event JSON are kept; the older ones are left out and
counted (``omittedTurns``; the adapter applies its own, smaller, token
budget and says what it dropped).  A turn with nothing left in the log
(its events dropped by ``--event-retention``) is skipped.  See
``trioserve.spec._context`` for the format and docs/wire-protocol.md for
the limits.
"""

from __future__ import annotations

import json
from typing import Final

from trioserve.protocol import TurnStatus
from trioserve.spec import HISTORY_EVENT_TYPES, HistoryEvent, HistoryTurn, TurnContext
from trioserve.stores.base import Store
from trioserve.stores.records import LoggedEvent

#: The most earlier turns given to an adapter.
MAX_TURNS: Final = 200
#: The most bytes of event JSON (and inputs) given to an adapter.
MAX_BYTES: Final = 1 << 20


async def turn_context(
    store: Store,
    session_id: str,
    task: str,
    *,
    max_turns: int = MAX_TURNS,
    max_bytes: int = MAX_BYTES,
) -> TurnContext:
    """The session's completed turns, oldest first, within the bounds.

    ``task`` stands for the input of a turn whose input was empty.
    """
    records = await store.list_turns(session_id, status=TurnStatus.COMPLETED)
    kept: list[HistoryTurn] = []
    size = 0
    for index, record in enumerate(reversed(records)):
        if record.first_seq is None or record.last_seq is None:
            continue
        logged = await store.read_events(
            session_id, after=record.first_seq - 1, before=record.last_seq + 1
        )
        events = [event for event in map(_history_event, logged) if event is not None]
        if not events:
            continue
        text = record.input or task
        cost = len(text.encode()) + sum(size for size, _ in events)
        if len(kept) == max_turns or size + cost > max_bytes:
            return TurnContext(history=kept[::-1], omitted_turns=len(records) - index)
        kept.append(HistoryTurn(input=text, events=[e for _, e in events]))
        size += cost
    return TurnContext(history=kept[::-1])


def _history_event(event: LoggedEvent) -> tuple[int, HistoryEvent] | None:
    """The event as a history keeps it, or None (another type, a delta, not an object)."""
    if event.type not in HISTORY_EVENT_TYPES:
        return None
    try:
        decoded = json.loads(event.raw)
    except ValueError:
        return None
    data = decoded.get("data") if isinstance(decoded, dict) else None
    if not isinstance(data, dict):
        data = {}
    if event.type == "message" and data.get("delta") is True:
        return None
    return len(event.raw), HistoryEvent(type=event.type, data=data)
