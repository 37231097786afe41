"""The A2A face's JSON-RPC pieces: its error codes, its error, and how params are read.

Shared by the binding (``_a2a.py``) and the push notification configs
(``_a2a_push.py``).
"""

from __future__ import annotations

from typing import Any, Final, TypeVar

from google.protobuf import json_format
from google.protobuf.message import Message as Proto

from trioserve.http import _a2a_tasks as tasks

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
REFUSED: Final = -32000
TASK_NOT_FOUND: Final = -32001
NOT_CANCELABLE: Final = -32002
PUSH_NOT_SUPPORTED: Final = -32003
UNSUPPORTED: Final = -32004
NO_EXTENDED_CARD: Final = -32007

M = TypeVar("M", bound=Proto)


class RpcError(Exception):
    """A JSON-RPC error to answer."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def parse_params(value: Any, message: M) -> M:
    """The request's ``params`` read into ``message`` (invalid params if they do not fit)."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise RpcError(INVALID_PARAMS, "params: expected an object")
    try:
        json_format.ParseDict(value, message, ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise RpcError(INVALID_PARAMS, f"params: {str(exc)[:300]}") from None
    return message


def task_ref(value: str) -> tuple[str, str]:
    """The session and turn of a task id (task not found if it names none)."""
    found = tasks.parse_task_id(value)
    if found is None:
        raise RpcError(TASK_NOT_FOUND, f"task {value[:100]!r} not found")
    return found
