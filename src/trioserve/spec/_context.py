"""What the server adds to a turn's CompiledSpec for adapters that ask: the session's history.

An adapter runs one turn and exits, so a model adapter that must remember
the session's earlier turns is told them with each turn.  The server reads
them from the session's event log (durable: it survives restarts and is
shared by ``--workers`` and replicas) and passes them under the top-level
key ``trioserve`` of the CompiledSpec, only to the runtime types that take
it (``WITH_HISTORY`` in ``_runtimes.py``): a v0.8 adapter never sees it.

    "trioserve": {"history": [{"input": "hi", "events": [{"type": "message",
                  "data": {"role": "assistant", "text": "Hello!", "final": true}}]}],
                  "omittedTurns": 0}

``history`` holds the session's completed turns, oldest first: each turn's
input (the session's task when the turn's input was empty) and its logged
``message`` (but not ``delta: true`` chunks), ``tool.call`` and
``tool.result`` events, as the adapter printed them.  ``omittedTurns`` is
how many older completed turns the server left out to keep the history
within its size bound.
"""

from __future__ import annotations

from typing import Any, Final

from pydantic import Field

from trioserve.spec._validation import StrictModel

#: The event types a history keeps (``message`` without its ``delta: true`` chunks).
HISTORY_EVENT_TYPES: Final = frozenset({"message", "tool.call", "tool.result"})


class HistoryEvent(StrictModel):
    """One logged event of an earlier turn: its type and data, as the adapter printed them."""

    type: str
    data: dict[str, Any] = {}


class HistoryTurn(StrictModel):
    """One earlier, completed turn: what the user said and what the agent did."""

    input: str
    events: list[HistoryEvent] = []


class TurnContext(StrictModel):
    """The ``trioserve`` key of a turn's CompiledSpec (a trioserve extension)."""

    history: list[HistoryTurn] = []
    omitted_turns: int = Field(default=0, alias="omittedTurns", ge=0)
