"""Compiling Agent documents: registry lookups, built-ins, adapter checks, the wire form."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import FIXTURES, ROOT
from tests.helpers import MINIMAL_AGENT as MINIMAL
from trioserve.errors import SpecError
from trioserve.runtime._process import adapter_input
from trioserve.spec._compiler import CompiledSpec, compile_agent, compile_file
from trioserve.spec._documents import AgentDocument, load_agent, load_agent_text

EXAMPLES = FIXTURES / "examples"
SPECS = FIXTURES / "specs"
REGISTRY = (FIXTURES / "registry").absolute()
REPO_EXAMPLES = ROOT / "examples"


def agent(**spec: object) -> AgentDocument:
    """MINIMAL with the given ``spec`` fields replaced."""
    doc = copy.deepcopy(MINIMAL)
    doc["spec"].update(spec)
    return load_agent_text(yaml.safe_dump(doc), "agent.yaml")


def compile_problems(doc: AgentDocument, registry: Path = REGISTRY) -> list[str]:
    with pytest.raises(SpecError) as info:
        compile_agent(doc, registry_dir=registry)
    assert info.value.source == doc.source
    return info.value.problems


def test_hello_compiles_against_the_registry() -> None:
    compiled = compile_file(EXAMPLES / "hello.yaml", registry_dir=REGISTRY)
    assert compiled.to_json_dict() == {
        "v": 1,
        "metadata": {
            "name": "hello",
            "owner": "ccdevelopforfun",
            "description": "MVP hello-world agent",
        },
        "model": {"provider": "anthropic", "name": "claude-sonnet-4-20250514", "temperature": 0.2},
        "persona": {
            "role": "Helpful demo assistant",
            "instructions": "Greet the user and tell them the current time using the get_time "
            "tool.\n",
        },
        "task": "Tell me the current UTC time.\n",
        "tools": [{"name": "get_time", "entrypoint": f"{REGISTRY}/tools/get_time/index.ts"}],
        "extensions": [
            {
                "name": "audit-log",
                "entrypoint": f"{REGISTRY}/extensions/audit-log/dist/index.js",
                "config": {"path": "./audit.log"},
            }
        ],
        "skills": [
            {
                "name": "example-time-skill",
                "entrypoint": f"{REGISTRY}/skills/example-time-skill/SKILL.md",
            }
        ],
        "runtime": {"type": "local"},
    }


def test_relative_registry_dir_is_taken_from_the_working_directory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(FIXTURES)
    compiled = compile_agent(load_agent(EXAMPLES / "hello.yaml"), registry_dir=Path("registry"))
    assert compiled.tools[0].entrypoint == f"{REGISTRY}/tools/get_time/index.ts"


@pytest.mark.parametrize(
    "name", ["guardrails-warn.yaml", "hello-claude.yaml", "mcp-time.yaml", "serve-test.yaml"]
)
def test_examples_without_registry_entries_compile_with_an_empty_registry(
    name: str, tmp_path: Path
) -> None:
    doc = load_agent(EXAMPLES / name)
    compiled = compile_agent(doc, registry_dir=tmp_path)
    wire = compiled.to_json_dict()
    assert (wire["tools"], wire["extensions"], wire["skills"]) == ([], [], [])
    assert "subagents" not in wire and "sessionId" not in wire
    assert wire["metadata"]["name"] == doc.metadata.name
    assert wire["runtime"] == {"type": doc.spec.runtime.type}


def test_mcp_time_compiled_form() -> None:
    wire = compile_file(EXAMPLES / "mcp-time.yaml", registry_dir="/nonexistent").to_json_dict()
    assert wire["mcpServers"] == [
        {
            "name": "time-server",
            "transport": "stdio",
            "lifecycle": "eager",
            "command": "npx",
            "args": ["-y", "@modelcontextprotocol/server-time"],
        }
    ]
    assert wire["task"].startswith("What is the current UTC time?")
    guard = compile_file(EXAMPLES / "guardrails-warn.yaml", registry_dir="/nonexistent")
    assert guard.to_json_dict()["guardrails"] == {"hallucinationDetector": "warn"}


def test_full_spec_compiles_every_field() -> None:
    wire = compile_file(SPECS / "full.yaml", registry_dir=REGISTRY).to_json_dict()
    assert list(wire) == [
        "v",
        "metadata",
        "model",
        "persona",
        "task",
        "tools",
        "extensions",
        "skills",
        "subagents",
        "mcpServers",
        "installs",
        "runtime",
        "guardrails",
        "observability",
        "outputSchema",
    ]
    assert wire["tools"] == [
        {"name": "bash", "builtin": True},
        {
            "name": "get_time",
            "entrypoint": f"{REGISTRY}/tools/get_time/index.ts",
            "config": {"zone": "UTC", "retries": 3, "nested": {"enabled": True, "none": None}},
        },
    ]
    assert wire["extensions"][1] == {"name": "remote-ext", "source": "npm:@acme/remote-ext"}
    assert wire["subagents"] == [
        {"name": "researcher", "entrypoint": f"{REGISTRY}/subagents/researcher/agent.md"}
    ]
    assert wire["runtime"] == {
        "type": "exec",
        "requirements": {"streaming": True, "gpu": False},
        "command": ["python3", "-m", "my_adapter"],
        "options": {"verbose": True, "level": 2, "ratio": 0.5, "mode": "fast"},
    }
    assert wire["observability"] == {"tracing": True, "captureContent": False}
    assert wire["installs"] == ["ripgrep"]


def test_round_trip_through_the_json_dict() -> None:
    compiled = compile_file(SPECS / "full.yaml", registry_dir=REGISTRY).with_turn("hi", "s_1")
    wire = compiled.to_json_dict()
    rebuilt = CompiledSpec.from_json_dict(wire)
    assert rebuilt == compiled
    assert rebuilt.to_json_dict() == wire


def _manager_stdin_before(wire: dict[str, Any], turn_input: str, session_id: str) -> bytes:
    """An adapter's stdin as the manager made it before the spec stayed typed: dict edits."""
    spec = dict(wire)
    spec["task"] = turn_input or str(spec.get("task", ""))
    spec["sessionId"] = session_id
    return json.dumps(spec, separators=(",", ":")).encode()


@pytest.mark.parametrize(
    "path",
    [SPECS / "full.yaml", EXAMPLES / "hello.yaml", EXAMPLES / "mcp-time.yaml"],
    ids=lambda p: p.name,
)
@pytest.mark.parametrize("turn_input", ['Grüß dich ✓ \u2028 "quoted"\n', ""])
def test_adapter_stdin_is_byte_for_byte_what_it_was(path: Path, turn_input: str) -> None:
    compiled = compile_file(path, registry_dir=REGISTRY).with_task("Hallo ${inputs.wer} ✓")
    stored = json.loads(json.dumps(compiled.to_json_dict()))  # a session's spec, as stores keep it
    spec = CompiledSpec.from_json_dict(stored)
    sent = adapter_input(spec.with_turn(turn_input or spec.task, "s_1"))
    assert sent == _manager_stdin_before(stored, turn_input, "s_1")
    assert sent.isascii() and b"\n" not in sent


def test_from_json_dict_rejects_what_is_not_a_compiled_spec() -> None:
    wire = compile_file(EXAMPLES / "hello.yaml", registry_dir=REGISTRY).to_json_dict()
    wire["v"] = 2
    wire["tools"][0]["colour"] = "red"
    del wire["runtime"]
    with pytest.raises(SpecError) as info:
        CompiledSpec.from_json_dict(wire)
    assert info.value.problems == [
        "v: Input should be 1",
        "tools[0].colour: unknown field",
        "runtime: field required",
    ]


def test_with_turn_sets_task_and_session_on_a_copy() -> None:
    compiled = compile_file(EXAMPLES / "serve-test.yaml", registry_dir="/nonexistent")
    turn = compiled.with_turn("What now?", "s_abc123")
    assert (turn.task, turn.session_id) == ("What now?", "s_abc123")
    assert turn.to_json_dict()["sessionId"] == "s_abc123"
    assert (compiled.task, compiled.session_id) == ("Say hello.\n", None)
    assert compiled.with_task("Hi Ada.").task == "Hi Ada."


def test_task_argument_overrides_the_spec_task() -> None:
    compiled = compile_agent(agent(), registry_dir=REGISTRY, task="Something else.")
    assert compiled.task == "Something else."


def test_subagents_appear_only_when_the_spec_has_some() -> None:
    assert (
        "subagents" not in compile_agent(agent(subagents=[]), registry_dir=REGISTRY).to_json_dict()
    )
    with_one = compile_agent(agent(subagents=[{"name": "researcher"}]), registry_dir=REGISTRY)
    assert with_one.to_json_dict()["subagents"] == [
        {"name": "researcher", "entrypoint": f"{REGISTRY}/subagents/researcher/agent.md"}
    ]


def test_echo_example_compiles_with_no_registry() -> None:
    wire = compile_file(REPO_EXAMPLES / "echo.yaml", registry_dir="/nonexistent").to_json_dict()
    assert wire["runtime"] == {"type": "echo", "options": {"chunkSize": 8, "delayMs": 40}}
    assert wire["metadata"]["name"] == "echo"
    assert "${inputs.name}" in wire["task"]
    assert wire["model"]["provider"] == "anthropic"
    assert wire["tools"] == []


# --- built-ins ----------------------------------------------------------------------


def test_builtin_tools_need_no_registry(tmp_path: Path) -> None:
    tools = [{"name": n} for n in ("bash", "read", "edit", "write")]
    compiled = compile_agent(agent(tools=tools), registry_dir=tmp_path)
    assert compiled.to_json_dict()["tools"] == [
        {"name": n, "builtin": True} for n in ("bash", "read", "edit", "write")
    ]


def test_config_on_a_builtin_is_an_error() -> None:
    doc = agent(tools=[{"name": "read"}, {"name": "bash", "config": {"timeout": 5}}])
    assert compile_problems(doc) == ["spec.tools[1].config: built-in tool 'bash' takes no config"]


# --- registry lookups -----------------------------------------------------------------


def test_missing_entries_are_named_with_where_they_were_looked_for(tmp_path: Path) -> None:
    doc = agent(
        tools=[{"name": "get_time"}],
        extensions=[{"name": "audit-log"}],
        skills=[{"name": "s1"}],
        subagents=[{"name": "helper"}],
    )
    looked = "manifest.yaml and manifest.yml"
    assert compile_problems(doc, tmp_path) == [
        f"spec.tools[0]: tool 'get_time' not found in registry {tmp_path} "
        f"(looked for tools/get_time/{looked})",
        f"spec.extensions[0]: extension 'audit-log' not found in registry {tmp_path} "
        f"(looked for extensions/audit-log/{looked})",
        f"spec.skills[0]: skill 's1' not found in registry {tmp_path} "
        f"(looked for skills/s1/{looked})",
        f"spec.subagents[0]: subagent 'helper' not found in registry {tmp_path} "
        f"(looked for subagents/helper/{looked})",
    ]


def test_a_missing_registry_directory_is_said_to_be_missing(tmp_path: Path) -> None:
    gone = tmp_path / "registry"
    assert compile_problems(agent(tools=[{"name": "get_time"}]), gone) == [
        f"spec.tools[0]: tool 'get_time' not found in registry {gone}, a directory that does "
        "not exist (looked for tools/get_time/manifest.yaml and manifest.yml)"
    ]


def test_a_name_that_cannot_be_in_a_registry_is_not_looked_up() -> None:
    assert compile_problems(agent(tools=[{"name": "../../etc"}, {"name": ""}])) == [
        "spec.tools[0]: '../../etc' cannot be a tool name in a registry: must match "
        "^[a-z0-9]([-_a-z0-9]*[a-z0-9])?$ (lowercase letters, digits, '-' and '_'), "
        "at most 63 characters",
        "spec.tools[1]: '' cannot be a tool name in a registry: must match "
        "^[a-z0-9]([-_a-z0-9]*[a-z0-9])?$ (lowercase letters, digits, '-' and '_'), "
        "at most 63 characters",
    ]


def test_extension_with_a_source_is_passed_through(tmp_path: Path) -> None:
    doc = agent(
        extensions=[
            {"name": "remote", "source": "npm:@acme/remote", "config": {"level": 2}},
            {"name": "local", "source": "./exts/local.ts"},
        ]
    )
    assert compile_agent(doc, registry_dir=tmp_path).to_json_dict()["extensions"] == [
        {"name": "remote", "source": "npm:@acme/remote", "config": {"level": 2}},
        {"name": "local", "source": "./exts/local.ts"},
    ]


def write_manifest(
    root: Path, folder: str, name: str, text: str, file: str = "manifest.yaml"
) -> Path:
    path = root / folder / name / file
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


def manifest(kind: str, name: str, entrypoint: str = "./main.js", **extra: str) -> str:
    lines = [
        "apiVersion: agent-controller.dev/v1alpha1",
        f"kind: {kind}",
        "metadata:",
        f"  name: {name}",
        "  version: 1.0.0",
        *(f"  {k}: {v}" for k, v in extra.items()),
        "spec:",
        f"  entrypoint: {entrypoint}",
    ]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("entrypoint", "expected"),
    [
        ("npm:@acme/tool", "npm:@acme/tool"),
        ("https://tools.example.com/t.js", "https://tools.example.com/t.js"),
        ("/opt/tools/t.js", "/opt/tools/t.js"),
        ("../shared/t.js", "{root}/tools/shared/t.js"),
        ("bin/t", "{root}/tools/t1/bin/t"),
    ],
)
def test_entrypoints_resolve_against_the_manifest_directory(
    entrypoint: str, expected: str, tmp_path: Path
) -> None:
    write_manifest(tmp_path, "tools", "t1", manifest("Tool", "t1", f"'{entrypoint}'"))
    compiled = compile_agent(agent(tools=[{"name": "t1"}]), registry_dir=tmp_path)
    assert compiled.tools[0].entrypoint == expected.format(root=tmp_path)


def test_invalid_manifest_problems_are_prefixed_with_its_path(tmp_path: Path) -> None:
    text = (
        "apiVersion: agent-controller.dev/v1\n"
        "kind: Tool\n"
        "metadata:\n  name: t1\n  version: '1.0'\n  license: MIT\n"
        "spec:\n  riskLevel: extreme\n  hooks: on-call\n  custom: kept\n"
    )
    path = write_manifest(tmp_path, "tools", "t1", text)
    assert compile_problems(agent(tools=[{"name": "t1"}]), tmp_path) == [
        f"spec.tools[0]: {path}: apiVersion: expected 'agent-controller.dev/v1alpha1', "
        "got 'agent-controller.dev/v1'",
        f"spec.tools[0]: {path}: metadata.version: must start with MAJOR.MINOR.PATCH "
        "(pattern ^\\d+\\.\\d+\\.\\d+), got '1.0'",
        f"spec.tools[0]: {path}: metadata.license: unknown field",
        f"spec.tools[0]: {path}: spec.entrypoint: field required",
        f"spec.tools[0]: {path}: spec.hooks: expected a list, got 'on-call'",
        f"spec.tools[0]: {path}: spec.riskLevel: expected one of 'low', 'medium', 'high', "
        "got 'extreme'",
    ]


def test_manifest_kind_and_name_must_match_the_reference(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, "tools", "t1", manifest("Skill", "t2"))
    assert compile_problems(agent(tools=[{"name": "t1"}]), tmp_path) == [
        f"spec.tools[0]: {path}: kind: expected 'Tool' (it is under tools/), got 'Skill'",
        f"spec.tools[0]: {path}: metadata.name: expected 't1' (the name it is referenced by), "
        "got 't2'",
    ]


def test_manifest_kind_mismatch_is_reported_with_its_other_problems(tmp_path: Path) -> None:
    path = write_manifest(
        tmp_path, "skills", "s1", manifest("Extension", "s1").replace("  version: 1.0.0\n", "")
    )
    assert compile_problems(agent(skills=[{"name": "s1"}]), tmp_path) == [
        f"spec.skills[0]: {path}: metadata.version: field required",
        f"spec.skills[0]: {path}: kind: expected 'Skill' (it is under skills/), got 'Extension'",
    ]


def test_unloadable_manifests(tmp_path: Path) -> None:
    broken = write_manifest(tmp_path, "tools", "t1", "kind: [Tool\n")
    empty = write_manifest(tmp_path, "skills", "s1", "", file="manifest.yml")
    doc = agent(tools=[{"name": "t1"}], skills=[{"name": "s1"}])
    assert compile_problems(doc, tmp_path) == [
        f"spec.tools[0]: {broken}: invalid YAML at line 2, column 1: while parsing a flow "
        "sequence (from line 1), expected ',' or ']', but got '<stream end>'",
        f"spec.skills[0]: {empty}: the document is empty (expected a mapping with apiVersion, "
        "kind, metadata and spec)",
    ]


def test_manifest_yml_is_found_and_yaml_wins_over_it(tmp_path: Path) -> None:
    write_manifest(tmp_path, "skills", "s1", manifest("Skill", "s1", "a.md"), file="manifest.yml")
    (tmp_path / "skills" / "s1" / "manifest.yaml").write_text(manifest("Skill", "s1", "b.md"))
    compiled = compile_agent(agent(skills=[{"name": "s1"}]), registry_dir=tmp_path)
    assert compiled.skills[0].entrypoint == f"{tmp_path}/skills/s1/b.md"


# --- adapter checks ---------------------------------------------------------------------


def test_opencode_rejects_extensions_installs_and_custom_tools() -> None:
    doc = agent(
        runtime={"type": "local-opencode"},
        tools=[{"name": "bash"}, {"name": "get_time"}],
        extensions=[{"name": "audit-log"}],
        installs=["ripgrep"],
    )
    assert compile_problems(doc) == [
        "spec.tools[1]: custom tool 'get_time' is not supported by runtime.type "
        "'local-opencode' (only the built-ins bash, edit, read, write are)",
        "spec.extensions: extensions are not supported by runtime.type 'local-opencode'",
        "spec.installs: installs are not supported by runtime.type 'local-opencode'",
    ]


def test_opencode_accepts_builtins_skills_and_subagents() -> None:
    doc = agent(
        runtime={"type": "local-opencode"},
        tools=[{"name": "write"}],
        skills=[{"name": "example-time-skill"}],
        subagents=[{"name": "researcher"}],
        extensions=[],
    )
    wire = compile_agent(doc, registry_dir=REGISTRY).to_json_dict()
    assert wire["tools"] == [{"name": "write", "builtin": True}]
    assert [s["name"] for s in wire["subagents"]] == ["researcher"]


def test_codex_requires_openai_and_rejects_subagents_and_extras() -> None:
    doc = agent(
        runtime={"type": "local-codex"},
        tools=[{"name": "get_time"}],
        extensions=[{"name": "x", "source": "npm:x"}],
        subagents=[{"name": "researcher"}],
    )
    assert compile_problems(doc) == [
        "spec.tools[0]: custom tool 'get_time' is not supported by runtime.type 'local-codex' "
        "(only the built-ins bash, edit, read, write are)",
        "spec.extensions: extensions are not supported by runtime.type 'local-codex'",
        "spec.subagents: subagents are not supported by runtime.type 'local-codex'",
        "spec.model.provider: runtime.type 'local-codex' requires 'openai', got 'anthropic'",
    ]


def test_codex_with_openai_and_builtins_compiles() -> None:
    doc = agent(
        runtime={"type": "local-codex"},
        model={"provider": "openai", "name": "gpt-5-codex"},
        tools=[{"name": "bash"}],
    )
    assert compile_agent(doc, registry_dir=REGISTRY).runtime.type == "local-codex"


def test_claude_requires_anthropic() -> None:
    doc = agent(runtime={"type": "local-claude"}, model={"provider": "google", "name": "gemini"})
    assert compile_problems(doc) == [
        "spec.model.provider: runtime.type 'local-claude' requires 'anthropic', got 'google'"
    ]
    ok = agent(runtime={"type": "local-claude"}, subagents=[{"name": "researcher"}])
    assert compile_agent(ok, registry_dir=REGISTRY).subagents is not None


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (
            {"speed": 2},
            [
                "spec.runtime.options.speed: unknown option for runtime.type 'echo' "
                "(valid: chunkSize, delayMs)"
            ],
        ),
        (
            {"chunkSize": 0},
            [
                "spec.runtime.options.chunkSize: expected an integer >= 1 "
                "(characters per streamed chunk), got 0"
            ],
        ),
        (
            {"chunkSize": "8", "delayMs": 60_001},
            [
                "spec.runtime.options.chunkSize: expected an integer >= 1 "
                "(characters per streamed chunk), got '8'",
                "spec.runtime.options.delayMs: expected an integer between 0 and 60000 "
                "(milliseconds between chunks), got 60001",
            ],
        ),
        (
            {"chunkSize": True, "delayMs": 1.5},
            [
                "spec.runtime.options.chunkSize: expected an integer >= 1 "
                "(characters per streamed chunk), got true",
                "spec.runtime.options.delayMs: expected an integer between 0 and 60000 "
                "(milliseconds between chunks), got 1.5",
            ],
        ),
    ],
)
def test_echo_options_are_checked(options: dict[str, object], expected: list[str]) -> None:
    assert compile_problems(agent(runtime={"type": "echo", "options": options})) == expected


def test_openai_example_compiles_with_no_registry() -> None:
    wire = compile_file(REPO_EXAMPLES / "openai.yaml", registry_dir="/nonexistent").to_json_dict()
    assert wire["runtime"]["type"] == "openai"
    assert wire["mcpServers"][0]["args"] == ["examples/time_server.py"]
    assert "trioserve" not in wire  # the turn's context is the server's, per turn


def test_openai_checks_what_its_adapter_cannot_honour() -> None:
    doc = agent(
        model={"provider": "anthropic", "name": "m"},
        tools=[{"name": "bash"}],
        skills=[{"name": "example-time-skill"}],
        installs=["npm:x"],
        mcpServers=[
            {"name": "a", "transport": "stdio", "command": "x"},
            {"name": "b", "transport": "sse", "url": "http://127.0.0.1:1/sse"},
        ],
        runtime={"type": "openai", "options": {"maxToolRounds": 0, "speed": 2}},
    )
    assert compile_problems(doc) == [
        "spec.tools[0]: tool 'bash' is not supported by runtime.type 'openai'"
        " (its tools come from spec.mcpServers)",
        "spec.skills: skills are not supported by runtime.type 'openai'",
        "spec.installs: installs are not supported by runtime.type 'openai'",
        "spec.model.provider: runtime.type 'openai' requires 'openai', got 'anthropic'",
        "spec.runtime.options.maxToolRounds: expected an integer between 1 and 100"
        " (model and tool rounds per turn), got 0",
        "spec.runtime.options.speed: unknown option for runtime.type 'openai' (valid:"
        " contextTokens, maxTokens, maxToolRounds, toolTimeoutMs, requestTimeoutMs,"
        " mcpStartTimeoutMs, requireApproval)",
        "spec.mcpServers[1].transport: 'sse' is not supported by runtime.type 'openai'"
        " (supported: stdio)",
    ]


def test_echo_options_at_their_bounds_compile() -> None:
    doc = agent(runtime={"type": "echo", "options": {"chunkSize": 1, "delayMs": 60_000}})
    assert compile_agent(doc, registry_dir=REGISTRY).runtime.options == {
        "chunkSize": 1,
        "delayMs": 60_000,
    }


def test_exec_options_are_free_form() -> None:
    doc = agent(runtime={"type": "exec", "command": ["./adapter"], "options": {"anything": "x"}})
    wire = compile_agent(doc, registry_dir=REGISTRY).to_json_dict()
    assert wire["runtime"] == {
        "type": "exec",
        "command": ["./adapter"],
        "options": {"anything": "x"},
    }


def test_every_compile_problem_is_reported_at_once(tmp_path: Path) -> None:
    doc = agent(
        runtime={"type": "local-claude"},
        model={"provider": "openai", "name": "gpt-4.1"},
        tools=[{"name": "edit", "config": {}}, {"name": "nope"}],
        skills=[{"name": "missing-skill"}],
    )
    with pytest.raises(SpecError) as info:
        compile_agent(doc, registry_dir=tmp_path)
    problems = info.value.problems
    assert [p.split(":")[0] for p in problems] == [
        "spec.tools[0].config",
        "spec.tools[1]",
        "spec.skills[0]",
        "spec.model.provider",
    ]
    assert str(info.value) == "agent.yaml: 4 problems: " + "; ".join(problems)
