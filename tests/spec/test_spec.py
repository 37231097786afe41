"""Loading and validating ADL documents: every schema rule, and the messages users see."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from tests.helpers import FIXTURES
from tests.helpers import MINIMAL_AGENT as MINIMAL
from trioserve.errors import SpecError
from trioserve.spec._documents import (
    AgentDocument,
    RuntimeBindingDocument,
    load_agent,
    load_agent_text,
    load_document,
)

EXAMPLES = FIXTURES / "examples"
SPECS = FIXTURES / "specs"
DELETE = object()


def changed(path: str, value: object, base: dict[str, Any] = MINIMAL) -> dict[str, Any]:
    """A copy of ``base`` with the dotted ``path`` set to ``value`` (or removed: DELETE)."""
    doc = copy.deepcopy(base)
    *parents, last = path.split(".")
    node: Any = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return doc


def problems_of(doc: dict[str, Any] | str) -> list[str]:
    text = doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False)
    with pytest.raises(SpecError) as info:
        load_agent_text(text, "spec.yaml")
    assert info.value.source == "spec.yaml"
    return info.value.problems


def test_minimal_agent_loads() -> None:
    doc = load_agent_text(yaml.safe_dump(MINIMAL))
    assert doc.metadata.name == "t"
    assert doc.spec.runtime.type == "local"
    assert doc.spec.extensions == [] and doc.spec.mcp_servers is None
    assert doc.source == "<string>"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_reference_examples_validate(path: Path) -> None:
    doc = load_document(path)
    assert doc.source == str(path)
    if path.name == "local-default.yaml":
        assert isinstance(doc, RuntimeBindingDocument)
        assert doc.spec.selector.runtime_type == "local-pi"
        assert doc.spec.selector.capabilities == {
            "streaming": True,
            "ephemeralFilesystem": False,
            "sandbox": False,
            "gpu": False,
            "restrictedNetwork": False,
        }
        assert doc.spec.target.type == "local"
    else:
        assert isinstance(doc, AgentDocument)
        assert load_agent(path) == doc


def test_example_fields_are_read_with_snake_case_names() -> None:
    doc = load_agent(EXAMPLES / "mcp-time.yaml")
    server = doc.spec.mcp_servers[0] if doc.spec.mcp_servers else None
    assert server is not None
    assert (server.name, server.transport, server.command, server.lifecycle) == (
        "time-server",
        "stdio",
        "npx",
        "eager",
    )
    assert server.args == ["-y", "@modelcontextprotocol/server-time"]
    warn = load_agent(EXAMPLES / "guardrails-warn.yaml")
    assert warn.spec.guardrails is not None
    assert warn.spec.guardrails.hallucination_detector == "warn"
    assert warn.spec.model.temperature == 0.2


def test_full_spec_loads_every_field() -> None:
    doc = load_agent(SPECS / "full.yaml")
    spec = doc.spec
    assert spec.output_schema is not None and spec.output_schema["required"] == ["answer"]
    assert spec.runtime.command == ["python3", "-m", "my_adapter"]
    assert spec.runtime.options == {"verbose": True, "level": 2, "ratio": 0.5, "mode": "fast"}
    assert [type(v) for v in (spec.runtime.options or {}).values()] == [bool, int, float, str]
    assert spec.observability is not None and spec.observability.capture_content is False
    assert spec.tools[1].config == {
        "zone": "UTC",
        "retries": 3,
        "nested": {"enabled": True, "none": None},
    }


def test_documents_are_immutable() -> None:
    doc = load_agent(EXAMPLES / "hello.yaml")
    with pytest.raises(ValidationError):
        doc.metadata.name = "other"  # type: ignore[misc]


# --- one rule each --------------------------------------------------------------

NAME_RULE = "must match ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ (lowercase letters, digits and '-')"
ALL_RUNTIMES = (
    "'local', 'local-pi', 'local-opencode', 'local-codex', 'local-claude', 'exec', 'echo',"
    " 'openai', 'python'"
)

RULES = [
    ("apiVersion", DELETE, "apiVersion: field required"),
    ("apiVersion", "v1", "apiVersion: expected 'agent-controller.dev/v1alpha1', got 'v1'"),
    ("kind", "Tool", "kind: expected 'Agent', got 'Tool'"),
    ("status", {}, "status: unknown field"),
    ("metadata", DELETE, "metadata: field required"),
    ("metadata.name", "Hello_World", f"metadata.name: {NAME_RULE}, got 'Hello_World'"),
    ("metadata.name", "-hello", f"metadata.name: {NAME_RULE}, got '-hello'"),
    ("metadata.name", "a" * 64, "metadata.name: must be at most 63 characters, got 64"),
    ("metadata.name", 123, "metadata.name: expected a string, got 123"),
    ("metadata.labels", {}, "metadata.labels: unknown field"),
    ("metadata.owner", ["me"], "metadata.owner: expected a string, got a list"),
    ("spec.model", DELETE, "spec.model: field required"),
    ("spec.model", "claude", "spec.model: expected a mapping, got 'claude'"),
    (
        "spec.model.provider",
        "foo",
        "spec.model.provider: expected one of 'anthropic', 'openai', 'google', got 'foo'",
    ),
    ("spec.model.name", "", "spec.model.name: must not be empty"),
    ("spec.model.name", DELETE, "spec.model.name: field required"),
    ("spec.model.temperature", 2.5, "spec.model.temperature: must be between 0 and 2, got 2.5"),
    ("spec.model.temperature", -1, "spec.model.temperature: must be between 0 and 2, got -1"),
    (
        "spec.model.temperature",
        "0.2",
        "spec.model.temperature: expected a number, got '0.2' (a quoted value is a string)",
    ),
    ("spec.model.temperature", True, "spec.model.temperature: expected a number, got true"),
    ("spec.model.topP", 1, "spec.model.topP: unknown field"),
    ("spec.persona.mood", "calm", "spec.persona.mood: unknown field"),
    ("spec.persona.role", 5, "spec.persona.role: expected a string, got 5"),
    ("spec.task", DELETE, "spec.task: field required"),
    ("spec.task", "", "spec.task: must not be empty"),
    ("spec.tools", DELETE, "spec.tools: field required"),
    ("spec.tools", {"name": "bash"}, "spec.tools: expected a list, got a mapping"),
    ("spec.tools", [{"config": {}}], "spec.tools[0].name: field required"),
    ("spec.tools", [{"name": "x", "config": [1]}], "spec.tools[0].config: expected a mapping"),
    ("spec.tools", [{"name": "x", "args": []}], "spec.tools[0].args: unknown field"),
    (
        "spec.extensions",
        [{"name": "x", "source": ""}],
        "spec.extensions[0].source: must not be empty",
    ),
    (
        "spec.extensions",
        [{"name": "x", "config": "on"}],
        "spec.extensions[0].config: expected a mapping, got 'on'",
    ),
    ("spec.skills", [{"name": "s", "version": "1"}], "spec.skills[0].version: unknown field"),
    ("spec.subagents", [{}], "spec.subagents[0].name: field required"),
    ("spec.installs", [""], "spec.installs[0]: must not be empty"),
    ("spec.installs", "ripgrep", "spec.installs: expected a list, got 'ripgrep'"),
    (
        "spec.mcpServers",
        [{"name": "m", "transport": "ws", "url": "ws://x"}],
        "spec.mcpServers[0].transport: expected one of 'stdio', 'streamable-http', 'sse', got 'ws'",
    ),
    (
        "spec.mcpServers",
        [{"name": "m", "transport": "stdio", "command": "x", "lifecycle": "now"}],
        "spec.mcpServers[0].lifecycle: expected one of 'eager', 'lazy', got 'now'",
    ),
    (
        "spec.mcpServers",
        [{"name": "m", "transport": "stdio"}],
        "spec.mcpServers[0]: transport 'stdio' requires 'command'",
    ),
    (
        "spec.mcpServers",
        [{"name": "m", "transport": "sse"}],
        "spec.mcpServers[0]: transport 'sse' requires 'url'",
    ),
    (
        "spec.mcpServers",
        [{"name": "m", "transport": "streamable-http", "command": "x"}],
        "spec.mcpServers[0]: transport 'streamable-http' requires 'url'",
    ),
    (
        "spec.mcpServers",
        [{"name": "", "transport": "sse", "url": "http://x"}],
        "spec.mcpServers[0].name: must not be empty",
    ),
    (
        "spec.mcpServers",
        [{"name": "m", "transport": "stdio", "command": "x", "env": {"N": 1}}],
        "spec.mcpServers[0].env.N: expected a string, got 1",
    ),
    (
        "spec.mcpServers",
        [{"name": "m", "transport": "sse", "url": "u", "headers": {"X": True}}],
        "spec.mcpServers[0].headers.X: expected a string, got true",
    ),
    ("spec.runtime", DELETE, "spec.runtime: field required"),
    ("spec.runtime.type", DELETE, "spec.runtime.type: field required"),
    (
        "spec.runtime.type",
        "docker",
        f"spec.runtime.type: expected one of {ALL_RUNTIMES}, got 'docker'",
    ),
    ("spec.runtime.colour", "blue", "spec.runtime.colour: unknown field"),
    (
        "spec.runtime.requirements",
        {"gpu": "yes"},
        "spec.runtime.requirements.gpu: expected a boolean (true or false), got 'yes'",
    ),
    (
        "spec.guardrails.hallucinationDetector",
        "ignore",
        "spec.guardrails.hallucinationDetector: expected one of 'warn', 'block', 'correct', "
        "got 'ignore'",
    ),
    ("spec.guardrails.strict", True, "spec.guardrails.strict: unknown field"),
    ("spec.observability.tracing", "true", "spec.observability.tracing: expected a boolean"),
    ("spec.observability.captureContent", 1, "spec.observability.captureContent: expected a"),
    ("spec.observability.metrics", True, "spec.observability.metrics: unknown field"),
    (
        "spec.outputSchema",
        True,
        "spec.outputSchema: expected a mapping (a JSON Schema object; the boolean shorthand "
        "is not supported, use {} to accept any JSON), got true",
    ),
    ("spec.outputSchema", ["a"], "spec.outputSchema: expected a mapping, got a list"),
    # Field names are the YAML (camelCase) ones: the Python names are unknown fields.
    ("spec.output_schema", {}, "spec.output_schema: unknown field"),
    # null is never valid (it is in no schema type), optional field or not.
    ("spec.persona", None, "spec.persona: expected a mapping, got null"),
    ("spec.tools", None, "spec.tools: expected a list, got null"),
    ("spec.model.temperature", None, "spec.model.temperature: expected a number, got null"),
]


@pytest.mark.parametrize(("path", "value", "expected"), RULES, ids=[r[2] for r in RULES])
def test_rule(path: str, value: object, expected: str) -> None:
    problems = problems_of(changed(path, value))
    assert len(problems) == 1, problems
    assert problems[0].startswith(expected), problems


def test_mapping_keys_must_be_strings() -> None:
    text = yaml.safe_dump(changed("spec.runtime.requirements", {1: True}), sort_keys=False)
    assert problems_of(text + "  2: x\n") == [
        "spec.runtime.requirements: key 1 must be a string",
        "spec: key 2 must be a string",
    ]


def test_integer_temperature_is_a_number() -> None:
    doc = load_agent_text(yaml.safe_dump(changed("spec.model.temperature", 1)))
    assert doc.spec.model.temperature == 1


def test_name_may_have_63_characters() -> None:
    doc = load_agent_text(yaml.safe_dump(changed("metadata.name", "a" * 63)))
    assert doc.metadata.name == "a" * 63


def test_name_with_several_faults_names_each() -> None:
    [problem] = problems_of(changed("metadata.name", "A" * 64))
    assert (
        problem
        == f"metadata.name: must be at most 63 characters, got 64; {NAME_RULE}, got '{'A' * 57}...'"
    )


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "owner: yes",
            "metadata.owner: expected a string, got true (YAML reads unquoted "
            "true/false/yes/no/on/off as booleans: quote the value)",
        ),
        (
            "owner: 2024-01-01",
            "metadata.owner: expected a string, got 2024-01-01 (YAML reads unquoted dates as "
            "dates: quote the value)",
        ),
        ("owner: 1.5", "metadata.owner: expected a string, got 1.5 (quote the value to make it a"),
        ("name: 123", "metadata.name: expected a string, got 123 (quote the value to make it a"),
    ],
)
def test_yaml_typing_quirks_are_explained(line: str, expected: str) -> None:
    text = yaml.safe_dump(MINIMAL, sort_keys=False).replace("  name: t\n", f"  {line}\n", 1)
    if not line.startswith("name"):
        text = text.replace("metadata:\n", "metadata:\n  name: t\n", 1)
    problems = problems_of(text)
    assert len(problems) == 1 and problems[0].startswith(expected), problems


def test_all_problems_are_reported_at_once() -> None:
    with pytest.raises(SpecError) as info:
        load_agent(SPECS / "many-problems.yaml")
    assert info.value.problems == [
        f"metadata.name: {NAME_RULE}, got 'Many_Problems'",
        "spec.model.provider: expected one of 'anthropic', 'openai', 'google', got 'mistral'",
        "spec.model.temperature: must be between 0 and 2, got 3",
        "spec.tools[0].name: field required",
        "spec.mcpServers[0]: transport 'stdio' requires 'command'",
        "spec.runtime.colour: unknown field",
    ]
    assert str(info.value).startswith(f"{SPECS / 'many-problems.yaml'}: 6 problems: metadata.name")


def test_conditional_rules_are_reported_with_the_other_errors_of_the_object() -> None:
    server = {"name": "m", "transport": "stdio", "args": "-y", "colour": 1}
    assert problems_of(changed("spec.mcpServers", [server])) == [
        "spec.mcpServers[0].args: expected a list, got '-y'",
        "spec.mcpServers[0].colour: unknown field",
        "spec.mcpServers[0]: transport 'stdio' requires 'command'",
    ]


# --- trioserve's runtime extensions ------------------------------------------------


def runtime(**fields: object) -> dict[str, Any]:
    return changed("spec.runtime", dict(fields))


def test_exec_runtime_with_command_and_options() -> None:
    doc = load_agent_text(
        yaml.safe_dump(runtime(type="exec", command=["node", "a.js"], options={"x": 1}))
    )
    assert doc.spec.runtime.command == ["node", "a.js"]
    assert doc.spec.runtime.options == {"x": 1}


def test_echo_runtime_takes_options_but_no_command() -> None:
    doc = load_agent_text(yaml.safe_dump(runtime(type="echo", options={"chunkSize": 4})))
    assert doc.spec.runtime.options == {"chunkSize": 4}
    assert problems_of(runtime(type="echo", command=["x"])) == [
        "spec.runtime.command: only valid with runtime.type 'exec'"
    ]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"type": "exec"},
            ["spec.runtime.command: required with runtime.type 'exec' (the adapter's argv)"],
        ),
        ({"type": "exec", "command": []}, ["spec.runtime.command: must have at least 1 item"]),
        ({"type": "exec", "command": ["node", ""]}, ["spec.runtime.command[1]: must not be empty"]),
        (
            {"type": "exec", "command": "node a.js"},
            ["spec.runtime.command: expected a list, got 'node a.js'"],
        ),
        (
            {"type": "exec", "command": ["node", 1]},
            [
                "spec.runtime.command[1]: expected a string, got 1 "
                "(quote the value to make it a string)"
            ],
        ),
        (
            {"type": "local", "command": ["node"]},
            ["spec.runtime.command: only valid with runtime.type 'exec'"],
        ),
        (
            {"type": "local-claude", "options": {"a": 1}},
            [
                "spec.runtime.options: only valid with runtime.type 'exec', 'python', 'echo' or"
                " 'openai'"
            ],
        ),
        (
            {"type": "python"},
            [
                "spec.runtime.module: required with runtime.type 'python'"
                " ('package.module:function')"
            ],
        ),
        (
            {"type": "exec", "command": ["x"], "module": "a.b:main"},
            ["spec.runtime.module: only valid with runtime.type 'python'"],
        ),
        (
            {"type": "python", "module": "a.b"},
            ["spec.runtime.module: must match ^[A-Za-z_]"],
        ),
        (
            {"type": "exec", "command": ["x"], "options": {"a": [1], "b": None}},
            [
                "spec.runtime.options.a: expected a string, number or boolean, got a list",
                "spec.runtime.options.b: expected a string, number or boolean, got null",
            ],
        ),
        ({"type": "exec", "command": ["x"], "options": []}, ["spec.runtime.options: expected a"]),
    ],
)
def test_runtime_extension_rules(fields: dict[str, object], expected: list[str]) -> None:
    problems = problems_of(runtime(**fields))
    assert len(problems) == len(expected), problems
    for problem, start in zip(problems, expected, strict=True):
        assert problem.startswith(start), problems


# --- documents by kind, and loading failures -------------------------------------------


def test_load_agent_refuses_a_runtime_binding() -> None:
    with pytest.raises(SpecError) as info:
        load_agent(EXAMPLES / "local-default.yaml")
    assert info.value.problems == [
        "kind: expected Agent, got RuntimeBinding (a RuntimeBinding cannot be served)"
    ]


def test_load_document_names_the_valid_kinds() -> None:
    with pytest.raises(SpecError) as info:
        load_document(yaml.safe_dump(changed("kind", "Tool")))
    assert info.value.problems == ["kind: expected one of 'Agent', 'RuntimeBinding', got 'Tool'"]
    assert info.value.source == "<string>"


def test_document_without_kind_is_checked_as_an_agent() -> None:
    with pytest.raises(SpecError) as info:
        load_document(yaml.safe_dump(changed("kind", DELETE)), source="x.yaml")
    assert info.value.problems == ["kind: field required"]
    assert info.value.source == "x.yaml"


def test_load_document_reads_a_path_and_parses_a_string() -> None:
    text = (EXAMPLES / "hello.yaml").read_text()
    from_text, from_file = load_document(text), load_document(EXAMPLES / "hello.yaml")
    assert from_text.model_dump() == from_file.model_dump()
    assert (from_text.source, from_file.source) == ("<string>", str(EXAMPLES / "hello.yaml"))


def test_kubernetes_binding_validates() -> None:
    doc = load_document(SPECS / "binding-kubernetes.yaml")
    assert isinstance(doc, RuntimeBindingDocument)
    assert doc.spec.target.kubernetes is not None
    assert doc.spec.target.kubernetes.secret_ref is not None
    assert doc.spec.target.kubernetes.secret_ref.keys == ["ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"]


BINDING = yaml.safe_load((EXAMPLES / "local-default.yaml").read_text())


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (
            "spec.target",
            {"type": "kubernetes"},
            "spec.target.kubernetes: required with target.type 'kubernetes'",
        ),
        (
            "spec.target",
            {"type": "kubernetes", "kubernetes": {"namespace": "a"}},
            "spec.target.kubernetes.secretRef: required with target.type 'kubernetes'",
        ),
        (
            "spec.target",
            {"type": "kubernetes", "kubernetes": {"secretRef": {"name": ""}}},
            "spec.target.kubernetes.secretRef.name: must not be empty",
        ),
        (
            "spec.target.type",
            "databricks",
            "spec.target.type: expected one of 'local', 'kubernetes', got 'databricks'",
        ),
        ("spec.target.strict", "no", "spec.target.strict: expected a boolean"),
        ("spec.target.image", "x", "spec.target.image: unknown field"),
        (
            "spec.selector.runtimeType",
            "exec",
            "spec.selector.runtimeType: expected one of 'local', 'local-pi', 'local-opencode', "
            "'local-codex', 'local-claude', got 'exec'",
        ),
        ("spec.selector.capabilities", {"gpu": 1}, "spec.selector.capabilities.gpu: expected a"),
        ("metadata.name", "", "metadata.name: must not be empty"),
        ("metadata.owner", "me", "metadata.owner: unknown field"),
        ("spec.target", DELETE, "spec.target: field required"),
    ],
)
def test_binding_rule(path: str, value: object, expected: str) -> None:
    with pytest.raises(SpecError) as info:
        load_document(yaml.safe_dump(changed(path, value, BINDING)))
    assert len(info.value.problems) == 1, info.value.problems
    assert info.value.problems[0].startswith(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "the document is empty (expected a mapping with apiVersion, kind, metadata and spec)"),
        ("# only a comment\n", "the document is empty"),
        ("- a\n- b\n", "the top level must be a mapping with apiVersion, kind, metadata and spec"),
        ("just words", "the top level must be a mapping"),
        (
            "kind: Agent\nmetadata:\n  name: [a\n",
            "invalid YAML at line 4, column 1: while parsing a flow sequence (from line 3), "
            "expected ',' or ']', but got '<stream end>'",
        ),
        (
            "kind: Agent\nkind: Agent\n",
            "invalid YAML at line 2, column 1: in a mapping (from line 1), "
            "found duplicate key 'kind'",
        ),
        (
            "a: 1\n---\nb: 2\n",
            "invalid YAML at line 2, column 1: expected a single document in the stream "
            "(from line 1), but found another document",
        ),
    ],
)
def test_unloadable_text(text: str, expected: str) -> None:
    with pytest.raises(SpecError) as info:
        load_agent_text(text, "bad.yaml")
    [problem] = info.value.problems
    assert problem.startswith(expected), problem
    assert str(info.value) == f"bad.yaml: 1 problem: {problem}"


def test_yaml_merge_keys_are_not_duplicates() -> None:
    text = yaml.safe_dump(MINIMAL, sort_keys=False).replace(
        "  model:\n", "  x-base: &m {provider: openai}\n  model:\n    <<: *m\n", 1
    )
    assert problems_of(text) == ["spec.x-base: unknown field"]


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SpecError) as info:
        load_agent(missing)
    assert info.value.problems == [f"cannot read {missing}: No such file or directory"]
    assert info.value.source == str(missing)


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        load_document(tmp_path)
    assert info.value.problems == [f"cannot read {tmp_path}: Is a directory"]
    binary = tmp_path / "spec.yaml"
    binary.write_bytes(b"kind: \xff\xfe\n")
    with pytest.raises(SpecError) as info:
        load_agent(binary)
    assert info.value.problems == [f"cannot read {binary}: not UTF-8 text (bad byte at offset 6)"]
