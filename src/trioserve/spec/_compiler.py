"""Compiling an Agent document into the :class:`CompiledSpec` an adapter receives.

:func:`compile_agent` resolves every reference of the spec (built-in tools,
registry manifests, ``source`` extensions), applies the adapter checks of the
chosen ``runtime.type``, and raises one :class:`~trioserve.errors.SpecError`
listing every problem, each ``"<spec path>: <what is wrong>"``.

Adapter checks (reference ``agentctl`` v0.8, plus trioserve's ``echo`` and ``openai``):

- ``local-opencode`` rejects extensions, installs and custom (non-built-in) tools;
- ``local-codex`` rejects the same, and subagents, and requires provider ``openai``;
- ``local-claude`` requires provider ``anthropic``;
- ``echo`` accepts only the options of :data:`ECHO_OPTIONS`;
- ``openai`` requires provider ``openai``, accepts only the options of
  :data:`OPENAI_OPTIONS` and MCP servers of transport ``stdio``, and rejects
  what it cannot honour: tools (its tools come from ``mcpServers``),
  extensions, skills, subagents, installs and an output schema.

An entry the runtime rejects is not looked up in the registry.

:func:`check_agent` makes the same checks without building the spec, and
can leave the registry out (``trioserve validate`` without ``--registry``):
it then returns the references it did not resolve.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Final, Literal

from pydantic import Field, ValidationError

from trioserve.errors import SpecError
from trioserve.spec._context import APPROVAL_OPTION, TurnContext, split_globs
from trioserve.spec._documents import (
    AgentDocument,
    AgentSpec,
    Guardrails,
    MCPServer,
    Metadata,
    ModelSpec,
    Observability,
    OptionValue,
    Persona,
    Runtime,
    load_agent,
)
from trioserve.spec._registry import EntryKind, Registry
from trioserve.spec._validation import StrictModel, describe, validation_problems

#: Tools the adapters provide themselves: no registry lookup, no config.
BUILTIN_TOOLS: Final = frozenset({"bash", "read", "edit", "write"})

#: Options of ``runtime.type: echo``: name -> (minimum, maximum or None, meaning).
#: Without ``chunkSize`` the whole reply is one message; ``delayMs`` defaults to 0.
ECHO_OPTIONS: Final[dict[str, tuple[int, int | None, str]]] = {
    "chunkSize": (1, None, "characters per streamed chunk"),
    "delayMs": (0, 60_000, "milliseconds between chunks"),
}

#: Options of ``runtime.type: openai`` (see docs/wire-protocol.md for their defaults).
OPENAI_OPTIONS: Final[dict[str, tuple[int, int | None, str]]] = {
    "contextTokens": (256, None, "the context budget in estimated tokens"),
    "maxTokens": (1, None, "the most tokens of one reply"),
    "maxToolRounds": (1, 100, "model and tool rounds per turn"),
    "toolTimeoutMs": (1, 3_600_000, "milliseconds a tool call may take"),
    "requestTimeoutMs": (1_000, 3_600_000, "milliseconds the model server may stay silent"),
    "mcpStartTimeoutMs": (1_000, 600_000, "milliseconds for MCP servers to start"),
}
_OPTIONS: Final = {"echo": ECHO_OPTIONS, "openai": OPENAI_OPTIONS}
_REQUIRED_PROVIDER: Final = {
    "local-codex": "openai",
    "local-claude": "anthropic",
    "openai": "openai",
}
_NO_CUSTOM: Final = frozenset({"local-opencode", "local-codex"})
_NO_SUBAGENTS: Final = frozenset({"local-codex", "openai"})
#: Runtimes whose tools come only from ``mcpServers``: no built-ins, skills or installs.
_MCP_ONLY: Final = frozenset({"openai"})
_NO_EXTENSIONS: Final = _NO_CUSTOM | _MCP_ONLY
_MCP_TRANSPORTS: Final = {"openai": ("stdio",)}


class Ref(StrictModel):
    """A resolved tool, extension, skill or subagent.

    Built-in tools have ``builtin: true``; registry entries an absolute
    ``entrypoint``; ``source`` extensions their ``source``.  ``config`` is the
    spec's, for tools and extensions.
    """

    name: str
    entrypoint: str | None = None
    source: str | None = None
    builtin: bool | None = None
    config: dict[str, Any] | None = None


class CompiledSpec(StrictModel):
    """What an adapter reads on stdin (CompiledSpec ``v: 1``); immutable.

    Field names are snake_case; :meth:`to_json_dict` gives the wire form with
    camelCase keys, and :meth:`from_json_dict` reads it back.
    """

    v: Literal[1] = 1
    metadata: Metadata
    model: ModelSpec
    persona: Persona | None = None
    task: str
    tools: list[Ref] = []
    extensions: list[Ref] = []
    skills: list[Ref] = []
    subagents: list[Ref] | None = None
    mcp_servers: list[MCPServer] | None = Field(default=None, alias="mcpServers")
    installs: list[str] | None = None
    runtime: Runtime
    guardrails: Guardrails | None = None
    observability: Observability | None = None
    output_schema: dict[str, Any] | None = Field(default=None, alias="outputSchema")
    session_id: str | None = Field(default=None, alias="sessionId")
    #: A turn's context from the server (``_context.py``): only for the runtime
    #: types that take it, never in ``trioserve compile``'s output.
    trioserve: TurnContext | None = None

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON object of the wire form: camelCase keys, absent fields left out.

        ``tools``, ``extensions`` and ``skills`` are always present (maybe
        empty); ``subagents`` only when the spec has some.  Values are plain
        JSON (a YAML date inside a ``config`` becomes its ISO string).
        """
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]) -> CompiledSpec:
        """Rebuild a CompiledSpec from :meth:`to_json_dict` output; SpecError if it is not one."""
        try:
            return cls.model_validate(data, by_alias=True, by_name=False)
        except ValidationError as exc:
            raise SpecError("<compiled spec>", validation_problems(exc)) from None

    def with_task(self, task: str) -> CompiledSpec:
        """A copy whose task is ``task`` (e.g. after ``${inputs.<key>}`` interpolation)."""
        return self.model_copy(update={"task": task})

    def with_turn(
        self, task: str, session_id: str, context: TurnContext | None = None
    ) -> CompiledSpec:
        """The spec of one turn: ``task`` = the turn input, ``sessionId`` and its context set."""
        return self.model_copy(
            update={"task": task, "session_id": session_id, "trioserve": context}
        )


def compile_agent(
    doc: AgentDocument, *, registry_dir: str | os.PathLike[str], task: str | None = None
) -> CompiledSpec:
    """Compile ``doc``, looking entries up in ``registry_dir``; ``task`` replaces the spec's task.

    Raises SpecError (source: ``doc.source``) listing every problem found.
    """
    spec = doc.spec
    compiler = _Compiler(spec, Registry(registry_dir))
    tools, extensions, skills, subagents = compiler.refs()
    if compiler.problems:
        raise SpecError(doc.source, compiler.problems)
    return CompiledSpec(
        metadata=doc.metadata,
        model=spec.model,
        persona=spec.persona,
        task=spec.task if task is None else task,
        tools=tools,
        extensions=extensions,
        skills=skills,
        subagents=subagents or None,
        mcp_servers=spec.mcp_servers,
        installs=spec.installs,
        runtime=spec.runtime,
        guardrails=spec.guardrails,
        observability=spec.observability,
        output_schema=spec.output_schema,
    )


def check_agent(doc: AgentDocument, *, registry_dir: str | os.PathLike[str] | None) -> list[str]:
    """Check ``doc`` as :func:`compile_agent` does; SpecError listing every problem.

    With ``registry_dir`` None, registry references are not looked up:
    they are returned (``"spec.tools[0]: Tool 'get_time'"``), and everything
    else is checked.  With a registry, the list is empty.
    """
    compiler = _Compiler(doc.spec, None if registry_dir is None else Registry(registry_dir))
    compiler.refs()
    if compiler.problems:
        raise SpecError(doc.source, compiler.problems)
    return compiler.unresolved


def compile_file(
    path: str | os.PathLike[str], *, registry_dir: str | os.PathLike[str], task: str | None = None
) -> CompiledSpec:
    """Load the Agent spec at ``path`` and compile it (SpecError on any problem)."""
    return compile_agent(load_agent(path), registry_dir=registry_dir, task=task)


class _Compiler:
    """Collects the refs and the problems of one compilation."""

    def __init__(self, spec: AgentSpec, registry: Registry | None) -> None:
        self.spec = spec
        self.runtime = spec.runtime.type
        self.registry = registry  # None: references are listed in unresolved, not looked up
        self.problems: list[str] = []
        self.unresolved: list[str] = []

    def refs(self) -> tuple[list[Ref], list[Ref], list[Ref], list[Ref]]:
        """Every check; the tools, extensions, skills and subagents."""
        tools = self.tools()
        extensions = self.extensions()
        skills = self.skills()
        subagents = self.subagents()
        self.check_adapter()
        return tools, extensions, skills, subagents

    def _reject(self, path: str, what: str, note: str = "") -> None:
        self.problems.append(f"{path}: {what} not supported by runtime.type '{self.runtime}'{note}")

    def tools(self) -> list[Ref]:
        refs = (
            self._tool(f"spec.tools[{i}]", t.name, t.config) for i, t in enumerate(self.spec.tools)
        )
        return [ref for ref in refs if ref]

    def _tool(self, path: str, name: str, config: dict[str, Any] | None) -> Ref | None:
        if self.runtime in _MCP_ONLY:
            self._reject(path, f"tool '{name}' is", " (its tools come from spec.mcpServers)")
            return None
        if name in BUILTIN_TOOLS:
            if config is not None:
                self.problems.append(f"{path}.config: built-in tool '{name}' takes no config")
            return Ref(name=name, builtin=True)
        if self.runtime in _NO_CUSTOM:
            builtins = ", ".join(sorted(BUILTIN_TOOLS))
            self._reject(path, f"custom tool '{name}' is", f" (only the built-ins {builtins} are)")
            return None
        return self._lookup(path, "Tool", name, config)

    def extensions(self) -> list[Ref]:
        if self.runtime in _NO_EXTENSIONS:
            if self.spec.extensions:
                self._reject("spec.extensions", "extensions are")
            return []
        refs = (
            self._lookup(f"spec.extensions[{i}]", "Extension", e.name, e.config)
            if e.source is None
            else Ref(name=e.name, source=e.source, config=e.config)
            for i, e in enumerate(self.spec.extensions)
        )
        return [ref for ref in refs if ref]

    def skills(self) -> list[Ref]:
        if self.runtime in _MCP_ONLY:
            if self.spec.skills:
                self._reject("spec.skills", "skills are")
            return []
        return self.entries("skills", "Skill", [s.name for s in self.spec.skills])

    def subagents(self) -> list[Ref]:
        if self.runtime in _NO_SUBAGENTS:
            if self.spec.subagents:
                self._reject("spec.subagents", "subagents are")
            return []
        return self.entries("subagents", "Subagent", [s.name for s in self.spec.subagents])

    def entries(self, field: str, kind: EntryKind, names: list[str]) -> list[Ref]:
        refs = (self._lookup(f"spec.{field}[{i}]", kind, name) for i, name in enumerate(names))
        return [ref for ref in refs if ref]

    def _lookup(
        self, path: str, kind: EntryKind, name: str, config: dict[str, Any] | None = None
    ) -> Ref | None:
        if self.registry is None:
            self.unresolved.append(f"{path}: {kind} {name!r}")
            return None
        try:
            entry = self.registry.lookup(kind, name)
        except SpecError as exc:
            self.problems.extend(f"{path}: {p}" for p in exc.problems)
            return None
        return Ref(name=name, entrypoint=entry.entrypoint, config=config)

    def check_adapter(self) -> None:
        """Checks of the runtime not tied to a reference (those are made as refs are built)."""
        spec, runtime = self.spec, self.runtime
        if runtime in _NO_EXTENSIONS and spec.installs:
            self._reject("spec.installs", "installs are")
        if runtime in _MCP_ONLY and spec.output_schema is not None:
            self._reject("spec.outputSchema", "an output schema is")
        provider = _REQUIRED_PROVIDER.get(runtime)
        if provider is not None and spec.model.provider != provider:
            self.problems.append(
                f"spec.model.provider: runtime.type '{runtime}' requires '{provider}', "
                f"got '{spec.model.provider}'"
            )
        if runtime in _OPTIONS:
            self.problems.extend(_option_problems(runtime, spec.runtime.options or {}))
        transports = _MCP_TRANSPORTS.get(runtime)
        for i, server in enumerate(spec.mcp_servers or ()):
            if transports is not None and server.transport not in transports:
                supported = ", ".join(transports)
                self.problems.append(
                    f"spec.mcpServers[{i}].transport: '{server.transport}' is not supported by"
                    f" runtime.type '{runtime}' (supported: {supported})"
                )


def _option_problems(runtime: str, options: Mapping[str, OptionValue]) -> list[str]:
    rules = _OPTIONS[runtime]
    problems = []
    for key, value in options.items():
        path = f"spec.runtime.options.{key}"
        if key == APPROVAL_OPTION and runtime == "openai":
            if type(value) is not str or not split_globs(value):
                problems.append(
                    f"{path}: expected tool names or globs, comma-separated"
                    f" (e.g. 'fs_*,shell'), got {describe(value)}"
                )
            continue
        rule = rules.get(key)
        if rule is None:
            valid = ", ".join([*rules, APPROVAL_OPTION] if runtime == "openai" else rules)
            problems.append(f"{path}: unknown option for runtime.type '{runtime}' (valid: {valid})")
            continue
        low, high, meaning = rule
        bounds = f">= {low}" if high is None else f"between {low} and {high}"
        ok = type(value) is int and value >= low and (high is None or value <= high)
        if not ok:
            problems.append(
                f"{path}: expected an integer {bounds} ({meaning}), got {describe(value)}"
            )
    return problems
