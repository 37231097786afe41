"""Request and response bodies of the HTTP API (pydantic).

Request bodies are read the way the reference (Go's ``encoding/json``)
reads them, so its clients work unchanged: unknown fields are ignored
(logged at debug level), field names match case-insensitively, ``null``
leaves a field at its default (a ``null`` body is an empty one), and a
value of the wrong type is a ``400`` naming the field and what was
expected (types are strict: ``"1"`` is not a number, ``1`` not a string).
"""

from __future__ import annotations

import json
import logging
from typing import Any, TypeVar

from pydantic import ValidationError

from trioserve.errors import InvalidRequest
from trioserve.http._untrusted import parse_json
from trioserve.protocol import AgentModelOut, AgentOut, RequestBody
from trioserve.sessions import input_names
from trioserve.spec import CompiledSpec

log = logging.getLogger("trioserve.requests")


def agent_out(spec: CompiledSpec) -> AgentOut:
    """``GET /v1/agent``: what a client needs to know of the agent served, and no more."""
    return AgentOut(
        name=spec.metadata.name,
        description=spec.metadata.description,
        runtimeType=spec.runtime.type,
        model=AgentModelOut(provider=spec.model.provider, name=spec.model.name),
        task=spec.task,
        inputs=input_names(spec.task),
    )


_EXPECTED = {
    "string_type": "a string",
    "dict_type": "an object",
    "model_type": "an object",
    "bool_type": "a boolean",
    "int_type": "an integer",
}


def describe_validation_error(exc: ValidationError, what: str = "request body") -> str:
    """One line naming every bad field and what was expected."""
    parts = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "body"
        kind = err["type"]
        if kind == "missing":
            parts.append(f"{path}: field required")
        elif kind in _EXPECTED:
            parts.append(f"{path}: expected {_EXPECTED[kind]}, got {_json_type(err.get('input'))}")
        elif kind == "value_error":
            parts.append(f"{path}: {err.get('ctx', {}).get('error', err['msg'])}")
        elif kind == "literal_error":
            expected = err.get("ctx", {}).get("expected", "")
            parts.append(f"{path}: expected {expected}, got {_shown(err.get('input'))}")
        else:
            parts.append(f"{path}: {err['msg']}")
    return f"invalid {what}: " + "; ".join(parts)


def _shown(value: object) -> str:
    """``value`` as JSON, cut short (it came from the client)."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:60] + "..."


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


BodyT = TypeVar("BodyT", bound=RequestBody)


def parse_body(model: type[BodyT], raw: bytes) -> BodyT:
    """Parse a JSON body (see the module doc); an empty or ``null`` body means ``{}``.

    ``parse_json`` refuses what is not UTF-8, too deep or not valid Unicode
    (a lone surrogate, in any string or key) before the model sees it.
    """
    value = parse_json(raw, "request body") if raw.strip() else None
    if value is None:  # a required field is then missing: a 400 naming it
        return from_object(model, {})
    if not isinstance(value, dict):
        got = _json_type(value)
        raise InvalidRequest(f"invalid request body: expected a JSON object, got {got}")
    return from_object(model, value)


def from_object(model: type[BodyT], value: dict[str, Any], what: str = "request body") -> BodyT:
    """Validate a decoded JSON object as ``model``, as Go's ``encoding/json`` would.

    Each key goes to the field of the same name (else one whose name
    matches ignoring case; the last key wins); ``null`` is skipped; other
    keys are ignored and logged at debug level.  A bad value is an
    ``InvalidRequest`` naming the field.
    """
    fields: dict[str, Any] = {}
    unknown: list[str] = []
    for key, item in value.items():
        name = _field_of(model, key)
        if name is None:
            unknown.append(key)
        elif item is not None:
            fields[name] = item
    if unknown:
        names = ", ".join(repr(k[:64]) for k in sorted(unknown)[:10])
        more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
        log.debug("%s: ignored unknown field(s) %s%s", what, names, more)
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        raise InvalidRequest(describe_validation_error(exc, what)) from None


def _field_of(model: type[RequestBody], key: str) -> str | None:
    if key in model.model_fields:
        return key
    folded = key.casefold()
    return next((name for name in model.model_fields if name.casefold() == folded), None)
