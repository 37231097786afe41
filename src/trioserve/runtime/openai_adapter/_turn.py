"""One turn: the model's replies streamed as events, its tool calls run, until it answers.

A round is one model request: its text streams as ``message`` events with
``data.delta: true``, then comes the whole message (``data.final: true``),
then ``model.response``.  If the model asked for tools, each call runs in
order (``tool.call``, then ``tool.result``; a failing, unknown or hanging
tool is a result the model is told, not the turn's end) and the next round
starts.  A turn may end ``maxToolRounds`` rounds in tool calls; a model
that asks for tools once more fails the turn (``tool_rounds_exceeded``).

A call of a tool the server says needs an approval (``trioserve.approval``)
is not run: the turn prints ``approval.requested`` with the conversation so
far and the calls left (``data.state``) and ends ``waiting`` (``Parked``).
The server runs the adapter again with ``trioserve.resume``: the decided
call runs (approved) or its result tells the model it was denied and why,
then the calls left, then the rounds go on (docs/wire-protocol.md).
"""

from __future__ import annotations

import json
from typing import Any

from trioserve.runtime.openai_adapter._client import ModelClient
from trioserve.runtime.openai_adapter._conversation import conversation
from trioserve.runtime.openai_adapter._events import Emitter, Failure
from trioserve.runtime.openai_adapter._mcp import ToolBox
from trioserve.runtime.openai_adapter._settings import Settings
from trioserve.runtime.openai_adapter._stream import Reply, ToolCall
from trioserve.spec import CompiledSpec, Resume


class Parked(Exception):
    """The turn waits for an approval: ``approval.requested`` was printed."""


class Turn:
    """Runs one turn of ``spec`` against the model, printing its events."""

    def __init__(self, spec: CompiledSpec, settings: Settings, emitter: Emitter) -> None:
        self.spec = spec
        self.settings = settings
        self.emit = emitter.emit
        self.usage = {"tokensIn": 0, "tokensOut": 0}
        self.rounds = 0
        self._pending: list[ToolCall] = []  # the calls of the last reply not run yet

    async def run(self, tools: ToolBox, model: ModelClient) -> None:
        """The turn, up to its final answer; ``Failure`` for what ends it otherwise,
        ``Parked`` when it waits for an approval."""
        context = self.spec.trioserve
        resume = context.resume if context is not None else None
        if resume is None:
            talk = conversation(self.spec, tools.functions, self._history_budget())
            self._warn_dropped(talk.kept_turns, talk.dropped_turns)
            messages = talk.messages
        else:
            messages = self._restore(resume)
            call = self._pending.pop(0)
            messages.append(await self._decided(tools, call, resume))
            await self._calls(tools, messages)
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
            self._pending = list(reply.tool_calls)
            await self._calls(tools, messages)

    async def _calls(self, tools: ToolBox, messages: list[dict[str, Any]]) -> None:
        """Run the pending calls in order; ``Parked`` at the first that needs an approval."""
        context = self.spec.trioserve
        approval = context.approval if context is not None else None
        while self._pending:
            call = self._pending[0]
            if approval is not None and approval.needs(call.name):
                self._park(messages, call)
            self._pending.pop(0)
            messages.append(await self._call(tools, call.id, call.name, call.arguments))

    def _park(self, messages: list[dict[str, Any]], call: ToolCall) -> None:
        state = {
            "messages": messages,
            "pending": [
                {"id": c.id, "name": c.name, "arguments": c.arguments} for c in self._pending
            ],
            "rounds": self.rounds,
            "usage": self.usage,
        }
        data = {"callId": call.id, "tool": call.name, "arguments": _parsed(call.arguments)}
        self.emit("approval.requested", {**data, "round": self.rounds, "state": state})
        raise Parked(call.id)

    def _restore(self, resume: Resume) -> list[dict[str, Any]]:
        state = resume.state
        try:
            messages = list(state["messages"])
            self._pending = [ToolCall(p["id"], p["name"], p["arguments"]) for p in state["pending"]]
            self.rounds = int(state["rounds"])
            self.usage = {k: int(v) for k, v in dict(state["usage"]).items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise Failure(
                "spec_invalid", f"trioserve.resume.state is not this adapter's: {exc!r}"
            ) from None
        if not self._pending or self._pending[0].id != resume.call_id:
            raise Failure(
                "spec_invalid", f"trioserve.resume: call {resume.call_id!r} is not the one pending"
            )
        return messages

    async def _decided(self, tools: ToolBox, call: ToolCall, resume: Resume) -> dict[str, Any]:
        """The decided call: run (approved, with the person's arguments if edited), or the
        model told it was denied and why."""
        if resume.decision == "approve":
            arguments = call.arguments
            if resume.arguments is not None:
                arguments = json.dumps(resume.arguments)
            return await self._call(tools, call.id, call.name, arguments)
        why = {"expired": " (nobody decided in time)", "interrupted": " (the turn was interrupted)"}
        text = f"The user denied this tool call{why.get(resume.reason or '', '')}."
        if resume.message:
            text += f" Their message: {resume.message}"
        data = {"toolName": call.name, "callId": call.id, "args": _parsed(call.arguments)}
        self.emit("tool.call", {**data, "round": self.rounds, "server": tools.server_of(call.name)})
        self.emit(
            "tool.result",
            {
                "toolName": call.name,
                "callId": call.id,
                "isError": True,
                "content": text,
                "durationMs": 0,
                "round": self.rounds,
                "error": {"reason": "approval_denied", "message": text},
            },
        )
        return {"role": "tool", "tool_call_id": call.id, "content": text}

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
        args = _parsed(arguments)  # as the model wrote it if not JSON; the call fails on it
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


def _parsed(arguments: str) -> Any:
    """A call's arguments as JSON if they are (the text as the model wrote it if not)."""
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return arguments


def _count(usage: dict[str, Any], key: str) -> int | None:
    value = usage.get(key)
    return value if type(value) is int else None
