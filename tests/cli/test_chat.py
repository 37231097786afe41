"""``trioserve chat`` and ``trioserve sessions`` as real processes against a real server.

The server runs in the test's own Trio loop (``start_server``), so the
commands are driven with async process APIs only: the loop keeps serving
while they run.
"""

from __future__ import annotations

import os
import shlex
import socket
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio

from tests.helpers import (
    APPROVAL_ADAPTER,
    ServerFactory,
    compiled_spec,
    fake_adapters,
    script,
    wait_gone,
)
from trioserve.cli.terminal import Printer, message_text
from trioserve.client import Client, Event, Transport
from trioserve.runtime.echo_adapter import reply_for
from trioserve.spec._runtimes import echo_command

CLI = [sys.executable, "-m", "trioserve"]
HANG = script(
    {"event": "message", "data": {"role": "assistant", "text": "working"}}, {"hang": True}
)
TRANSPORTS: list[Transport] = ["sse", "websocket"]


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    @property
    def lines(self) -> list[str]:
        return self.stdout.splitlines()


async def run_cli(*args: str, stdin: bytes = b"") -> Result:
    """Run ``trioserve ARGS`` to completion with ``stdin`` piped in."""
    with trio.fail_after(60):
        done = await trio.run_process(
            [*CLI, *args], stdin=stdin, capture_stdout=True, capture_stderr=True, check=False
        )
    return Result(done.returncode, done.stdout.decode(), done.stderr.decode())


def assert_one_line(stderr: str, *needles: str) -> None:
    assert len(stderr.splitlines()) == 1, stderr
    assert "Traceback" not in stderr
    for needle in needles:
        assert needle in stderr, stderr


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def echo_spec(**options: Any) -> dict[str, Any]:
    spec = compiled_spec(runtime="echo")
    spec["runtime"]["options"] = options
    return spec


# -- chat, piped ---------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_piped_turns_in_order(start_server: ServerFactory, transport: Transport) -> None:
    server = await start_server()
    result = await run_cli(
        "chat", server.url, "--transport", transport, stdin=b"hello\n\n  \nworld\n"
    )
    assert result.code == 0, result.stderr
    assert result.stderr == ""
    session, *replies = result.lines
    assert session.startswith("session s_")
    assert replies == ["echo: hello", "echo: world"]  # blank lines are not turns
    sid = session.split()[1]
    # The session it created is ended at the end of input.
    assert await status_of(server, sid) == "ended"


async def status_of(server: Any, session_id: str) -> str:
    status: str = (await server.client.get(f"/v1/sessions/{session_id}")).json()["status"]
    return status


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_keep_session_says_how_to_resume(
    start_server: ServerFactory, transport: Transport
) -> None:
    server = await start_server(spec=echo_spec(), command=echo_command())
    kept = await run_cli(
        "chat", server.url, "--keep-session", "--transport", transport, stdin=b"one\n"
    )
    assert kept.code == 0, kept.stderr
    sid = kept.lines[0].removeprefix("session ")
    assert kept.lines[1:] == [reply_for(sid, 1, "one", None)]
    resume = f"trioserve chat {server.url} --session {sid}"
    assert kept.stderr == f"session {sid} kept; resume it with: {resume}\n"
    assert await status_of(server, sid) == "active"
    # Resuming as it says: the session remembers, and is still not ended.
    again = await run_cli(*resume.split()[1:], stdin=b"two\n")
    assert again.code == 0 and again.stderr == ""
    assert again.lines == [f"session {sid}", reply_for(sid, 2, "two", "one")]
    assert await status_of(server, sid) == "active"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_streamed_deltas_make_one_line_per_turn(
    start_server: ServerFactory, transport: Transport
) -> None:
    server = await start_server(spec=echo_spec(chunkSize=4), command=echo_command())
    # The last line has no newline: it is still a turn.
    result = await run_cli("chat", server.url, "--transport", transport, stdin=b"hi\nbye")
    assert result.code == 0, result.stderr
    sid = result.lines[0].removeprefix("session ")
    assert result.lines[1:] == [reply_for(sid, 1, "hi", None), reply_for(sid, 2, "bye", "hi")]


async def test_session_reuse(start_server: ServerFactory) -> None:
    server = await start_server(spec=echo_spec(), command=echo_command())
    sid = (await server.create())["id"]
    first = await run_cli("chat", server.url, "--session", sid, stdin=b"one\n")
    second = await run_cli(
        "chat", server.url, "--session", sid, "--transport", "websocket", stdin=b"two\n"
    )
    assert first.lines == [f"session {sid}", reply_for(sid, 1, "one", None)]
    assert second.lines == [f"session {sid}", reply_for(sid, 2, "two", "one")]
    assert await status_of(server, sid) == "active"  # a session given is never ended


async def test_inputs_for_a_new_session(start_server: ServerFactory) -> None:
    spec = compiled_spec(task="Say hello to ${inputs.name}.")
    server = await start_server(spec=spec, require_inputs=True)
    missing = await run_cli("chat", server.url, stdin=b"hi\n")
    assert missing.code == 1
    assert_one_line(missing.stderr, "missing inputs", "name", "--input KEY=VALUE")
    given = await run_cli("chat", server.url, "--input", "name=Ada", stdin=b"hi\n")
    assert given.code == 0, given.stderr
    assert given.lines[1:] == ["echo: hi"]
    for bad in [["--input", "name"], ["--input", "name=Ada", "--session", "s_1"]]:
        result = await run_cli("chat", server.url, *bad)
        assert result.code == 2
        assert_one_line(result.stderr, "--input")


async def test_unknown_or_ended_session(start_server: ServerFactory) -> None:
    server = await start_server()
    result = await run_cli("chat", server.url, "--session", "s_nope", stdin=b"hi\n")
    assert result.code == 1 and result.stdout == ""
    assert_one_line(result.stderr, "s_nope", "(404 not_found)")
    sid = (await server.create())["id"]
    await server.client.delete(f"/v1/sessions/{sid}")
    result = await run_cli("chat", server.url, "--session", sid, stdin=b"hi\n")
    assert result.code == 1
    assert_one_line(result.stderr, f"session {sid} is ended")


async def test_error_events_go_to_stderr(start_server: ServerFactory) -> None:
    server = await start_server()
    steps = script({"event": "message", "data": {"role": "assistant", "content": "partial"}})
    crash = script({"event": "message", "data": {"role": "tool", "content": "hidden"}}, {"exit": 3})
    stdin = f"{steps}\n{crash}\nafter\n".encode()
    result = await run_cli("chat", server.url, stdin=stdin)
    assert result.code == 0, result.stderr
    assert result.lines[1:] == ["partial", "echo: after"]  # only the assistant speaks
    errors = result.stderr.splitlines()
    assert len(errors) == 2, result.stderr
    assert errors[0].startswith("error: adapter exited with status 0 before session.ended")
    assert errors[1].startswith("error: adapter exited with status 3 before session.ended")


async def test_refusals_are_one_line_and_the_chat_goes_on(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    server = await start_server(max_concurrent_turns=1)
    busy = (await server.create())["id"]
    other = (await server.create())["id"]
    async with Client(server.url) as client:
        started, done = trio.Event(), trio.Event()

        async def hang() -> None:
            async with client.turn(busy, HANG) as events:
                async for _ in events:
                    started.set()
            done.set()

        nursery.start_soon(hang)
        with trio.fail_after(10):
            await started.wait()
        result = await run_cli("chat", server.url, "--session", busy, stdin=b"x\ny\n")
        assert result.code == 0
        errors = result.stderr.splitlines()
        assert len(errors) == 2 and "Traceback" not in result.stderr
        assert "already has a turn in flight (409 session_busy)" in errors[0]
        result = await run_cli("chat", server.url, "--session", other, stdin=b"x\n")
        assert_one_line(result.stderr, "(429 turn_cap; retry after 1s)")
        await client.cancel(busy)
        with trio.fail_after(10):
            await done.wait()


async def test_a_draining_server_ends_the_chat(start_server: ServerFactory) -> None:
    server = await start_server()
    sid = (await server.create())["id"]
    server.manager.start_draining()
    result = await run_cli("chat", server.url, "--session", sid, stdin=b"x\ny\n")
    assert result.code == 1
    assert_one_line(result.stderr, "503 draining")


async def test_unreachable_server_and_bad_url() -> None:
    for command in ["chat", "sessions"]:
        result = await run_cli(command, closed_port_url(), stdin=b"hi\n")
        assert result.code == 1 and result.stdout == ""
        assert_one_line(result.stderr, "cannot connect to http://127.0.0.1:")
        result = await run_cli(command, "localhost:8080")
        assert result.code == 2
        assert_one_line(result.stderr, "base URL must be")


async def test_blocking_mode_of_a_shared_stdio_file_is_restored(
    start_server: ServerFactory,
) -> None:
    # As on a terminal, fds 0-2 are one open file (here a socket), whose
    # non-blocking mode is shared with whoever passed it: it must come back.
    server = await start_server()
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.sendall(b"hi\n")
        ours.shutdown(socket.SHUT_WR)
        fd = theirs.fileno()
        with trio.fail_after(60):
            done = await trio.run_process(
                [*CLI, "chat", server.url], stdin=fd, stdout=fd, stderr=fd, check=False
            )
        assert done.returncode == 0
        assert os.get_blocking(fd)
        theirs.close()
        output = b""
        while chunk := ours.recv(65536):
            output += chunk
        assert output.decode().endswith("echo: hi\n")


# -- sessions ------------------------------------------------------------------------------

HEADER = ["ID", "AGENT", "RUNTIME", "STATUS", "CREATED", "LAST", "ACTIVE"]


async def test_sessions_table(start_server: ServerFactory) -> None:
    server = await start_server()
    empty = await run_cli("sessions", server.url)
    assert empty.code == 0 and empty.lines == ["ID  AGENT  RUNTIME  STATUS  CREATED  LAST ACTIVE"]
    one = await server.create()
    two = await server.create()
    await server.client.delete(f"/v1/sessions/{one['id']}")
    result = await run_cli("sessions", server.url)
    assert result.code == 0, result.stderr
    header, *rows = result.lines
    assert header.split() == HEADER
    assert {row.split()[0] for row in rows} == {one["id"], two["id"]}
    for row in rows:
        sid, agent, runtime, status, *times = row.split()
        assert (agent, runtime) == ("test-agent", "exec")
        assert status == ("ended" if sid == one["id"] else "active")
        assert len(times) == 4 and times[0] == two["createdAt"][:10]
        assert row.index(status) == header.index("STATUS")  # the columns line up
    ended = await run_cli("sessions", server.url, "--status", "ended")
    assert [row.split()[0] for row in ended.lines[1:]] == [one["id"]]
    limited = await run_cli("sessions", server.url, "--limit", "1")
    assert len(limited.lines) == 2
    unknown = await run_cli("sessions", server.url, "--status", "bogus")  # as in v0.8: none
    assert (unknown.code, unknown.lines) == (0, empty.lines)
    bad = await run_cli("sessions", server.url, "--limit", "0")
    assert bad.code == 2 and bad.stdout == ""
    assert_one_line(bad.stderr, "limit must be a positive integer")


async def test_sessions_in_pages(start_server: ServerFactory) -> None:
    server = await start_server()
    created = [(await server.create())["id"] for _ in range(3)]
    first = await run_cli("sessions", server.url, "--limit", "2")
    assert first.code == 0, first.stderr
    assert [row.split()[0] for row in first.lines[1:]] == [created[2], created[1]]
    # the command for the next page, on stderr (stdout stays the table)
    assert_one_line(first.stderr, f"next page: trioserve sessions {server.url} --limit 2 --before ")
    command = shlex.split(first.stderr.split("next page: ", 1)[1])
    assert command[:2] == ["trioserve", "sessions"]
    last = await run_cli(*command[1:])
    assert last.code == 0 and last.stderr == ""
    assert [row.split()[0] for row in last.lines[1:]] == [created[0]]
    by_id = await run_cli("sessions", server.url, "--before", created[2], "--status", "active")
    assert [row.split()[0] for row in by_id.lines[1:]] == [created[1], created[0]]
    assert by_id.stderr == ""
    for args, needle in (
        (["--before", "s_gone"], "before: 's_gone' is neither a page token nor the id"),
        (["--limit", "0"], "limit must be a positive integer (at most 10000), got '0'"),
    ):
        bad = await run_cli("sessions", server.url, *args)
        assert bad.code == 2 and bad.stdout == ""
        assert_one_line(bad.stderr, needle)


# -- chat on a terminal -------------------------------------------------------------------

#: Make the pty the controlling terminal, so the tty driver turns ^C into SIGINT.
_WITH_TTY = (
    "import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "os.execv(sys.executable, [sys.executable, '-m', 'trioserve', *sys.argv[1:]])"
)


@dataclass
class Terminal:
    """The master side of a pseudo-terminal running a command."""

    proc: trio.Process
    stream: trio.lowlevel.FdStream
    output: bytearray = field(default_factory=bytearray)
    seen: int = 0
    closed: bool = False
    changed: trio.Event = field(default_factory=trio.Event)

    async def pump(self) -> None:
        try:
            while chunk := await self.stream.receive_some():
                self.output += chunk
                self.changed.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # EIO: the last process holding the slave side exited
        self.closed = True
        self.changed.set()

    async def expect(self, text: str, within: float = 10) -> None:
        """Wait for ``text`` after what was already expected; move past it."""
        needle = text.encode()
        try:
            with trio.fail_after(within):
                while (at := self.output.find(needle, self.seen)) < 0:
                    if self.closed:
                        break
                    self.changed = trio.Event()
                    await self.changed.wait()
        except trio.TooSlowError:
            at = -1
        if at < 0:
            rest = bytes(self.output[self.seen :])
            raise AssertionError(f"{text!r} not in the terminal's output {rest!r}")
        self.seen = at + len(needle)

    async def session_id(self) -> str:
        """The id of ``session <id>``, the chat's first line."""
        await self.expect("session ")
        start = self.seen
        await self.expect("\r\n")
        self.seen -= 2  # the line's end is still to be expected
        return self.output[start : self.seen].decode()

    async def type(self, data: str) -> None:
        await self.stream.send_all(data.encode())

    async def exit_code(self) -> int:
        with trio.fail_after(10):
            return await self.proc.wait()


async def open_terminal(nursery: trio.Nursery, *args: str) -> Terminal:
    master, slave = os.openpty()
    try:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-c", _WITH_TTY, *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
        )
    finally:
        os.close(slave)
    terminal = Terminal(proc, trio.lowlevel.FdStream(master))
    nursery.start_soon(terminal.pump)
    return terminal


async def close_terminal(terminal: Terminal) -> None:
    if terminal.proc.returncode is None:
        terminal.proc.kill()
        with trio.move_on_after(10):
            await terminal.proc.wait()
    await terminal.stream.aclose()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_terminal_ctrl_c_cancels_the_turn_and_ctrl_d_exits(
    start_server: ServerFactory, nursery: trio.Nursery, transport: Transport
) -> None:
    server = await start_server(processes=True)
    term = await open_terminal(nursery, "chat", server.url, "--transport", transport)
    try:
        sid = await term.session_id()
        await term.expect("\n> ")
        await term.type(HANG + "\n")
        await term.expect(HANG)  # the terminal's echo of the line
        await term.expect("working")
        pids = fake_adapters()  # the turn's (the server runs without a warm pool)
        assert len(pids) == 1
        await term.type("\x03")  # the tty driver sends SIGINT
        await term.expect("cancelling the turn")
        await term.expect("turn cancelled")
        await term.expect("\n> ")
        for pid in pids:
            await wait_gone(pid)
        await term.type("hi\n")
        await term.expect("echo: hi")
        await term.expect("\n> ")
        await term.type("\x04")  # EOF at the start of a line
        assert await term.exit_code() == 0
        assert await status_of(server, sid) == "ended"
    finally:
        await close_terminal(term)


async def test_terminal_ctrl_c_at_the_prompt_exits_130(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    server = await start_server()
    term = await open_terminal(nursery, "chat", server.url)
    try:
        sid = await term.session_id()
        await term.expect("\n> ")
        await term.type("\x03")
        assert await term.exit_code() == 130
        assert b"Traceback" not in term.output
        assert await status_of(server, sid) == "ended"
    finally:
        await close_terminal(term)


async def test_terminal_ctrl_c_with_keep_session_prints_how_to_resume(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    server = await start_server()
    term = await open_terminal(nursery, "chat", server.url, "--keep-session")
    try:
        sid = await term.session_id()
        await term.expect("\n> ")
        await term.type("\x03")
        await term.expect(f"\nsession {sid} kept; resume it with: ")
        await term.expect(f"trioserve chat {server.url} --session {sid}\r\n")
        assert await term.exit_code() == 130
        assert await status_of(server, sid) == "active"
    finally:
        await close_terminal(term)


async def test_terminal_chat_ended_by_an_error_ends_its_session(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    server = await start_server()
    term = await open_terminal(nursery, "chat", server.url)
    try:
        sid = await term.session_id()
        await term.expect("\n> ")
        server.manager.start_draining()
        await term.type("hi\n")
        await term.expect("503 draining")
        assert await term.exit_code() == 1
        assert await status_of(server, sid) == "ended"  # DELETE is served while draining
    finally:
        await close_terminal(term)


async def test_terminal_second_ctrl_c_while_cancelling_exits_130(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    # The adapter ignores SIGINT: the cancel lasts until the stop grace is over.
    server = await start_server(adapter_stop_grace=3.0, processes=True)
    stubborn = script(
        {"ignore_sigint": True},
        {"event": "message", "data": {"role": "assistant", "text": "stubborn"}},
        {"hang": True},
    )
    term = await open_terminal(nursery, "chat", server.url)
    try:
        await term.expect("\n> ")
        await term.type(stubborn + "\n")
        await term.expect(stubborn)
        await term.expect("stubborn")
        pids = fake_adapters()  # the turn's (the server runs without a warm pool)
        assert len(pids) == 1
        await term.type("\x03")
        await term.expect("cancelling the turn")
        await term.type("\x03")
        assert await term.exit_code() == 130
        assert b"turn cancelled" not in term.output[term.seen :]
        for pid in pids:
            await wait_gone(pid, 10)  # SIGKILL after the grace
    finally:
        await close_terminal(term)


async def turn_records(server: Any, session_id: str) -> list[tuple[str, str]]:
    resp = await server.client.get(f"/v1/sessions/{session_id}/turns")
    return [(t["input"], t["status"]) for t in resp.json()]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_terminal_lines_typed_while_a_reply_streams_are_queued(
    start_server: ServerFactory, nursery: trio.Nursery, transport: Transport
) -> None:
    server = await start_server()
    term = await open_terminal(nursery, "chat", server.url, "--transport", transport)
    try:
        sid = await term.session_id()
        await term.expect("\n> ")
        await term.type(HANG + "\n")
        await term.expect(HANG)  # the terminal's echo of the line
        await term.expect("working")
        await term.type("hi\n")  # while the reply streams: queued (the default)
        await term.expect("queued (position 1)")
        await term.type("there\n")
        await term.expect("queued (position 2)")
        assert await turn_records(server, sid) == [
            (HANG, "running"),
            ("hi", "queued"),
            ("there", "queued"),
        ]
        await term.type("\x03")  # cancels the reply that streams; the queued ones run
        await term.expect("cancelling the turn")
        await term.expect("turn cancelled")
        await term.expect("echo: hi")  # in the order typed
        await term.expect("echo: there")
        await term.expect("\n> ")
        await term.type("\x04")
        assert await term.exit_code() == 0
        assert b"Traceback" not in term.output
        assert await turn_records(server, sid) == [
            (HANG, "cancelled"),
            ("hi", "completed"),
            ("there", "completed"),
        ]
    finally:
        await close_terminal(term)


async def test_terminal_multitask_interrupt_replaces_the_reply(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    server = await start_server()
    term = await open_terminal(nursery, "chat", server.url, "--multitask", "interrupt")
    try:
        sid = await term.session_id()
        await term.expect("\n> ")
        await term.type(HANG + "\n")
        await term.expect(HANG)
        await term.expect("working")
        await term.type("now\n")
        await term.expect("turn cancelled")  # the reply it interrupted
        await term.expect("echo: now")
        await term.expect("\n> ")
        await term.type("\x04")
        assert await term.exit_code() == 0
        assert await turn_records(server, sid) == [(HANG, "cancelled"), ("now", "completed")]
    finally:
        await close_terminal(term)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"role": "assistant", "text": "hi"}, "hi"),  # the reference's adapters
        ({"role": "assistant", "content": "hi"}, "hi"),  # the fallback
        ({"role": "assistant", "content": [{"type": "text", "text": "a"}, {"text": "b"}]}, "ab"),
        ({"role": "assistant", "text": "wins", "content": "loses"}, "wins"),
        ({"role": "assistant"}, ""),
    ],
)
def test_message_text_reads_text_then_content(data: dict[str, Any], expected: str) -> None:
    assert message_text(data) == expected


class _Captured:
    """A console that keeps what is printed."""

    def __init__(self) -> None:
        self.printed = ""

    async def out(self, text: str) -> None:
        self.printed += text

    async def err(self, text: str) -> None:
        self.printed += f"[err]{text}"


async def test_a_whole_final_message_after_its_chunks_is_not_printed_again() -> None:
    console = _Captured()
    printer = Printer(console)  # type: ignore[arg-type]

    async def show(**data: Any) -> None:
        data = {"role": "assistant", **data}
        await printer.show(Event(type="message", data=data, json={"data": data}, raw=""))

    await show(text="Hel", delta=True)
    await show(text="lo", delta=True)
    await show(text="Hello", final=True)  # the openai adapter's whole message
    await show(text="A whole one.")  # no chunks before it: printed
    await show(text="Also whole.", final=True)
    await printer.finish()
    assert console.printed == "Hello\nA whole one.\nAlso whole.\n"


async def test_terminal_asks_y_or_n_for_a_tool_call_that_waits_for_an_approval(
    start_server: ServerFactory, nursery: trio.Nursery
) -> None:
    """On a terminal the line typed after ``approve TOOL ARGS? [y/N]`` answers it (it is
    not sent as a turn): ``y`` approves, ``n`` denies; the turn goes on."""
    server = await start_server(command=APPROVAL_ADAPTER, require_approval=("deploy",))
    term = await open_terminal(nursery, "chat", server.url)
    try:
        sid = await term.session_id()
        await term.expect("\n> ")
        await term.type("prod\n")
        await term.expect('approve deploy {"target": "prod"}? [y/N] ', within=60)
        await term.type("y\n")
        await term.expect("deployed prod", within=60)
        await term.expect("\n> ")
        await term.type("qa\n")
        await term.expect('approve deploy {"target": "qa"}? [y/N] ', within=60)
        await term.type("n\n")
        await term.expect("not deployed: denied: denied in chat", within=60)
        await term.expect("\n> ")
        await term.type("\x04")
        assert await term.exit_code() == 0
        assert b"Traceback" not in term.output
        records = [(t["input"], t["status"]) for t in (await session_turns(server, sid))]
        assert records == [("prod", "completed"), ("qa", "completed")]
        approvals = (await server.client.get(f"/v1/sessions/{sid}/approvals")).json()
        assert [a["status"] for a in approvals] == ["approved", "denied"]
    finally:
        await close_terminal(term)


async def session_turns(server: Any, session_id: str) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = (
        await server.client.get(f"/v1/sessions/{session_id}/turns")
    ).json()
    return turns
