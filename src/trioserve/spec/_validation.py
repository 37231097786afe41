"""The machinery shared by every document model: strict validation and its messages.

This module holds:

- the *problems*: :func:`validation_problems` turns a pydantic
  ``ValidationError`` into ``"<YAML path>: <what was expected>"`` strings, the
  path spelled as in the file (``spec.mcpServers[0].url``, :func:`format_path`),
  values shown as YAML spells them (:func:`describe`), and :func:`problem`
  makes a validation error whose message is used verbatim;
- :class:`StrictModel`, the base of every document model, and
  :func:`validate_model`, which validates YAML data with it;
- field-type helpers for ``Annotated`` fields: :func:`one_of`,
  :func:`name_rule`, :func:`in_range`, :func:`schema_object`, :func:`scalar`;
- YAML loading: :func:`read_text` and :func:`parse_yaml`.

What it guarantees:

- A :class:`StrictModel` rejects unknown fields (``extra="forbid"``) and loose
  types (``strict``: ``"0.2"`` is not a number, ``123`` is not a string), and,
  when validated through :func:`validate_model`, a YAML ``null`` for a field:
  leave the field out instead.  The conditional rules of
  :meth:`StrictModel.object_rules` are reported together with every other error.
- Every problem is reported at once, in document order, each once.
- :func:`validate_model`, :func:`parse_yaml` and :func:`read_text` raise nothing
  but :class:`~trioserve.errors.SpecError`: unreadable files, non-UTF-8 text,
  YAML syntax errors, empty documents and non-mapping documents are SpecErrors.
- YAML is read with PyYAML's safe loader (YAML 1.1 scalars, so unquoted
  ``yes``/``no``/``on``/``off`` are booleans and unquoted dates are dates: the
  messages say so), made stricter in one way: a duplicate key is an error.
"""

from __future__ import annotations

import datetime
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Self, TypeVar, get_args

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ModelWrapValidatorHandler,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from trioserve.errors import SpecError

# --- problems: turning validation errors into "<path>: <expected>" -----------


class _Null:
    """Stands in for a YAML ``null`` given to a field, so that it fails the field's type."""

    def __repr__(self) -> str:
        return "null"


_NULL: Final = _Null()
_REJECT_NULL: Final = "trioserve.reject_null"


def problem(message: str) -> PydanticCustomError:
    """A validation error whose message is ``message``, verbatim."""
    return PydanticCustomError("problem", "{problem}", {"problem": message})


def describe(value: object) -> str:
    """Show a YAML value in a message: strings quoted, ``true``/``null`` as YAML spells them."""
    if value is None or value is _NULL:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = value if len(value) <= 60 else value[:57] + "..."
        return "'" + text.replace("\n", "\\n") + "'"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _yaml_hint(value: object) -> str:
    """Why YAML may have read ``value`` as something other than the string that was meant."""
    if isinstance(value, bool):
        return " (YAML reads unquoted true/false/yes/no/on/off as booleans: quote the value)"
    if isinstance(value, datetime.date):
        return " (YAML reads unquoted dates as dates: quote the value)"
    if isinstance(value, int | float):
        return " (quote the value to make it a string)"
    return ""


_EXPECTED: Final = {
    "string_type": "a string",
    "bool_type": "a boolean (true or false)",
    "float_type": "a number",
    "int_type": "an integer",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "list_type": "a list",
}


def _message(error: Mapping[str, Any]) -> str:
    kind: str = error["type"]
    ctx: dict[str, Any] = error.get("ctx") or {}
    value = error.get("input")
    if kind == "problem":
        return str(ctx["problem"])
    if kind == "missing":
        return "field required"
    if kind == "extra_forbidden":
        return "unknown field"
    if kind in _EXPECTED:
        hint = _yaml_hint(value) if kind == "string_type" else ""
        if isinstance(value, str) and kind in ("bool_type", "float_type", "int_type"):
            hint = " (a quoted value is a string)"
        return f"expected {_EXPECTED[kind]}, got {describe(value)}{hint}"
    if kind == "too_short":
        count = ctx["min_length"]
        return f"must have at least {count} item{'s' if count != 1 else ''}"
    if kind == "string_too_short":
        return "must not be empty"
    return str(error["msg"])


def format_path(loc: Sequence[int | str]) -> str:
    """``("spec", "tools", 0, "name")`` -> ``"spec.tools[0].name"``."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path or "<document>"


def _located(error: Mapping[str, Any]) -> tuple[tuple[int | str, ...], str]:
    """The path and message of a pydantic error; a bad mapping key is named by its mapping."""
    loc = tuple(error["loc"])
    if loc[-1:] == ("[key]",) or (error["type"] == "invalid_key" and loc):
        key = loc[-2] if loc[-1] == "[key]" else loc[-1]
        return loc[: -2 if loc[-1] == "[key]" else -1], f"key {describe(key)} must be a string"
    return loc, _message(error)


def validation_problems(exc: ValidationError) -> list[str]:
    """Every error of ``exc`` as ``"<YAML path>: <what was expected>"``, in document order."""
    located = (_located(e) for e in exc.errors())
    return list(dict.fromkeys(f"{format_path(loc)}: {message}" for loc, message in located))


# --- the strict base model -----------------------------------------------------

Rule = tuple[tuple[str, ...], str]


class StrictModel(BaseModel):
    """Base of every document model: unknown fields, loose types and ``null`` are errors.

    Subclasses state conditional rules (JSON Schema ``if``/``then``) in
    :meth:`object_rules`, checked on the raw mapping, so they are reported
    together with every other error of the document.
    """

    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, validate_by_name=True, validate_by_alias=True
    )

    @classmethod
    def object_rules(cls, data: dict[str, Any]) -> list[Rule]:
        """Conditional rules broken by the raw mapping ``data``: (relative path, message)."""
        return []

    @model_validator(mode="wrap")
    @classmethod
    def _check_object(
        cls, data: Any, handler: ModelWrapValidatorHandler[Self], info: ValidationInfo
    ) -> Self:
        if not isinstance(data, dict):
            return handler(data)
        if info.context and info.context.get(_REJECT_NULL):
            fields = {f.alias or name for name, f in cls.model_fields.items()}
            data = {k: _NULL if v is None and k in fields else v for k, v in data.items()}
        broken = [
            InitErrorDetails(type=problem(message), loc=loc, input=data)
            for loc, message in cls.object_rules(data)
        ]
        errors: list[InitErrorDetails] = []
        try:
            model = handler(data)
        except ValidationError as exc:
            if not broken:
                raise
            errors = [
                InitErrorDetails(type=problem(message), loc=loc, input=data)
                for loc, message in map(_located, exc.errors())
            ]
        else:
            if not broken:
                return model
        raise ValidationError.from_exception_data(cls.__name__, [*errors, *broken])


M = TypeVar("M", bound=StrictModel)


def validate_model(model: type[M], data: Mapping[str, Any], source: str) -> M:
    """Validate YAML data (fields by their YAML names only); raise SpecError with every problem."""
    try:
        return model.model_validate(
            data, context={_REJECT_NULL: True}, by_alias=True, by_name=False
        )
    except ValidationError as exc:
        raise SpecError(source, validation_problems(exc)) from None


# --- field types -----------------------------------------------------------------


def one_of(choices: Any) -> BeforeValidator:
    """Accept exactly the strings of the ``Literal`` ``choices``; name them all otherwise."""
    values: tuple[str, ...] = get_args(choices)
    expected = f"'{values[0]}'" if len(values) == 1 else "one of " + ", ".join(map(repr, values))

    def check(value: object) -> object:
        if isinstance(value, str) and value in values:
            return value
        raise problem(f"expected {expected}, got {describe(value)}")

    return BeforeValidator(check)


def name_rule(pattern: str, explain: str, max_length: int = 63) -> AfterValidator:
    """A name: at most ``max_length`` characters, matching ``pattern`` (explained in words)."""
    regex = re.compile(pattern, re.ASCII)

    def check(value: str) -> str:
        found = []
        if len(value) > max_length:
            found.append(f"must be at most {max_length} characters, got {len(value)}")
        if not regex.fullmatch(value):
            found.append(f"must match {pattern} ({explain}), got {describe(value)}")
        if found:
            raise problem("; ".join(found))
        return value

    return AfterValidator(check)


def in_range(low: float, high: float) -> AfterValidator:
    def check(value: float) -> float:
        if not low <= value <= high:
            raise problem(f"must be between {low:g} and {high:g}, got {value:g}")
        return value

    return AfterValidator(check)


def schema_object(value: object) -> object:
    if isinstance(value, bool):
        raise problem(
            f"expected a mapping (a JSON Schema object; the boolean shorthand is not "
            f"supported, use {{}} to accept any JSON), got {describe(value)}"
        )
    return value


def scalar(value: object) -> object:
    if isinstance(value, str | int | float):  # bool is an int
        return value
    raise problem(f"expected a string, number or boolean, got {describe(value)}")


# --- YAML loading ----------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing duplicate keys (which it would silently overwrite)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue
            key = self.construct_object(key_node)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "in a mapping",
                    node.start_mark,
                    f"found duplicate key {describe(key)}",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return f"invalid YAML: {exc}"
    mark = exc.problem_mark
    what = exc.problem or "syntax error"
    if exc.context:
        start = f" (from line {exc.context_mark.line + 1})" if exc.context_mark else ""
        what = f"{exc.context}{start}, {what}"
    return f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {what}"


def parse_yaml(text: str, source: str) -> dict[str, Any]:
    """Parse one YAML document that must be a mapping; raise SpecError otherwise."""
    try:
        data = yaml.load(text, Loader=_Loader)  # _Loader is a SafeLoader
    except yaml.YAMLError as exc:
        raise SpecError(source, [_yaml_problem(exc)]) from None
    expected = "a mapping with apiVersion, kind, metadata and spec"
    if data is None:
        raise SpecError(source, [f"the document is empty (expected {expected})"])
    if not isinstance(data, dict):
        raise SpecError(source, [f"the top level must be {expected}, got {describe(data)}"])
    return data


def read_text(path: str | os.PathLike[str]) -> str:
    """The UTF-8 text of ``path``; SpecError (``cannot read <path>: <reason>``) otherwise."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise SpecError(str(path), [f"cannot read {path}: {reason}"]) from None
    except UnicodeDecodeError as exc:
        reason = f"not UTF-8 text (bad byte at offset {exc.start})"
        raise SpecError(str(path), [f"cannot read {path}: {reason}"]) from None
