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
  adapter), ``echo`` (the built-in echo adapter: needs no model or key) and
  ``openai`` (the built-in adapter for OpenAI-compatible model servers).
- ``runtime.command``: the adapter's argv, a non-empty list of non-empty
  strings.  Required for ``exec``, an error for every other type.
- ``runtime.options``: free-form adapter options, a mapping of strings to
  scalars (string, number, boolean).  Valid only for ``exec``, ``echo`` and
  ``openai``; the echo and openai options are checked by the compiler.

YAML is read with PyYAML's safe loader (YAML 1.1 scalars, so unquoted
``yes``/``no``/``on``/``off`` are booleans and unquoted dates are dates: the
errors say so), made stricter in one way: a duplicate key is an error.

The shared machinery (the strict base model, the problem messages, the
field-type helpers and YAML loading) is in :mod:`trioserve.validation`.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Final, Literal, TypeVar

from pydantic import BeforeValidator, Field, PrivateAttr

from trioserve.errors import SpecError
from trioserve.spec._validation import (
    Rule,
    StrictModel,
    describe,
    in_range,
    name_rule,
    one_of,
    parse_yaml,
    read_text,
    scalar,
    schema_object,
    validate_model,
)

# --- field types -----------------------------------------------------------------

AGENT_NAME_PATTERN: Final = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

_ApiVersion = Literal["agent-controller.dev/v1alpha1"]
ApiVersion = Annotated[_ApiVersion, one_of(_ApiVersion)]
NonEmptyStr = Annotated[str, Field(min_length=1)]
AgentName = Annotated[str, name_rule(AGENT_NAME_PATTERN, "lowercase letters, digits and '-'")]
ProviderName = Literal["anthropic", "openai", "google"]
RuntimeTypeName = Literal[
    "local",
    "local-pi",
    "local-opencode",
    "local-codex",
    "local-claude",
    "exec",
    "echo",
    "openai",
    "python",
]
RuntimeTypeRef = Literal["local", "local-pi", "local-opencode", "local-codex", "local-claude"]
TargetTypeName = Literal["local", "kubernetes"]
_TransportName = Literal["stdio", "streamable-http", "sse"]
_LifecycleName = Literal["eager", "lazy"]
_DetectorName = Literal["warn", "block", "correct"]
_WITH_OPTIONS: Final = ("exec", "echo", "openai", "python")
#: ``runtime.module`` of ``runtime.type: python``: ``package.module:function``.
_IDENTIFIER: Final = r"[A-Za-z_][A-Za-z0-9_]*"
MODULE_PATTERN: Final = rf"^{_IDENTIFIER}(\.{_IDENTIFIER})*:{_IDENTIFIER}$"
ModuleRef = Annotated[
    str,
    name_rule(
        MODULE_PATTERN, "'package.module:function' (a Python module and function)", max_length=200
    ),
]
Temperature = Annotated[float, in_range(0, 2)]
SchemaObject = Annotated[dict[str, Any], BeforeValidator(schema_object)]
OptionValue = Annotated[str | int | float | bool, BeforeValidator(scalar)]
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
    (``command`` is the adapter's argv), ``python`` (``module`` is the adapter's
    function, ``package.module:function``), ``echo`` or ``openai``.
    ``requirements`` are free-form boolean capability flags.  ``command`` is
    only valid, and is required, with ``exec``; ``module`` with ``python``;
    ``options`` are only valid with ``exec``, ``python``, ``echo`` and ``openai``.
    """

    type: Annotated[RuntimeTypeName, one_of(RuntimeTypeName)]
    requirements: dict[str, bool] | None = None
    command: Argv | None = None
    module: ModuleRef | None = None
    options: dict[str, OptionValue] | None = None

    @classmethod
    def object_rules(cls, data: dict[str, Any]) -> list[Rule]:
        kind = data.get("type")
        broken: list[Rule] = []
        if kind == "exec" and "command" not in data:
            broken.append((("command",), "required with runtime.type 'exec' (the adapter's argv)"))
        if kind != "exec" and "command" in data:
            broken.append((("command",), "only valid with runtime.type 'exec'"))
        if kind == "python" and "module" not in data:
            broken.append(
                (("module",), "required with runtime.type 'python' ('package.module:function')")
            )
        if kind != "python" and "module" in data:
            broken.append((("module",), "only valid with runtime.type 'python'"))
        if kind not in _WITH_OPTIONS and "options" in data:
            broken.append(
                (("options",), "only valid with runtime.type 'exec', 'python', 'echo' or 'openai'")
            )
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
