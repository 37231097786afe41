"""Reading a streamed Chat Completions reply (sans-IO: lines in, a reply out).

The wire (``POST /chat/completions`` with ``"stream": true``): server-sent
events whose ``data`` is a JSON chunk ``{"choices": [{"index": 0, "delta":
{...}, "finish_reason": ...}], "usage": ...}``, then ``data: [DONE]``.  A
delta carries ``content`` (text to append) and ``tool_calls``: pieces of
calls, each with its ``index``; the first piece of a call has its ``id`` and
``function.name``, and ``function.arguments`` (a JSON text) arrives in
pieces to join, as the OpenAI SDK joins them.  With ``stream_options:
{"include_usage": true}`` the last chunk has ``usage`` (and no choices).

Anything else is a malformed stream: a ``Failure`` with reason
``model_stream_malformed`` that says what was wrong.  An ``error`` object in
a chunk (some servers report a failure mid-stream that way) is the server's
failure (``_errors.error_in_stream``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final

from trioserve.runtime.openai_adapter._errors import error_in_stream
from trioserve.runtime.openai_adapter._events import Failure

DONE: Final = "[DONE]"


def malformed(why: str) -> Failure:
    return Failure(
        "model_stream_malformed",
        f"the model server sent a malformed reply stream: {why}; is OPENAI_BASE_URL an"
        " OpenAI-compatible /v1 endpoint?",
    )


class EventLines:
    """Server-sent event framing: ``feed`` a line, get the ``data`` of a completed event."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> str | None:
        if not line:
            data, self._data = self._data, []
            return "\n".join(data) if data else None
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None


@dataclass
class ToolCall:
    """One tool call of the model's message."""

    id: str
    name: str
    arguments: str


@dataclass
class Reply:
    """The model's message, whole: its text, its tool calls, why it stopped, its usage."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)


class ReplyBuilder:
    """Joins the chunks of one streamed reply; ``add`` returns the text each one adds."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self._calls: dict[int, dict[str, str]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] = {}
        self.done = False

    def add_data(self, data: str) -> str:
        """One event's ``data``: a JSON chunk or ``[DONE]``."""
        if self.done:
            raise malformed("data after [DONE]")
        if data.strip() == DONE:
            self.done = True
            return ""
        try:
            chunk = json.loads(data)
        except ValueError:
            raise malformed(f"a chunk is not JSON: {data[:200]!r}") from None
        return self.add(chunk)

    def add(self, chunk: Any) -> str:
        if not isinstance(chunk, dict):
            raise malformed(f"a chunk is not a JSON object: {json.dumps(chunk)[:200]}")
        if chunk.get("error") is not None:
            raise error_in_stream(chunk["error"])
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        choices = chunk.get("choices", [])
        if not isinstance(choices, list):
            raise malformed("'choices' is not a list")
        text = ""
        for choice in choices:
            if not isinstance(choice, dict):
                raise malformed("a choice is not an object")
            if choice.get("index", 0) == 0:
                text += self._choice(choice)
        return text

    def _choice(self, choice: dict[str, Any]) -> str:
        reason = choice.get("finish_reason")
        if reason is not None:
            self.finish_reason = str(reason)
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            raise malformed("'delta' is not an object")
        content = delta.get("content")
        if content is not None and not isinstance(content, str):
            raise malformed("'delta.content' is not a string")
        for piece in delta.get("tool_calls") or ():
            self._tool_piece(piece)
        if content:
            self._text.append(content)
        return content or ""

    def _tool_piece(self, piece: Any) -> None:
        if not isinstance(piece, dict) or type(piece.get("index", 0)) is not int:
            raise malformed("a tool call delta has no integer 'index'")
        call = self._calls.setdefault(piece.get("index", 0), {"id": "", "name": "", "args": ""})
        function = piece.get("function") or {}
        if not isinstance(function, dict):
            raise malformed("a tool call's 'function' is not an object")
        for key, value in (("id", piece.get("id")), ("name", function.get("name"))):
            if value is not None and not isinstance(value, str):
                raise malformed(f"a tool call's {key} is not a string")
        arguments = function.get("arguments")
        if arguments is not None and not isinstance(arguments, str):
            raise malformed("a tool call's arguments are not a string")
        if piece.get("id") and not call["id"]:
            call["id"] = piece["id"]
        call["name"] += function.get("name") or ""
        call["args"] += arguments or ""

    def reply(self) -> Reply:
        """The whole message, once the stream has ended."""
        if not self.done and self.finish_reason is None:
            raise malformed("the stream ended before the reply did (no finish_reason, no [DONE])")
        calls = []
        for index, call in sorted(self._calls.items()):
            if not call["name"]:
                raise malformed(f"tool call {index} has no function name")
            calls.append(ToolCall(call["id"] or f"call_{index}", call["name"], call["args"]))
        return Reply("".join(self._text), calls, self.finish_reason, self.usage)
