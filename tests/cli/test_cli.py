"""``trioserve validate`` and ``compile``, ``--help``, and bad flags, as a user runs them."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path

import httpx
import pytest
import trio

from tests.helpers import FIXTURES, run_cli, start_cli_server, write_spec
from trioserve.cli import build_parser
from trioserve.cli.run import server_config
from trioserve.config import ServerConfig
from trioserve.sessions._limits import Limits

EXAMPLES = sorted((FIXTURES / "examples").glob("*.yaml"))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_reference_example_validates(example: Path, tmp_path: Path) -> None:
    result = run_cli(tmp_path, "validate", str(example))
    assert result.returncode == 0, result.stderr
    assert "valid" in result.stdout


def test_compile_prints_the_compiled_spec(tmp_path: Path) -> None:
    registry = FIXTURES / "registry"
    result = run_cli(
        tmp_path, "compile", str(FIXTURES / "examples" / "hello.yaml"), "--registry", str(registry)
    )
    assert result.returncode == 0, result.stderr
    compiled = json.loads(result.stdout)
    assert compiled["v"] == 1 and compiled["metadata"]["name"] == "hello"
    assert [t["name"] for t in compiled["tools"]] == ["get_time"]
    assert compiled["tools"][0]["entrypoint"].startswith(str(registry.resolve()))
    assert compiled["extensions"][0]["config"] == {"path": "./audit.log"}


def test_compile_without_registry_names_every_missing_entry(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "compile", str(FIXTURES / "examples" / "hello.yaml"))
    assert result.returncode == 2
    assert "3 problems" in result.stderr
    for name in ("get_time", "audit-log", "example-time-skill"):
        assert name in result.stderr
    assert "Traceback" not in result.stderr


def test_validate_lists_every_problem(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "validate", str(FIXTURES / "specs" / "many-problems.yaml"))
    assert result.returncode == 2
    problems = [line for line in result.stderr.splitlines() if line.startswith("  - ")]
    assert len(problems) >= 3
    assert any("spec.model.provider" in p for p in problems)
    assert "Traceback" not in result.stderr


def test_version_and_module_entry_point(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "--version")
    assert result.returncode == 0 and result.stdout.startswith("trioserve ")


# -- validate: what compile and run check ---------------------------------------------


def test_validate_without_registry_says_references_were_not_resolved(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "validate", str(FIXTURES / "examples" / "hello.yaml"))
    assert result.returncode == 0, result.stderr
    valid, note = result.stdout.splitlines()
    assert valid.endswith("valid Agent 'hello'")
    assert "3 registry references not resolved" in note and "--registry DIR" in note


def test_validate_with_registry_resolves_references(tmp_path: Path) -> None:
    hello = str(FIXTURES / "examples" / "hello.yaml")
    result = run_cli(tmp_path, "validate", hello, "--registry", str(FIXTURES / "registry"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"{hello}: valid Agent 'hello'"]
    # An empty registry: the same three problems as compile reports.
    empty = tmp_path / "registry"
    empty.mkdir()
    result = run_cli(tmp_path, "validate", hello, "--registry", str(empty))
    assert result.returncode == 2 and result.stdout == ""
    assert "3 problems" in result.stderr
    for name in ("tool 'get_time'", "extension 'audit-log'", "skill 'example-time-skill'"):
        assert name in result.stderr
    assert "Traceback" not in result.stderr


def test_validate_without_references_prints_one_line(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "validate", str(FIXTURES / "specs" / "binding-kubernetes.yaml"))
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1 and "not resolved" not in result.stdout
    spec = write_spec(tmp_path, runtime="echo")
    result = run_cli(tmp_path, "validate", str(spec))
    assert result.stdout.splitlines() == [f"{spec}: valid Agent 'cli-agent'"]


@pytest.mark.parametrize(
    ("runtime", "provider", "expected"),
    [
        ("echo\n    options: {chunkSize: 0}", "anthropic", "spec.runtime.options.chunkSize"),
        ("local-codex", "anthropic", "runtime.type 'local-codex' requires 'openai'"),
    ],
)
def test_validate_makes_the_adapter_checks_of_the_compiler(
    tmp_path: Path, runtime: str, provider: str, expected: str
) -> None:
    spec = tmp_path / "agent.yaml"
    spec.write_text(
        "apiVersion: agent-controller.dev/v1alpha1\nkind: Agent\nmetadata: {name: a}\n"
        f"spec:\n  model: {{provider: {provider}, name: m}}\n  task: hi\n  tools: []\n"
        f"  runtime:\n    type: {runtime}\n"
    )
    for extra in ([], ["--registry", str(FIXTURES / "registry")]):
        result = run_cli(tmp_path, "validate", str(spec), *extra)
        assert result.returncode == 2, result.stdout
        assert "1 problem:" in result.stderr and expected in result.stderr
    # compile refuses it for the same reason.
    result = run_cli(tmp_path, "compile", str(spec))
    assert result.returncode == 2 and expected in result.stderr


# -- flags: help with defaults, clear errors ------------------------------------------

SUBCOMMANDS = ["run", "validate", "compile", "chat", "sessions"]
_ENTRY = re.compile(r"^  (-\S.*?|[a-z]\S*)(?:\s{2,}(\S.*))?$")


def help_sections(text: str) -> dict[str, dict[str, str]]:
    """``--help`` text as {section: {first flag or positional name: help text}}.

    Wrapped help lines are joined with single spaces.
    """
    sections: dict[str, dict[str, str]] = {}
    entries: dict[str, str] | None = None
    name = ""
    for line in text.splitlines():
        if line.endswith(":") and not line.startswith(" "):
            entries = sections.setdefault(line[:-1], {})
        elif entries is not None and (match := _ENTRY.match(line)):
            name = match.group(1).split(",")[0].split()[0]
            entries[name] = match.group(2) or ""
        elif entries is not None and line.startswith("   ") and name:
            entries[name] = f"{entries[name]} {line.strip()}".strip()
    return sections


def subparser(command: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser = action.choices[command]
            return found
    raise AssertionError(command)


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_help_documents_every_argument_and_default(tmp_path: Path, command: str) -> None:
    result = run_cli(tmp_path, command, "--help")
    assert result.returncode == 0, result.stderr
    sections = help_sections(result.stdout)
    options, positionals = sections["options"], sections.get("positional arguments", {})
    parser = subparser(command)
    for action in parser._actions:
        if not action.option_strings:  # a positional: its meaning
            assert len(positionals.get(action.dest, "").split()) >= 2, (action.dest, result.stdout)
            continue
        flag = action.option_strings[0]
        if flag == "-h":
            continue
        text = options.get(flag, "")
        meaning, _, default = text.partition("(default: ")
        assert len(meaning.split()) >= 2, f"{flag} has no meaning in --help: {text!r}"
        assert default.endswith(")") and default[:-1] not in ("", "none"), (flag, text)
        parse = action.type
        if hasattr(parse, "show") and "(default" not in (action.help or ""):
            # The default as shown is what one would write, and means the default.
            assert callable(parse)
            assert parse(default[:-1]) == action.default, (flag, default)


def test_run_help_writes_defaults_as_on_the_command_line(tmp_path: Path) -> None:
    options = help_sections(run_cli(tmp_path, "run", "--help").stdout)["options"]
    for flag, shown in [
        ("--session-ttl", "168h"),
        ("--session-retention", "168h"),
        ("--shutdown-grace", "25s"),
        ("--turn-timeout", "30m"),
        ("--warm-max-idle", "10m"),
        ("--max-event-bytes", "8MiB"),
        ("--port", "8080"),
        ("--in-memory", "off"),
        ("--on-disconnect", "cancel"),
    ]:
        assert options[flag].endswith(f"(default: {shown})"), (flag, options[flag])


def test_run_defaults_are_the_settings_model(tmp_path: Path) -> None:
    args = build_parser().parse_args(["run", "spec.yaml"])
    for model in (Limits(), ServerConfig()):
        for f in dataclasses.fields(model):
            if hasattr(args, f.name):
                assert getattr(args, f.name) == getattr(model, f.name), f.name


def test_every_setting_with_a_flag_reaches_the_config() -> None:
    argv = ["run", "spec.yaml", "--in-memory", "--port", "0", "--heartbeat", "2s"]
    argv += ["--max-sessions", "3", "--on-disconnect", "continue", "--require-inputs"]
    argv += ["--warm-adapters-max", "4", "--allowed-hosts", "a.test,b.test"]
    args = build_parser().parse_args(argv)
    config = server_config(args, None)
    assert (config.store, config.port, config.heartbeat) == ("memory", 0, 2.0)
    assert config.allowed_hosts == ("a.test", "b.test")
    limits = config.limits
    assert (limits.max_sessions, limits.on_disconnect, limits.require_inputs) == (
        3,
        "continue",
        True,
    )
    assert limits.warm_adapters_max == 4
    # Every other field is its flag's value, which is the model's default.
    for model, built in ((ServerConfig(), config), (Limits(), limits)):
        for f in dataclasses.fields(model):
            flag = "--" + f.name.replace("_", "-")
            if hasattr(args, f.name) and flag not in argv and f.name != "store":
                assert getattr(built, f.name) == getattr(model, f.name), f.name


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--session-ttl", "-5s"], "argument --session-ttl: invalid duration '-5s': must be"),
        (["--session-ttl=-5s"], "invalid duration '-5s'"),
        (["--shutdown-grace", "-1"], "argument --shutdown-grace: invalid duration '-1'"),
        (["--heartbeat", "-.5"], "argument --heartbeat: invalid duration '-.5'"),
        (["--max-sessions", "-1"], "argument --max-sessions: must be 0 or more, got -1"),
        (["--port", "-1"], "argument --port: port must be 0..65535, got -1"),
        (["--max-sessions", "many"], "expected a whole number, got 'many'"),
        (["--runtime-command", ""], "argument --runtime-command: empty command"),
        (["--runtime-command", "  "], "argument --runtime-command: empty command"),
        (["--runtime-command", "python3 'oops"], "argument --runtime-command: cannot parse"),
        (
            ["--warm-adapters", "2", "--warm-adapters-max", "1"],
            "argument --warm-adapters-max: 1 is less than --warm-adapters 2",
        ),
    ],
)
def test_bad_run_values_are_one_line_and_exit_2(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    spec = write_spec(tmp_path, runtime="echo")
    result = run_cli(tmp_path, "run", str(spec), "--in-memory", "--port", "0", *args)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert needle in result.stderr and "(see trioserve run --help)" in result.stderr


@pytest.mark.parametrize("blank", ["", "   "])
async def test_blank_runtime_command_env_is_unset(
    nursery: trio.Nursery, tmp_path: Path, blank: str
) -> None:
    spec = write_spec(tmp_path, runtime="echo")
    server = await start_cli_server(
        nursery, tmp_path, spec, "--in-memory", env={"TRIOSERVE_RUNTIME_COMMAND": blank}
    )
    assert "-m trioserve.runtime.echo_adapter" in server.startup_line
    server.signal()
    assert await server.wait() == 0


def test_max_body_bytes_is_a_flag(tmp_path: Path) -> None:
    args = build_parser().parse_args(["run", "spec.yaml", "--max-body-bytes", "64KiB"])
    assert server_config(args, None).max_body_bytes == 64 * 1024
    spec = write_spec(tmp_path, runtime="echo")
    result = run_cli(tmp_path, "run", str(spec), "--in-memory", "--max-body-bytes", "0")
    assert result.returncode == 2, result.stderr
    assert "argument --max-body-bytes: invalid size '0': must be positive" in result.stderr


async def test_a_body_over_max_body_bytes_is_a_413(nursery: trio.Nursery, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, runtime="echo")
    server = await start_cli_server(
        nursery, tmp_path, spec, "--in-memory", "--max-body-bytes", "100"
    )
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        small = await client.post("/v1/sessions", json={"inputs": {"a": "x" * 40}})
        assert small.status_code == 201, small.text
        big = await client.post("/v1/sessions", json={"inputs": {"a": "x" * 200}})
    assert big.status_code == 413, big.text
    assert big.json()["error"]["message"] == "request body larger than 100 bytes"


def test_the_postgres_extra_hint_is_printed_once_with_workers(tmp_path: Path) -> None:
    """Without psycopg, ``--workers 3`` says what to install once, before any worker."""
    blocked = tmp_path / "no-psycopg"
    blocked.mkdir()
    (blocked / "psycopg.py").write_text("raise ImportError('No module named psycopg')\n")
    spec = write_spec(tmp_path, runtime="echo")
    url = "postgresql://127.0.0.1:1/nothing"
    result = run_cli(
        tmp_path,
        *("run", str(spec), "--port", "0", "--workers", "3", "--store", url),
        env={"PYTHONPATH": str(blocked)},
    )
    assert result.returncode == 1, result.stderr
    hint = "pip install 'trioserve[postgres]', or from a clone: pip install '.[postgres]'"
    assert result.stderr.count(hint) == 1, result.stderr
    assert result.stderr.startswith("trioserve: cannot open the session store: "), result.stderr
