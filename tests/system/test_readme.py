"""README.md is the truth: its examples run as pasted and print what it says.

Each section of :data:`SECTIONS` runs against its own real server, started
with the command of the README's Set-up section (``trioserve run
examples/echo.yaml``) plus ``--port 0``, its SQLite store and the echo
adapter's state in ``tmp_path``.  The one change made to the README's text:
``localhost:8080`` and ``127.0.0.1:8080`` become that server's port.

In a section, in order:

- ``sh`` blocks run in one bash process (so ``$SID`` carries over), with the
  test's Python environment first on ``PATH`` (``python3``, ``trioserve``).
  Every command must exit 0.  The ``# …`` lines right under a command (no
  blank line between) are what it prints: each must match a line of its
  output (stdout and stderr), in order, where ``...`` or ``…`` stand for
  anything and ids (``s_…``, ``t_…``) for any id.  ``#`` alone is an empty
  line.  Other comments are not output.  An error envelope or a traceback
  the README does not show fails the test.
- ``console`` blocks are terminal transcripts: ``$ COMMAND``, then ``> TEXT``
  lines typed (piped to the command's stdin; ``^D`` is the end of input),
  and the other lines printed, matched as above.
- ``python`` blocks with ``trio.run(`` are scripts.  One introduced as
  "saved as `NAME.py`" is written to the section's directory for a later
  ``sh`` block to run; the others are run, and their trailing ``# …``
  lines are their output.  A block without ``trio.run(`` is a fragment
  that runs "inside ``main`` above": at the end of the body of ``main`` of
  the README's first script, after its own turn.

The two Set-up commands are checked too: the server command is the one
these tests start, and the test command is the one ``.ci/run`` runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers import ROOT

README = ROOT / "README.md"
SECTIONS = [
    "Walk-through",
    "Re-attach to a turn",
    "Python client",
    "WebSocket example",
    "`trioserve chat`",
    "Other protocols",
]
_PORT = re.compile(r"\b(localhost|127\.0\.0\.1):8080\b")
_ID = re.compile(r"\b([st])_[0-9a-z]{16}\b")
_WILDCARD = re.compile(r"\.\.\.|…")
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.MULTILINE | re.DOTALL)
_SAVED_AS = re.compile(r"saved as `([\w.-]+\.py)`")
_ERROR_ENVELOPE = '"error":{"code"'


@dataclass
class Block:
    language: str
    text: str
    before: str  # the prose between the previous block and this one


@dataclass
class Command:
    text: str
    expected: list[str] = field(default_factory=list)
    stdin: str | None = None


def section(name: str) -> str:
    text = README.read_text()
    match = re.search(rf"^## {re.escape(name)}\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"README.md has no section {name!r}"
    return match.group(1)


def blocks(text: str) -> list[Block]:
    found, end = [], 0
    for match in _FENCE.finditer(text):
        found.append(Block(match.group(1), match.group(2), text[end : match.start()]))
        end = match.end()
    return found


def shell_commands(text: str) -> list[Command]:
    """The commands of an ``sh`` block, each with the ``# …`` lines right under it."""
    commands: list[Command] = []
    current: Command | None = None
    lines = iter(text.splitlines())
    for line in lines:
        if not line.strip():
            current = None
        elif line.startswith("#"):
            if current is not None:
                current.expected.append(line[2:] if line.startswith("# ") else line[1:])
        else:
            while line.endswith("\\"):
                line += "\n" + next(lines)
            current = Command(line)
            commands.append(current)
    return commands


def console_commands(text: str) -> list[Command]:
    """The commands of a ``console`` transcript, with what is typed and what is printed."""
    commands: list[Command] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            commands.append(Command(line[2:], stdin=""))
        elif line.startswith("> "):
            typed = line[2:]
            if typed != "^D":
                commands[-1].stdin = f"{commands[-1].stdin}{typed}\n"
        elif line.strip():
            commands[-1].expected.append(line)
    return commands


def trailing_comments(text: str) -> list[str]:
    """The ``# …`` lines after a script's last line of code: what it prints."""
    lines = text.rstrip("\n").splitlines()
    expected: list[str] = []
    while lines and lines[-1].startswith("#"):
        line = lines.pop()
        expected.insert(0, line[2:] if line.startswith("# ") else line[1:])
    return expected


def normalized(line: str) -> str:
    """Any id as ``s_ID`` or ``t_ID``, runs of spaces as one, no trailing space."""
    return re.sub(" +", " ", _ID.sub(r"\1_ID", line)).rstrip()


def pattern(expected: str) -> re.Pattern[str]:
    parts = _WILDCARD.split(normalized(expected))
    return re.compile(".*".join(re.escape(part) for part in parts))


def check_output(what: str, expected: list[str], output: str) -> None:
    """Each expected line matches a line of ``output``, in order; no unshown error."""
    lines = [normalized(line) for line in output.splitlines()]
    at = 0
    for line in expected:
        regex = pattern(line)
        while at < len(lines) and not regex.fullmatch(lines[at]):
            at += 1
        if at == len(lines):
            raise AssertionError(f"{what}\nREADME says it prints {line!r}; it printed:\n{output}")
        at += 1
    shown = "\n".join(expected)
    assert "Traceback" not in output, f"{what}\nprinted a traceback:\n{output}"
    if _ERROR_ENVELOPE in output and '"error"' not in shown:
        raise AssertionError(f"{what}\nprinted an error the README does not show:\n{output}")


# -- the server --------------------------------------------------------------------------


def setup_commands() -> tuple[str, str]:
    """The Set-up section's two commands: the server's and the tests'."""
    found = [b.text.strip() for b in blocks(section("Set-up")) if b.language == "sh"]
    assert len(found) == 2 and all("\n" not in c for c in found), found
    return found[0], found[1]


def environment(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg-data")
    env["TRIOSERVE_ECHO_STATE_DIR"] = str(tmp_path / "echo-state")
    for name in ("TRIOSERVE_RUNTIME_COMMAND", "TRIOSERVE_OPENAI_BASE_URL", "OPENAI_BASE_URL"):
        env.pop(name, None)
    return env


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """The README's server on a free port; its ``host:port``."""
    run = setup_commands()[0].split(" && ")[-1]
    with served(run, environment(tmp_path), tmp_path) as address:
        yield address


@contextlib.contextmanager
def served(run: str, env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    """``run`` (a ``trioserve run`` command) on a free port, from the root; its ``host:port``."""
    assert run.startswith("trioserve run "), run
    log = tmp_path / "server.log"
    with log.open("wb") as stderr:
        proc = subprocess.Popen(
            [*shlex.split(run), "--port", "0"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stderr,
            stderr=stderr,
        )
    try:
        deadline = time.monotonic() + 30  # a hang guard, not a timing assertion
        while not (match := re.search(r" on http://(\S+) ", log.read_text())):
            assert proc.poll() is None, f"the server exited:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"the server did not start:\n{log.read_text()}"
            time.sleep(0.05)
        yield match.group(1)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, log.read_text()
    assert "Traceback" not in log.read_text(), log.read_text()


# -- running a section -------------------------------------------------------------------


def rewrite(text: str, address: str) -> str:
    """The README's one substitution: its server address becomes the test server's."""
    port = address.rsplit(":", 1)[1]
    return _PORT.sub(rf"\1:{port}", text)


def run_shell(commands: list[Command], workdir: Path, env: dict[str, str]) -> None:
    """Run the commands in one bash, each followed by a marker with its exit status."""
    marker = "@@readme-command"
    script = ["exec 2>&1"]
    for i, command in enumerate(commands):
        script += [command.text, f"printf '\\n{marker} {i} %s@@\\n' \"$?\""]
    done = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # [output 0, "0", status 0, output 1, "1", status 1, ..., the rest]
    parts = re.split(rf"\n{marker} (\d+) (\d+)@@\n", done.stdout)
    for i, command in enumerate(commands):
        assert 3 * i + 2 < len(parts), f"bash stopped before {command.text!r}:\n{done.stdout}"
        output, status = parts[3 * i], int(parts[3 * i + 2])
        assert status == 0, f"{command.text}\nexited {status}:\n{output}"
        check_output(command.text, command.expected, output)


def run_console(command: Command, workdir: Path, env: dict[str, str]) -> None:
    done = subprocess.run(
        ["bash", "-c", command.text],
        cwd=workdir,
        env=env,
        input=command.stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{command.text}\nexited {done.returncode}:\n{output}"
    check_output(command.text, command.expected, output)


def first_script() -> str:
    """The README's first Python script: where its fragments run."""
    for name in SECTIONS:
        for block in blocks(section(name)):
            if block.language == "python" and "trio.run(" in block.text:
                return block.text
    raise AssertionError("README.md has no Python script")


def inside_main(fragment: str) -> str:
    """``fragment`` at the end of the body of the first script's ``main``."""
    lines = first_script().splitlines()
    body = next(line for line in lines if line.lstrip().startswith("session = "))
    indent = body[: len(body) - len(body.lstrip())]
    end = next(i for i, line in enumerate(lines) if line.startswith("trio.run("))
    while not lines[end - 1].strip():
        end -= 1
    added = [indent + line if line.strip() else "" for line in fragment.splitlines()]
    return "\n".join([*lines[:end], *added, *lines[end:]]) + "\n"


def run_python(text: str, expected: list[str], workdir: Path, env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", text],
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{text}\nexited {done.returncode}:\n{output}"
    check_output(text, expected, output)


@pytest.mark.parametrize("name", SECTIONS)
def test_readme_section_runs_as_written(name: str, server: str, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = environment(tmp_path)
    shell: list[Command] = []
    ran = 0
    for block in blocks(section(name)):
        text = rewrite(block.text, server)
        if block.language == "sh":
            shell += shell_commands(text)
            continue
        if shell:  # the sh blocks so far, in one bash, before what follows them
            run_shell(shell, workdir, env)
            ran, shell = ran + 1, []
        if block.language == "console":
            for command in console_commands(text):
                run_console(command, workdir, env)
        elif block.language == "python" and (saved := _SAVED_AS.search(block.before)):
            (workdir / saved.group(1)).write_text(text)
            continue
        elif block.language == "python" and "trio.run(" in text:
            run_python(text, trailing_comments(text), workdir, env)
        elif block.language == "python":
            run_python(rewrite(inside_main(text), server), [], workdir, env)
        else:
            raise AssertionError(f"a {block.language or 'plain'} block in {name!r}")
        ran += 1
    if shell:
        run_shell(shell, workdir, env)
        ran += 1
    assert ran, f"nothing ran in {name!r}"


def test_serving_a_real_model_runs_as_written(tmp_path: Path) -> None:
    """The section's lines against the fake OpenAI-compatible server, with its real MCP tool."""
    first, chat = [b.text for b in blocks(section("Serving a real model")) if b.language == "sh"]
    export, run = shell_commands(first)
    name, _, value = export.text.removeprefix("export ").split()[0].partition("=")
    assert (name, value) == ("OPENAI_BASE_URL", "http://localhost:11434/v1"), export.text
    requests = tmp_path / "requests.jsonl"
    tool = ["--tool", "current_time", '{"timezone": "Asia/Tokyo"}']
    model = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.fake_openai", "--log", str(requests), *tool],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert model.stdout is not None
        env = environment(tmp_path) | {name: model.stdout.readline().strip()}
        with served(run.text, env, tmp_path) as address:
            (command,) = shell_commands(rewrite(chat, address))
            done = subprocess.run(
                ["bash", "-c", command.text], env=env, capture_output=True, text=True, timeout=120
            )
    finally:
        model.kill()
        model.wait()
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    check_output(command.text, command.expected, output)
    assert output.count("The tools said: ") == 1, output  # streamed, and not printed twice
    sent = [json.loads(line) for line in requests.read_text().splitlines()]
    result = sent[1]["messages"][-1]
    assert result["role"] == "tool" and result["content"].endswith("(Asia/Tokyo)"), result


def test_ci_runs_the_readme_test_command() -> None:
    command = setup_commands()[1]
    assert "nox" in command
    assert command in (ROOT / ".ci" / "run").read_text().splitlines()


# -- the checker itself ------------------------------------------------------------------


def test_the_checker_fails_when_the_readme_drifts() -> None:
    output = 'session s_mx7ij9bs3ac0e0dd\nTurn 1 of session s_mx7ij9bs3ac0e0dd: you said "hi".\n'
    check_output("chat", ["session s_...", 'Turn 1 of session s_…: you said "hi".'], output)
    check_output("chat", ["session s_mx6glphgeed224a8"], output)  # any id stands for any id
    for drifted in (
        ['Turn 1 of session s_...: you said "bye".'],  # different text
        ["Turn 1 of session s_...", "session s_..."],  # out of order
        ["Turn 2 ..."],
    ):
        with pytest.raises(AssertionError):
            check_output("chat", drifted, output)
    error = '{"error":{"code":404,"reason":"not_found","message":"no session"}}'
    with pytest.raises(AssertionError, match="an error the README does not show"):
        check_output("curl", [], error)
    check_output("curl", ['{"error":{"code":404,...}}'], error)


def test_commands_and_their_output_lines_are_read_as_documented() -> None:
    block = (
        "# a comment, not output\n"
        "SID=$(curl -s x \\\n  | python3 -c y)\n"
        "curl a\n"
        "# first\n"
        "#\n"
        "# ...\n"
        "\n"
        "# another comment\n"
        "curl b   # a trailing comment\n"
    )
    commands = shell_commands(block)
    assert [c.text for c in commands] == [
        "SID=$(curl -s x \\\n  | python3 -c y)",
        "curl a",
        "curl b   # a trailing comment",
    ]
    assert [c.expected for c in commands] == [[], ["first", "", "..."], []]
    console = console_commands("$ trioserve chat URL\nsession s_1\n> hi\nTurn 1\n> ^D\n")
    assert [(c.text, c.stdin, c.expected) for c in console] == [
        ("trioserve chat URL", "hi\n", ["session s_1", "Turn 1"])
    ]
    assert rewrite("curl localhost:8080/x http://127.0.0.1:8080", "127.0.0.1:4321") == (
        "curl localhost:4321/x http://127.0.0.1:4321"
    )
