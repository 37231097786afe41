"""Which command starts a spec's runtime adapter."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.helpers import FAKE_ADAPTER
from trioserve.spec._runtimes import (
    RUNTIME_TYPES,
    RuntimeResolutionError,
    command_problem,
    resolve_command,
    split_command,
)

NODE_TYPES = {
    "local": "runtime",
    "local-pi": "runtime",
    "local-opencode": "runtime-opencode",
    "local-codex": "runtime-codex",
    "local-claude": "runtime-claude",
}


# --- precedence -----------------------------------------------------------------------


ECHO_COMMAND = [sys.executable, "-m", "trioserve.runtime.echo_adapter"]


def test_override_wins_over_env_and_type(tmp_path: Path) -> None:
    argv = resolve_command(
        "local",
        ["spec-cmd"],
        override=["my-adapter", "--flag"],
        env={"TRIOSERVE_RUNTIME_COMMAND": "env-adapter", "AGENT_CONTROLLER_RUNTIME": "/x.js"},
        cwd=tmp_path,
    )
    assert argv == ["my-adapter", "--flag"]


def test_override_wins_for_exec_and_unknown_types() -> None:
    assert resolve_command("exec", ["spec-cmd"], override=["o"], env={}) == ["o"]
    assert resolve_command("no-such-type", override=["o"], env={}) == ["o"]


def test_env_command_wins_over_type(tmp_path: Path) -> None:
    env = {"TRIOSERVE_RUNTIME_COMMAND": "python3 -m 'my adapter' --x=1"}
    expected = ["python3", "-m", "my adapter", "--x=1"]
    assert resolve_command("local", env=env, cwd=tmp_path) == expected
    assert resolve_command("exec", ["spec-cmd"], env=env) == expected
    assert resolve_command("echo", env=env)[0] == "python3"


def test_blank_env_command_is_ignored(tmp_path: Path) -> None:
    env = {"TRIOSERVE_RUNTIME_COMMAND": "   "}
    assert resolve_command("exec", ["a", "b"], env=env) == ["a", "b"]


def test_explicit_env_is_used_instead_of_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIOSERVE_RUNTIME_COMMAND", "from-os-environ")
    assert resolve_command("exec", ["a"], env={}) == ["a"]
    assert resolve_command("exec", ["a"]) == ["from-os-environ"]


# --- runtime types --------------------------------------------------------------------


@pytest.mark.parametrize(("runtime_type", "directory"), sorted(NODE_TYPES.items()))
def test_node_runtimes(runtime_type: str, directory: str, tmp_path: Path) -> None:
    argv = resolve_command(runtime_type, env={}, cwd=tmp_path)
    assert argv == ["node", str(tmp_path / directory / "dist" / "index.js")]


def test_node_runtime_defaults_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = resolve_command("local-codex", env={})
    assert argv == ["node", str(tmp_path / "runtime-codex" / "dist" / "index.js")]


@pytest.mark.parametrize("runtime_type", sorted(NODE_TYPES))
def test_agent_controller_runtime_replaces_the_script(runtime_type: str, tmp_path: Path) -> None:
    env = {"AGENT_CONTROLLER_RUNTIME": "/opt/adapter/main.js"}
    assert resolve_command(runtime_type, env=env, cwd=tmp_path) == ["node", "/opt/adapter/main.js"]


def test_agent_controller_runtime_does_not_affect_exec_or_echo() -> None:
    env = {"AGENT_CONTROLLER_RUNTIME": "/opt/adapter/main.js"}
    assert resolve_command("exec", ["./adapter"], env=env) == ["./adapter"]
    assert resolve_command("echo", env=env) == [
        sys.executable,
        "-m",
        "trioserve.runtime.echo_adapter",
    ]


def test_exec_uses_the_spec_command() -> None:
    argv = resolve_command("exec", ("python3", "adapter.py", "--verbose"), env={})
    assert argv == ["python3", "adapter.py", "--verbose"]


@pytest.mark.parametrize("command", [None, [], ()])
def test_exec_without_command_is_an_error(command: list[str] | None) -> None:
    with pytest.raises(RuntimeResolutionError, match=r"runtime\.command"):
        resolve_command("exec", command, env={})


def test_echo_runs_the_builtin_adapter_with_this_python() -> None:
    assert resolve_command("echo", env={}) == [
        sys.executable,
        "-m",
        "trioserve.runtime.echo_adapter",
    ]


def test_openai_runs_the_builtin_adapter_preloading_mcp_when_the_spec_has_servers() -> None:
    adapter = [sys.executable, "-m", "trioserve.runtime.openai_adapter"]
    assert resolve_command("openai", env={}) == adapter
    assert resolve_command("openai", env={}, mcp_servers=True) == [*adapter, "--preload-mcp"]


@pytest.mark.parametrize("runtime_type", ["docker", "", "LOCAL", "local-gemini"])
def test_unknown_type_lists_every_valid_type(runtime_type: str) -> None:
    with pytest.raises(RuntimeResolutionError) as info:
        resolve_command(runtime_type, env={})
    message = str(info.value)
    assert repr(runtime_type) in message
    listed = {
        name.strip() for name in message.rsplit(":", 1)[1].replace("expected one of", "").split(",")
    }
    assert listed == {*NODE_TYPES, "exec", "python", "echo", "openai"}
    assert set(RUNTIME_TYPES) == {*NODE_TYPES, "exec", "python", "echo", "openai"}


def test_resolution_error_is_a_value_error() -> None:
    assert issubclass(RuntimeResolutionError, ValueError)


# --- split_command --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "argv"),
    [
        ("node adapter.js", ["node", "adapter.js"]),
        ("  node   adapter.js  ", ["node", "adapter.js"]),
        ("'/opt/my adapter/run' --name \"a b\"", ["/opt/my adapter/run", "--name", "a b"]),
        ("python3 -c 'print(1)'", ["python3", "-c", "print(1)"]),
        ("echo $HOME ~", ["echo", "$HOME", "~"]),
        ('a "" b', ["a", "", "b"]),
        ("a\\ b c", ["a b", "c"]),
    ],
)
def test_split_command(text: str, argv: list[str]) -> None:
    assert split_command(text) == argv


@pytest.mark.parametrize("text", ["node 'adapter.js", 'node "adapter.js', "a\\"])
def test_split_command_rejects_unterminated_quotes(text: str) -> None:
    with pytest.raises(RuntimeResolutionError, match="cannot parse"):
        split_command(text)


@pytest.mark.parametrize("text", ["", "   ", "\t\n"])
def test_split_command_rejects_empty(text: str) -> None:
    with pytest.raises(RuntimeResolutionError, match="empty"):
        split_command(text)


def test_env_command_with_unterminated_quote_is_an_error() -> None:
    with pytest.raises(RuntimeResolutionError):
        resolve_command("echo", env={"TRIOSERVE_RUNTIME_COMMAND": "python3 'oops"})


# --- command_problem ------------------------------------------------------------------


def _fake_program(directory: Path, name: str) -> Path:
    path = directory / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def test_missing_program_is_flagged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    problem = command_problem(["no-such-adapter-program", "x"])
    assert problem is not None
    assert "no-such-adapter-program" in problem
    assert "not found" in problem


def test_missing_absolute_program_is_flagged(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope" / "adapter")
    problem = command_problem([missing])
    assert problem is not None
    assert missing in problem


def test_missing_node_script_is_flagged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_program(bin_dir, "node")
    monkeypatch.setenv("PATH", str(bin_dir))
    argv = resolve_command("local", env={}, cwd=tmp_path)
    problem = command_problem(argv)
    assert problem is not None
    assert str(tmp_path / "runtime" / "dist" / "index.js") in problem
    assert "does not exist" in problem


def test_existing_node_script_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_program(bin_dir, "node")
    monkeypatch.setenv("PATH", str(bin_dir))
    script = tmp_path / "runtime-claude" / "dist" / "index.js"
    script.parent.mkdir(parents=True)
    script.write_text("// adapter\n")
    assert command_problem(resolve_command("local-claude", env={}, cwd=tmp_path)) is None


def test_node_options_are_not_mistaken_for_a_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_program(tmp_path, "node")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert command_problem(["node", "--version"]) is None


def test_missing_python_script_is_flagged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_program(tmp_path, "python3")
    monkeypatch.setenv("PATH", str(tmp_path))
    problem = command_problem(["python3", str(tmp_path / "adapter.py")])
    assert problem is not None
    assert "adapter.py" in problem


def test_real_commands_pass() -> None:
    assert command_problem(resolve_command("echo", env={})) is None
    fake = FAKE_ADAPTER[1]
    assert command_problem([sys.executable, fake]) is None
    assert command_problem(["sh", "-c", "exit 0"]) is None


def test_a_python_module_is_called_by_the_fork_server_program() -> None:
    argv = resolve_command("python", module="pkg.adapter:main", env={})
    assert argv == [sys.executable, "-m", "trioserve.runtime.forkserver", "run", "pkg.adapter:main"]
    with pytest.raises(RuntimeResolutionError, match=r"runtime\.module"):
        resolve_command("python", env={})
