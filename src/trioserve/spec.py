"""ADL documents: pydantic models of an ``Agent`` and a ``RuntimeBinding``, and YAML loading.

The models enforce every rule of ``adl.v1alpha1.json`` and
``runtimebinding.v1alpha1.json``: required fields, constants, enums, patterns,
lengths, ranges, the conditional rules, and ``additionalProperties: false``
(an unknown field is an error).  Types are strict: YAML ``name: 123`` is not a
string and ``temperature: "0.2"`` is not a number (an integer temperature is a
number).  ``null`` is never a valid value for a field (it is not in either
schema): leave the field out instead.

Loading reports every problem at once as :class:`~trioserve.errors.SpecError`,
each problem ``"<YAML path>: <what was expected>"`` with the path spelled as in
the file (``spec.mcpServers[0].url``).  Nothing else escapes: unreadable files,
YAML syntax errors, empty documents and non-mapping documents are SpecErrors too.

trioserve extends ``spec.runtime`` beyond the reference schema:

- ``runtime.type`` also accepts ``exec`` (run ``runtime.command`` as the
  adapter) and ``echo`` (the built-in echo adapter: needs no model or key).
- ``runtime.command``: the adapter's argv, a non-empty list of non-empty
  strings.  Required for ``exec``, an error for every other type.
- ``runtime.options``: free-form adapter options, a mapping of strings to
  scalars (string, number, boolean).  Valid only for ``exec`` and ``echo``;
  the echo options are checked by :mod:`trioserve.compiler`.

YAML is read with PyYAML's safe loader (YAML 1.1 scalars, so unquoted
``yes``/``no``/``on``/``off`` are booleans and unquoted dates are dates: the
errors say so), made stricter in one way: a duplicate key is an error.
"""

from __future__ import annotations

import datetime
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Final, Literal, Self, TypeVar, get_args

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
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


def _in_range(low: float, high: float) -> AfterValidator:
    def check(value: float) -> float:
        if not low <= value <= high:
            raise problem(f"must be between {low:g} and {high:g}, got {value:g}")
        return value

    return AfterValidator(check)


def _schema_object(value: object) -> object:
    if isinstance(value, bool):
        raise problem(
            f"expected a mapping (a JSON Schema object; the boolean shorthand is not "
            f"supported, use {{}} to accept any JSON), got {describe(value)}"
        )
    return value


def _scalar(value: object) -> object:
    if isinstance(value, str | int | float):  # bool is an int
        return value
    raise problem(f"expected a string, number or boolean, got {describe(value)}")


AGENT_NAME_PATTERN: Final = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

_ApiVersion = Literal["agent-controller.dev/v1alpha1"]
ApiVersion = Annotated[_ApiVersion, one_of(_ApiVersion)]
NonEmptyStr = Annotated[str, Field(min_length=1)]
AgentName = Annotated[str, name_rule(AGENT_NAME_PATTERN, "lowercase letters, digits and '-'")]
ProviderName = Literal["anthropic", "openai", "google"]
RuntimeTypeName = Literal[
    "local", "local-pi", "local-opencode", "local-codex", "local-claude", "exec", "echo"
]
RuntimeTypeRef = Literal["local", "local-pi", "local-opencode", "local-codex", "local-claude"]
TargetTypeName = Literal["local", "kubernetes"]
_TransportName = Literal["stdio", "streamable-http", "sse"]
_LifecycleName = Literal["eager", "lazy"]
_DetectorName = Literal["warn", "block", "correct"]
Temperature = Annotated[float, _in_range(0, 2)]
SchemaObject = Annotated[dict[str, Any], BeforeValidator(_schema_object)]
OptionValue = Annotated[str | int | float | bool, BeforeValidator(_scalar)]
Argv = Annotated[list[NonEmptyStr], Field(min_length=1)]

# --- the Agent document ----------------------------------------------------------


class Metadata(StrictModel):
    """``metadata``: the agent's name (a DNS label, at most 63 characters) and who owns it."""

    name: AgentName
    owner: str | None = None
    description: str | None = None


class ModelSpec(StrictModel):
    """``spec.model``: provider, model name, optional temperature in [0, 2]."""

    provider: Annotated[ProviderName, one_of(ProviderName)]
    name: NonEmptyStr
    temperature: Temperature | None = None


class Persona(StrictModel):
    """``spec.persona``: the agent's role and standing instructions."""

    role: str | None = None
    instructions: str | None = None


class ToolRef(StrictModel):
    """``spec.tools[]``: a built-in (bash, read, edit, write) or registry tool, with config."""

    name: str
    config: dict[str, Any] | None = None


class ExtensionRef(StrictModel):
    """``spec.extensions[]``: from the registry, or from ``source`` (e.g. ``npm:<pkg>``)."""

    name: str
    source: NonEmptyStr | None = None
    config: dict[str, Any] | None = None


class SkillRef(StrictModel):
    """``spec.skills[]``: a skill in the registry."""

    name: str


class SubagentRef(StrictModel):
    """``spec.subagents[]``: a subagent in the registry."""

    name: str


class MCPServer(StrictModel):
    """``spec.mcpServers[]``: transport ``stdio`` needs ``command``, the others need ``url``."""

    name: NonEmptyStr
    transport: Annotated[_TransportName, one_of(_TransportName)]
    lifecycle: Annotated[_LifecycleName, one_of(_LifecycleName)] | None = None
    command: str | None = None
    args: list[str] | None = None
    env: dict[str, str] | None = None
    url: str | None = None
    headers: dict[str, str] | None = None

    @classmethod
    def object_rules(cls, data: dict[str, Any]) -> list[Rule]:
        transport = data.get("transport")
        if transport == "stdio" and "command" not in data:
            return [((), "transport 'stdio' requires 'command'")]
        if transport in ("streamable-http", "sse") and "url" not in data:
            return [((), f"transport '{transport}' requires 'url'")]
        return []


class Runtime(StrictModel):
    """``spec.runtime``: which adapter runs the agent, and what it must provide.

    ``type`` is one of the reference types or a trioserve extension, ``exec``
    (``command`` is the adapter's argv) or ``echo``.  ``requirements`` are
    free-form boolean capability flags.  ``command`` is only valid, and is
    required, with ``exec``; ``options`` are only valid with ``exec`` and ``echo``.
    """

    type: Annotated[RuntimeTypeName, one_of(RuntimeTypeName)]
    requirements: dict[str, bool] | None = None
    command: Argv | None = None
    options: dict[str, OptionValue] | None = None

    @classmethod
    def object_rules(cls, data: dict[str, Any]) -> list[Rule]:
        kind = data.get("type")
        broken: list[Rule] = []
        if kind == "exec" and "command" not in data:
            broken.append((("command",), "required with runtime.type 'exec' (the adapter's argv)"))
        if kind != "exec" and "command" in data:
            broken.append((("command",), "only valid with runtime.type 'exec'"))
        if kind not in ("exec", "echo") and "options" in data:
            broken.append((("options",), "only valid with runtime.type 'exec' or 'echo'"))
        return broken


class Guardrails(StrictModel):
    """``spec.guardrails``: the hallucination detector mode (the runtime's default: block)."""

    hallucination_detector: Annotated[_DetectorName, one_of(_DetectorName)] | None = Field(
        default=None, alias="hallucinationDetector"
    )


class Observability(StrictModel):
    """``spec.observability``: OpenTelemetry tracing and content capture (both off if absent)."""

    tracing: bool | None = None
    capture_content: bool | None = Field(default=None, alias="captureContent")


class AgentSpec(StrictModel):
    """``spec``: model, task, tools, runtime (required) and the optional rest."""

    model: ModelSpec
    persona: Persona | None = None
    task: NonEmptyStr
    output_schema: SchemaObject | None = Field(default=None, alias="outputSchema")
    tools: list[ToolRef]
    extensions: list[ExtensionRef] = []
    skills: list[SkillRef] = []
    subagents: list[SubagentRef] = []
    installs: list[NonEmptyStr] | None = None
    mcp_servers: list[MCPServer] | None = Field(default=None, alias="mcpServers")
    runtime: Runtime
    guardrails: Guardrails | None = None
    observability: Observability | None = None


class _Document(StrictModel):
    """A top-level document; ``source`` names where it was read from, for error messages."""

    _source: str = PrivateAttr(default="<string>")

    @property
    def source(self) -> str:
        """The file the document was read from, or ``"<string>"``."""
        return self._source


class AgentDocument(_Document):
    """A valid ``kind: Agent`` document."""

    api_version: ApiVersion = Field(alias="apiVersion")
    kind: Annotated[Literal["Agent"], one_of(Literal["Agent"])]
    metadata: Metadata
    spec: AgentSpec


# --- the RuntimeBinding document -----------------------------------------------


class BindingMetadata(StrictModel):
    """``metadata`` of a RuntimeBinding: a non-empty name."""

    name: NonEmptyStr
    description: str | None = None


class Selector(StrictModel):
    """``spec.selector``: the runtime type it hosts and the capabilities it provides."""

    runtime_type: Annotated[RuntimeTypeRef, one_of(RuntimeTypeRef)] = Field(alias="runtimeType")
    capabilities: dict[str, bool] | None = None


class SecretRef(StrictModel):
    """``target.kubernetes.secretRef``: the Secret holding adapter credentials."""

    name: NonEmptyStr
    keys: list[NonEmptyStr] | None = None


class KubernetesTarget(StrictModel):
    """``target.kubernetes`` (reference defaults: namespace ``default``, the v0.6 image)."""

    namespace: str | None = None
    image: str | None = None
    secret_ref: SecretRef | None = Field(default=None, alias="secretRef")


class Target(StrictModel):
    """``spec.target``: ``local`` or ``kubernetes`` (which requires ``kubernetes.secretRef``)."""

    type: Annotated[TargetTypeName, one_of(TargetTypeName)]
    runtime_command: str | None = Field(default=None, alias="runtimeCommand")
    strict: bool | None = None
    kubernetes: KubernetesTarget | None = None

    @classmethod
    def object_rules(cls, data: dict[str, Any]) -> list[Rule]:
        if data.get("type") != "kubernetes":
            return []
        why = "required with target.type 'kubernetes'"
        if "kubernetes" not in data:
            return [(("kubernetes",), why)]
        block = data["kubernetes"]
        if isinstance(block, dict) and "secretRef" not in block:
            return [(("kubernetes", "secretRef"), why)]
        return []


class BindingSpec(StrictModel):
    """``spec`` of a RuntimeBinding."""

    selector: Selector
    target: Target


class RuntimeBindingDocument(_Document):
    """A valid ``kind: RuntimeBinding`` document (trioserve validates it but does not serve it)."""

    api_version: ApiVersion = Field(alias="apiVersion")
    kind: Annotated[Literal["RuntimeBinding"], one_of(Literal["RuntimeBinding"])]
    metadata: BindingMetadata
    spec: BindingSpec


# --- loading ---------------------------------------------------------------------

Document = AgentDocument | RuntimeBindingDocument
D = TypeVar("D", bound=_Document)
DOCUMENT_KINDS: Final[dict[str, type[AgentDocument] | type[RuntimeBindingDocument]]] = {
    "Agent": AgentDocument,
    "RuntimeBinding": RuntimeBindingDocument,
}


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


def _validated(model: type[D], data: dict[str, Any], source: str) -> D:
    doc = validate_model(model, data, source)
    doc._source = source
    return doc


def _validate_document(data: dict[str, Any], source: str) -> Document:
    kind = data.get("kind", "Agent")  # without a kind, report it with the Agent's other problems
    model = DOCUMENT_KINDS.get(kind) if isinstance(kind, str) else None
    if model is None:
        valid = ", ".join(map(repr, DOCUMENT_KINDS))
        raise SpecError(source, [f"kind: expected one of {valid}, got {describe(kind)}"])
    return _validated(model, data, source)


def load_document(path_or_text: str | os.PathLike[str], *, source: str | None = None) -> Document:
    """Load an Agent or a RuntimeBinding, chosen by its ``kind``.

    A ``pathlib.Path`` (any ``os.PathLike``) is read from disk; a ``str`` is
    YAML text.  ``source`` names the document in errors (default: the path, or
    ``"<string>"``).  Raises SpecError listing every problem.
    """
    if isinstance(path_or_text, os.PathLike):
        text = read_text(path_or_text)
        name = source or os.fspath(path_or_text)
    else:
        text, name = path_or_text, source or "<string>"
    return _validate_document(parse_yaml(text, name), name)


def load_agent_text(text: str, source: str = "<string>") -> AgentDocument:
    """Load YAML text that must be an Agent; raise SpecError listing every problem."""
    data = parse_yaml(text, source)
    if data.get("kind") == "RuntimeBinding":
        raise SpecError(
            source, ["kind: expected Agent, got RuntimeBinding (a RuntimeBinding cannot be served)"]
        )
    return _validated(AgentDocument, data, source)


def load_agent(path: str | os.PathLike[str]) -> AgentDocument:
    """Load the Agent spec file at ``path``; raise SpecError listing every problem."""
    return load_agent_text(read_text(path), os.fspath(path))
