"""The messages of a turn's requests: persona, the session's history, the input.

The persona is the system message; the session's earlier turns (given by
the server, ``trioserve.history``) follow as the messages the model saw and
said; then the turn's input as the user's message.  Tool rounds append the
model's messages and the tools' results as the turn goes.

The history is cut to the context budget: ``contextTokens`` less the reply
reserve (``maxTokens``, else 1024), the system and user messages and the
tools' schemas; whole turns are dropped, oldest first.  Tokens are
estimated, not counted (no tokenizer matches every model): 4 characters of
the message's JSON each, plus 4 per message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from trioserve.spec import CompiledSpec, HistoryEvent, HistoryTurn

Message = dict[str, Any]


def estimate_tokens(value: Any) -> int:
    """A rough token count of a message (or anything JSON): 4 characters each, plus 4."""
    return len(json.dumps(value, ensure_ascii=False)) // 4 + 4


def system_message(spec: CompiledSpec) -> Message | None:
    persona = spec.persona
    if persona is None or not (persona.role or persona.instructions):
        return None
    parts = []
    if persona.role:
        parts.append(f"# Role\n{persona.role.strip()}")
    if persona.instructions:
        parts.append(f"# Instructions\n{persona.instructions.strip()}")
    return {"role": "system", "content": "\n\n".join(parts)}


def turn_messages(turn: HistoryTurn) -> list[Message]:
    """One earlier turn as messages: the input, then each round's message and tool results.

    Events of this adapter carry ``data.round``: a round's assistant text and
    its tool calls make one assistant message, its tool results follow.  A
    ``message`` without a round (another adapter's) is a message of its own.
    A tool call without its result (or the reverse) is left out, as the API
    requires them paired.
    """
    messages: list[Message] = [{"role": "user", "content": turn.input}]
    results = {e.data.get("callId"): e for e in turn.events if e.type == "tool.result"}
    rounds: dict[object, Message] = {}
    for event in turn.events:
        data = event.data
        key = data.get("round", object())
        if event.type == "message" and data.get("role") == "assistant":
            text = data.get("text")
            if isinstance(text, str) and text:
                _round(messages, rounds, key)["content"] = text
        elif event.type == "tool.call" and data.get("callId") in results:
            _round(messages, rounds, key).setdefault("tool_calls", []).append(_call(data))
            messages.append(_result(results[data["callId"]]))
    return messages


def _round(messages: list[Message], rounds: dict[object, Message], key: object) -> Message:
    message = rounds.get(key)
    if message is None:
        message = rounds[key] = {"role": "assistant", "content": None}
        messages.append(message)
    return message


def _call(data: dict[str, Any]) -> Message:
    arguments = data.get("args")
    return {
        "id": data["callId"],
        "type": "function",
        "function": {"name": str(data.get("toolName")), "arguments": json.dumps(arguments or {})},
    }


def _result(event: HistoryEvent) -> Message:
    content = event.data.get("content")
    text = content if isinstance(content, str) else json.dumps(content)
    return {"role": "tool", "tool_call_id": event.data["callId"], "content": text}


@dataclass
class Conversation:
    """A turn's messages so far, and what was left out of its history."""

    messages: list[Message]
    kept_turns: int
    dropped_turns: int


def conversation(spec: CompiledSpec, tools: list[dict[str, Any]], budget: int) -> Conversation:
    """The first request's messages: the history cut to ``budget`` tokens (see the module)."""
    system = system_message(spec)
    user: Message = {"role": "user", "content": spec.task}
    head = [system] if system else []
    fixed = sum(map(estimate_tokens, [*head, user])) + sum(map(estimate_tokens, tools))
    room = budget - fixed
    context = spec.trioserve
    turns = [turn_messages(turn) for turn in (context.history if context else [])]
    kept: list[list[Message]] = []
    for messages in reversed(turns):
        cost = sum(map(estimate_tokens, messages))
        if cost > room:
            break
        kept.append(messages)
        room -= cost
    history = [message for messages in reversed(kept) for message in messages]
    return Conversation([*head, *history, user], len(kept), len(turns) - len(kept))
