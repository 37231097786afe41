"""Request and response bodies of the HTTP API (pydantic, strict)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import InvalidRequest
from .stores.base import Session


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class CreateSessionBody(_Body):
    """``POST /v1/sessions``: optional values for ``${inputs.<key>}`` in the task."""

    inputs: dict[str, str] = Field(default_factory=dict)


class TurnBody(_Body):
    """``POST /v1/sessions/{id}/turns``: the turn's input (empty: the session's task)."""

    input: str = ""


class SessionOut(BaseModel):
    """A session as the API shows it (the reference's fields plus ``lastActiveAt``)."""

    id: str
    agentName: str
    runtimeType: str
    status: str
    createdAt: str
    lastActiveAt: str

    @classmethod
    def of(cls, session: Session) -> SessionOut:
        return cls(
            id=session.id,
            agentName=session.agent_name,
            runtimeType=session.runtime_type,
            status=session.status.value,
            createdAt=rfc3339(session.created_at),
            lastActiveAt=rfc3339(session.last_active_at),
        )


class ErrorDetail(BaseModel):
    code: int
    message: str


class ErrorEnvelope(BaseModel):
    error: ErrorDetail


def rfc3339(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def describe_validation_error(exc: ValidationError) -> str:
    """One line naming every bad field and what was expected."""
    parts = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "body"
        kind = err["type"]
        if kind == "extra_forbidden":
            parts.append(f"{path}: unknown field")
        elif kind == "missing":
            parts.append(f"{path}: field required")
        elif kind in {"string_type", "dict_type", "model_type"}:
            expected = {"string_type": "a string", "dict_type": "an object"}.get(kind, "an object")
            parts.append(f"{path}: expected {expected}, got {_json_type(err.get('input'))}")
        else:
            parts.append(f"{path}: {err['msg']}")
    return "invalid request body: " + "; ".join(parts)


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


BodyT = TypeVar("BodyT", bound=_Body)


def parse_body(model: type[BodyT], raw: bytes) -> BodyT:
    """Parse a JSON body strictly; an empty body means ``{}``."""
    if not raw.strip():
        return model()
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidRequest(f"malformed JSON body: {exc}") from None
    if not isinstance(value, dict):
        got = _json_type(value)
        raise InvalidRequest(f"invalid request body: expected a JSON object, got {got}")
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise InvalidRequest(describe_validation_error(exc)) from None
