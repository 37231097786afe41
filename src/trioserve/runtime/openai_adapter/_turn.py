"""One turn: the model's replies streamed as events, its tool calls run, until it answers.

A round is one model request: its text streams as ``message`` events with
``data.delta: true``, then comes the whole message (``data.final: true``),
then ``model.response``.  If the model asked for tools, each call runs in
order (``tool.call``, then ``tool.result``; a failing, unknown or hanging
tool is a result the model is told, not the turn's end) and the next round
starts.  A turn may end ``maxToolRounds`` rounds in tool calls; a model
that asks for tools once more fails the turn (``tool_rounds_exceeded``).
"""

from __future__ import annotations

import json
from typing import Any

from trioserve.runtime.openai_adapter._client import ModelClient
from trioserve.runtime.openai_adapter._conversation import conversation
from trioserve.runtime.openai_adapter._events import Emitter, Failure
from trioserve.runtime.openai_adapter._mcp import ToolBox
from trioserve.runtime.openai_adapter._settings import Settings
from trioserve.runtime.openai_adapter._stream import Reply
from trioserve.spec import CompiledSpec


class Turn:
    """Runs one turn of ``spec`` against the model, printing its events."""

    def __init__(self, spec: CompiledSpec, settings: Settings, emitter: Emitter) -> None:
        self.spec = spec
        self.settings = settings
        self.emit = emitter.emit
        self.usage = {"tokensIn": 0, "tokensOut": 0}
        self.rounds = 0

    async def run(self, tools: ToolBox, model: ModelClient) -> None:
        """The turn, up to its final answer; ``Failure`` for what ends it otherwise."""
        talk = conversation(self.spec, tools.functions, self._history_budget())
        self._warn_dropped(talk.kept_turns, talk.dropped_turns)
        messages = talk.messages
        while True:
            self.rounds += 1
            reply = await self._request(model, messages, tools.functions)
            messages.append(_assistant(reply))
            if not reply.tool_calls:
                return
            if self.rounds > self.settings.max_tool_rounds:
                raise Failure(
                    "tool_rounds_exceeded",
                    f"the model asked for tools after {self.settings.max_tool_rounds} rounds of"
                    " tool calls in one turn; raise runtime.options.maxToolRounds, or ask for"
                    " less in one turn",
                )
            for call in reply.tool_calls:
                messages.append(await self._call(tools, call.id, call.name, call.arguments))

    def _history_budget(self) -> int:
        return self.settings.context_tokens - self.settings.reply_reserve

    def _warn_dropped(self, kept: int, dropped: int) -> None:
        context = self.spec.trioserve
        omitted = context.omitted_turns if context else 0
        if not dropped and not omitted:
            return
        self.emit(
            "warning",
            {
                "reason": "history_truncated",
                "message": f"the {dropped + omitted} oldest earlier turns of this session were"
                f" left out of the model's context ({kept} kept) to stay within"
                f" {self.settings.context_tokens} tokens (runtime.options.contextTokens)",
                "droppedTurns": dropped + omitted,
                "keptTurns": kept,
            },
        )

    async def _request(
        self, model: ModelClient, messages: list[dict[str, Any]], functions: list[dict[str, Any]]
    ) -> Reply:
        body: dict[str, Any] = {
            "model": self.spec.model.name,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.spec.model.temperature is not None:
            body["temperature"] = self.spec.model.temperature
        if self.settings.max_tokens is not None:
            body["max_tokens"] = self.settings.max_tokens
        if functions:
            body["tools"] = functions
        round_ = self.rounds
        self.emit(
            "model.request",
            {
                "round": round_,
                "model": self.spec.model.name,
                "messageCount": len(messages),
                "tools": len(functions),
            },
        )
        index = 0

        def on_text(text: str) -> None:
            nonlocal index
            data = {"role": "assistant", "text": text, "delta": True, "index": index}
            self.emit("message", {**data, "round": round_})
            index += 1

        reply, timing = await model.stream(body, on_text)
        if reply.text:
            self.emit(
                "message", {"role": "assistant", "text": reply.text, "final": True, "round": round_}
            )
        tokens_in = _count(reply.usage, "prompt_tokens")
        tokens_out = _count(reply.usage, "completion_tokens")
        self.usage["tokensIn"] += tokens_in or 0
        self.usage["tokensOut"] += tokens_out or 0
        self.emit(
            "model.response",
            {
                "round": round_,
                "finishReason": reply.finish_reason,
                "tokensIn": tokens_in,
                "tokensOut": tokens_out,
                "usage": reply.usage,
                "toolCalls": len(reply.tool_calls),
                "durationMs": timing.duration_ms,
                "firstChunkMs": timing.first_chunk_ms,
            },
        )
        return reply

    async def _call(
        self, tools: ToolBox, call_id: str, name: str, arguments: str
    ) -> dict[str, Any]:
        try:
            args: Any = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            args = arguments  # as the model wrote it; the tool call fails on it
        data = {"toolName": name, "callId": call_id, "args": args, "round": self.rounds}
        self.emit("tool.call", {**data, "server": tools.server_of(name)})
        result = await tools.call(name, arguments)
        outcome: dict[str, Any] = {
            "toolName": name,
            "callId": call_id,
            "isError": result.error is not None,
            "content": result.content,
            "durationMs": result.duration_ms,
            "round": self.rounds,
        }
        if result.error is not None:
            outcome["error"] = {"reason": result.error[0], "message": result.error[1]}
        self.emit("tool.result", outcome)
        return {"role": "tool", "tool_call_id": call_id, "content": result.content}


def _assistant(reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in reply.tool_calls
        ]
    return message


def _count(usage: dict[str, Any], key: str) -> int | None:
    value = usage.get(key)
    return value if type(value) is int else None
