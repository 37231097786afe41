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

Approvals (docs/wire-protocol.md, "Approvals"): ``approval.tools`` names
(as globs) the tools that need a person's approval before they run, for the
runtime types that take it (``WITH_APPROVALS``) when the spec or the server
asks for any; ``resume`` is given to the continuation of a turn that waited,
with the decision and the state the adapter asked to resume from.
"""

from __future__ import annotations

import fnmatch
from typing import Any, Final, Literal

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


class ApprovalContext(StrictModel):
    """``trioserve.approval``: the tools (globs, ``fnmatch``) that need a person's approval."""

    tools: list[str] = []

    def needs(self, tool: str) -> bool:
        """Whether ``tool`` (a tool's name as the model calls it) needs an approval."""
        return any(fnmatch.fnmatchcase(tool, pattern) for pattern in self.tools)


class Resume(StrictModel):
    """``trioserve.resume``: the decision a waiting turn continues with."""

    approval_id: str = Field(alias="approvalId")
    call_id: str = Field(alias="callId")
    tool: str
    decision: Literal["approve", "deny"]
    #: The arguments the tool runs with: the person's edit, else the requested ones.
    arguments: Any = None
    #: The person's message; ``reason`` is ``expired``, ``interrupted`` or ``None``.
    message: str | None = None
    reason: str | None = None
    #: What the adapter asked to resume from (its ``approval.requested`` ``data.state``).
    state: dict[str, Any] = {}


class TurnContext(StrictModel):
    """The ``trioserve`` key of a turn's CompiledSpec (a trioserve extension)."""

    history: list[HistoryTurn] = []
    omitted_turns: int = Field(default=0, alias="omittedTurns", ge=0)
    approval: ApprovalContext | None = None
    resume: Resume | None = None


#: ``runtime.options`` key naming the tools that need an approval (comma-separated globs).
APPROVAL_OPTION: Final = "requireApproval"


def split_globs(text: str) -> list[str]:
    """``'fs_*, shell'`` as ``['fs_*', 'shell']`` (empty parts left out)."""
    return [part.strip() for part in text.split(",") if part.strip()]


def approval_tools(
    options: dict[str, Any] | None, tools: list[tuple[str, dict[str, Any] | None]], extra: list[str]
) -> list[str]:
    """The globs of the tools that need an approval: ``runtime.options.requireApproval``,
    each tool ref whose ``config.requireApproval`` is true, and ``extra`` (the server's
    ``--require-approval``), in that order, without repeats."""
    found: list[str] = []
    option = (options or {}).get(APPROVAL_OPTION)
    if isinstance(option, str):
        found.extend(split_globs(option))
    found.extend(name for name, config in tools if (config or {}).get(APPROVAL_OPTION) is True)
    found.extend(extra)
    return list(dict.fromkeys(found))
