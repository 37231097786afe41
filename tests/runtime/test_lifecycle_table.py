"""The sans-IO rules on their own: the turn state table and the line framer.

``TURN_TABLE`` is the turn state table of docs/design.md as data: each row
is a sequence of inputs to a ``TurnState`` and what must come out of it
(the events to log, the actions for the adapter, the final status and
reason).  The framer is checked on a table of chunkings and against a
model with hypothesis (chunk boundaries anywhere).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trioserve.protocol import TurnStatus
from trioserve.runtime._framing import Line, LineFramer, Oversized
from trioserve.runtime._lifecycle import Action, TurnState
from trioserve.runtime._wire import Event

# -- the turn state table ---------------------------------------------------------------

Step = Callable[[TurnState], "Sequence[Event] | Action | None"]


def line(event_type: str, **data: Any) -> bytes:
    return json.dumps({"v": 1, "type": event_type, "data": data}).encode()


def out(*lines: bytes | Oversized) -> Step:
    """The adapter printed ``lines`` (one read)."""
    return lambda state: state.output(list(lines))


def exit_(code: int | None, *, stopped: bool = False, stderr: bytes = b"") -> Step:
    """The adapter is reaped (``stopped``: the server signalled it)."""
    return lambda state: state.exited(code, stopped_by_server=stopped, stderr_tail=stderr)


def stop(reason: Any, force: bool = False) -> Step:
    return lambda state: state.stop(reason, force=force)


def cancel(reason: Any) -> Step:
    return lambda state: state.cancel(reason)


STARTED = out(line("session.started"))
MESSAGE = out(line("message", text="hi"))
END = out(line("session.ended", reason="completed"))
OVERSIZED = Oversized(limit=100, size=101)
START_FAILED: Step = lambda state: state.start_failed(  # noqa: E731
    ["adapter", "--x"], FileNotFoundError(2, "No such file or directory")
)
RUN_OVER: Step = lambda state: state.run_finished()  # noqa: E731
DEADLINE: Step = lambda state: state.deadline_passed()  # noqa: E731
DISCONNECT: Step = lambda state: state.client_disconnected()  # noqa: E731
FAILED: Step = lambda state: state.failed()  # noqa: E731
STORE_FAILED: Step = lambda state: state.failed("store_error")  # noqa: E731
NOBODY: Step = lambda state: state.nobody_listening()  # noqa: E731
FINISH: Step = lambda state: state.finish()  # noqa: E731
STOPPED = [exit_(0, stopped=True), RUN_OVER]  # it exited once the server signalled it

COMPLETED = (TurnStatus.COMPLETED, "completed")
CRASH0 = "error: adapter exited with status 0 before session.ended"
CRASH3 = "error: adapter exited with status 3 before session.ended"
TIMEOUT_NOTICE = "error[turn_timeout]: turn stopped: it ran longer than the turn timeout (30s)"
SHUTDOWN_NOTICE = "error[server_shutdown]: turn stopped: the server is shutting down"
INTERRUPT, FORCE, CANCEL, NONE = "!interrupt", "!force", "!cancel", "!none"

# name, TurnState options, inputs (then finish()), outputs in order, (status, reason)
TURN_TABLE: list[tuple[str, dict[str, Any], list[Step], list[str], tuple[TurnStatus, str]]] = [
    (
        "adapter completes",
        {},
        [STARTED, MESSAGE, END, exit_(0), RUN_OVER],
        ["session.started", "message", "session.ended/completed"],
        COMPLETED,
    ),
    (
        "session.ended without a reason is completed",
        {},
        [out(line("session.ended")), exit_(0), RUN_OVER],
        ["session.ended/-"],
        COMPLETED,
    ),
    (
        "adapter ends with an error",
        {},
        [out(line("session.ended", reason="error")), exit_(1), RUN_OVER],
        ["session.ended/error"],
        (TurnStatus.FAILED, "error"),
    ),
    (
        "adapter ends cancelled by itself",
        {},
        [out(line("session.ended", reason="cancelled")), exit_(0), RUN_OVER],
        ["session.ended/cancelled"],
        (TurnStatus.CANCELLED, "cancelled"),
    ),
    (
        "output after session.ended is dropped",
        {},
        [out(line("session.ended"), line("message")), MESSAGE, out(OVERSIZED), exit_(0), RUN_OVER],
        ["session.ended/-"],
        COMPLETED,
    ),
    (
        "an undecodable line becomes an error event, blank lines nothing",
        {},
        [out(b"not json", b"", b"  \r", b'{"v":2,"type":"x"}'), END, exit_(0), RUN_OVER],
        [
            "error: adapter printed an undecodable line (not JSON (...",
            "error: adapter printed an undecodable line (unsupported protocol version v=2"
            ' (expected 1)): {"v":2,"type":"x"}',
            "session.ended/completed",
        ],
        COMPLETED,
    ),
    (
        "an oversized line ends the turn; the lines before it are logged",
        {},
        [out(line("message"), OVERSIZED), exit_(-2, stopped=True), RUN_OVER],
        ["message", "error: adapter printed an event line longer than 100 bytes; adapter stopped"],
        (TurnStatus.FAILED, "event_too_large"),
    ),
    (
        "a session.ended before the oversized line wins",
        {},
        [out(line("session.ended"), OVERSIZED), exit_(0), RUN_OVER],
        ["session.ended/-"],
        COMPLETED,
    ),
    (
        "crash: exit without session.ended, stderr tail in the error",
        {},
        [STARTED, exit_(3, stderr=b"  boom\n"), RUN_OVER],
        ["session.started", f"{CRASH3}; stderr: boom (exitCode 3)"],
        (TurnStatus.FAILED, "adapter_exit"),
    ),
    (
        "crash without stderr",
        {},
        [exit_(0), RUN_OVER],
        [f"{CRASH0} (no stderr output) (exitCode 0)"],
        (TurnStatus.FAILED, "adapter_exit"),
    ),
    (
        "crash with --adapter-stderr log",
        {"stderr_to_client": False},
        [exit_(3, stderr=b"secret"), RUN_OVER],
        [f"{CRASH3}; its stderr is in the server log (exitCode 3)"],
        (TurnStatus.FAILED, "adapter_exit"),
    ),
    (
        "crash by a signal",
        {},
        [exit_(-9, stderr=b"x"), RUN_OVER],
        ["error: adapter was killed by SIGKILL before session.ended; stderr: x (exitCode -9)"],
        (TurnStatus.FAILED, "adapter_exit"),
    ),
    (
        "the adapter cannot start",
        {},
        [START_FAILED, RUN_OVER],
        ["error: adapter failed to start (adapter --x): No such file or directory"],
        (TurnStatus.FAILED, "adapter_start_failed"),
    ),
    (
        "nobody listens: no crash report",
        {},
        [STARTED, NOBODY, MESSAGE, exit_(3, stderr=b"boom"), RUN_OVER],
        ["session.started"],
        (TurnStatus.FAILED, "adapter_exit"),
    ),
    (
        "cancel: the adapter ends cancelled itself",
        {},
        [STARTED, stop("cancelled"), out(line("session.ended", reason="cancelled")), *STOPPED],
        ["session.started", INTERRUPT, "session.ended/cancelled"],
        (TurnStatus.CANCELLED, "cancelled"),
    ),
    (
        "cancel: the adapter exits without session.ended; the server makes one",
        {},
        [STARTED, stop("cancelled"), exit_(-2, stopped=True), RUN_OVER],
        ["session.started", INTERRUPT, "session.ended/cancelled"],
        (TurnStatus.CANCELLED, "cancelled"),
    ),
    (
        "cancel, but the adapter completes first",
        {},
        [stop("cancelled"), END, exit_(0, stopped=True), RUN_OVER],
        [INTERRUPT, "session.ended/completed"],
        COMPLETED,
    ),
    (
        "deadline: a notice before the server's session.ended",
        {},
        [STARTED, DEADLINE, exit_(-2, stopped=True), RUN_OVER],
        ["session.started", INTERRUPT, TIMEOUT_NOTICE, "session.ended/cancelled (turn timeout)"],
        (TurnStatus.CANCELLED, "turn_timeout"),
    ),
    (
        "deadline: a notice before the adapter's own session.ended",
        {},
        [DEADLINE, out(line("session.ended", reason="cancelled")), *STOPPED],
        [INTERRUPT, TIMEOUT_NOTICE, "session.ended/cancelled"],
        (TurnStatus.CANCELLED, "turn_timeout"),
    ),
    (
        "deadline, but the adapter completes: the notice, then completed",
        {},
        [DEADLINE, END, exit_(0, stopped=True), RUN_OVER],
        [INTERRUPT, TIMEOUT_NOTICE, "session.ended/completed"],
        COMPLETED,
    ),
    (
        "the first stop reason wins",
        {},
        [stop("cancelled"), DEADLINE, exit_(-2, stopped=True), RUN_OVER],
        [INTERRUPT, INTERRUPT, "session.ended/cancelled"],
        (TurnStatus.CANCELLED, "cancelled"),
    ),
    (
        "the session is ended during the turn",
        {},
        [stop("session_ended"), exit_(-2, stopped=True), RUN_OVER],
        [INTERRUPT, "session.ended/cancelled (session ended)"],
        (TurnStatus.CANCELLED, "session_ended"),
    ),
    (
        "shutdown, grace over: a notice",
        {},
        [stop("server_shutdown"), exit_(-2, stopped=True), RUN_OVER],
        [INTERRUPT, SHUTDOWN_NOTICE, "session.ended/cancelled (server shutdown)"],
        (TurnStatus.CANCELLED, "server_shutdown"),
    ),
    (
        "second signal: forced stop",
        {},
        [stop("server_shutdown", force=True), exit_(-9, stopped=True), RUN_OVER],
        [FORCE, SHUTDOWN_NOTICE, "session.ended/cancelled (server shutdown)"],
        (TurnStatus.CANCELLED, "server_shutdown"),
    ),
    (
        "the manager exits: the turn is cancelled outright, its run cut short",
        {},
        [STARTED, cancel("server_shutdown")],
        ["session.started", CANCEL, SHUTDOWN_NOTICE, "session.ended/cancelled (server shutdown)"],
        (TurnStatus.CANCELLED, "server_shutdown"),
    ),
    (
        "cut short after the adapter's end: cancelled all the same",
        {},
        [END, cancel("server_shutdown")],
        ["session.ended/completed", CANCEL],
        (TurnStatus.CANCELLED, "server_shutdown"),
    ),
    (
        "cut short after an oversized line: cancelled, not failed",
        {},
        [out(OVERSIZED), cancel("server_shutdown")],
        [
            "error: adapter printed an event line longer than 100 bytes; adapter stopped",
            CANCEL,
            SHUTDOWN_NOTICE,
            "session.ended/cancelled (server shutdown)",
        ],
        (TurnStatus.CANCELLED, "server_shutdown"),
    ),
    (
        "the client leaves (onDisconnect cancel)",
        {},
        [STARTED, DISCONNECT, exit_(-2, stopped=True), RUN_OVER],
        ["session.started", INTERRUPT, "session.ended/cancelled (client disconnected)"],
        (TurnStatus.CANCELLED, "client_disconnected"),
    ),
    (
        "the client leaves (onDisconnect continue): the turn goes on",
        {"on_disconnect": "continue"},
        [STARTED, DISCONNECT, END, exit_(0), RUN_OVER],
        ["session.started", NONE, "session.ended/completed"],
        COMPLETED,
    ),
    (
        "the client leaves after the end: nothing to stop",
        {},
        [END, exit_(0), RUN_OVER, FINISH, DISCONNECT],
        ["session.ended/completed", NONE],
        COMPLETED,
    ),
    (
        "the runner fails (the store failed) before any event",
        {},
        [FAILED],
        ["error: internal error"],
        (TurnStatus.FAILED, "internal"),
    ),
    (
        "the store refuses the log before any event: the error says so",
        {},
        [STORE_FAILED, FAILED],
        ["error[store_error]: the session store refused the turn's log"],
        (TurnStatus.FAILED, "store_error"),
    ),
    (
        "the store refuses the log after events: failed, store_error",
        {},
        [STARTED, MESSAGE, STORE_FAILED],
        ["session.started", "message"],
        (TurnStatus.FAILED, "store_error"),
    ),
    (
        "the runner fails after events: nothing more is made",
        {},
        [STARTED, MESSAGE, FAILED],
        ["session.started", "message"],
        (TurnStatus.FAILED, "internal"),
    ),
    (
        "the runner fails while the turn is stopped: it still gets its end",
        {},
        [STARTED, stop("cancelled"), FAILED],
        ["session.started", INTERRUPT, "session.ended/cancelled"],
        (TurnStatus.FAILED, "internal"),
    ),
]


def summary(event: Event) -> str:
    """An event as the table writes it."""
    data = event.data
    if event.type == "session.ended":
        text = f"session.ended/{data.get('reason', '-')}"
        return f"{text} ({data['message']})" if "message" in data else text
    if event.type == "error":
        reason = f"[{data['reason']}]" if "reason" in data else ""
        code = f" (exitCode {data['exitCode']})" if "exitCode" in data else ""
        return f"error{reason}: {data['message']}{code}"
    return event.type


def matches(got: list[str], expected: list[str]) -> bool:
    """Each output equals its row's entry (or starts with it, for an entry ending in ``...``)."""
    if len(got) != len(expected):
        return False
    return all(
        g.startswith(e[:-3]) if e.endswith("...") else g == e
        for g, e in zip(got, expected, strict=True)
    )


@pytest.mark.parametrize(
    ("options", "steps", "expected", "verdict"),
    [row[1:] for row in TURN_TABLE],
    ids=[row[0] for row in TURN_TABLE],
)
def test_turn_state_table(
    options: dict[str, Any],
    steps: list[Step],
    expected: list[str],
    verdict: tuple[TurnStatus, str],
) -> None:
    state = TurnState("s_1", turn_timeout=30, **options)
    outputs: list[str] = []
    for step in steps:
        result = step(state)
        if isinstance(result, Action):
            outputs.append(f"!{result.value}")
        elif result:
            outputs.extend(summary(event) for event in result)
    if not state.finished:
        outputs.extend(summary(event) for event in state.finish())
    assert matches(outputs, expected), outputs
    assert state.verdict == verdict
    assert state.emitted == sum(not o.startswith("!") for o in outputs)


def test_server_events_carry_the_session_id() -> None:
    state = TurnState("s_42", turn_timeout=30)
    state.stop("turn_timeout")
    notice, end = state.finish()
    assert notice.json()["sessionId"] == end.json()["sessionId"] == "s_42"
    assert notice.data["reason"] == "turn_timeout"
    assert state.output([line("message")]) == [], "nothing is read once the state has ended"


# -- the line framer ----------------------------------------------------------------------

OVER = Oversized


# chunks, limit, what feed (each chunk) then end return, in order
FRAMER_TABLE: list[tuple[str, list[bytes], int, list[Line | type[Oversized]]]] = [
    ("one line", [b"abc\n"], 10, [b"abc"]),
    ("lines in one chunk", [b"a\nb\nc\n"], 10, [b"a", b"b", b"c"]),
    ("a line across chunks", [b"ab", b"c", b"d\ne", b"f\n"], 10, [b"abcd", b"ef"]),
    ("the newline alone", [b"abc", b"\n"], 10, [b"abc"]),
    ("CRLF: the CR stays", [b"a\r\n", b"b\r", b"\n"], 10, [b"a\r", b"b\r"]),
    ("empty lines", [b"\n\n", b"a\n\n"], 10, [b"", b"", b"a", b""]),
    ("unterminated last line", [b"a\nbc", b"d"], 10, [b"a", b"bcd"]),
    ("no bytes at all", [], 10, []),
    ("empty chunks", [b"", b"a", b"", b"\n"], 10, [b"a"]),
    ("exactly the limit fits", [b"abcd\n"], 4, [b"abcd"]),
    ("one byte over", [b"abcde\n"], 4, [OVER]),
    ("oversized in the middle", [b"ab\nabcdef\ncd\n"], 4, [b"ab", OVER]),
    ("oversized found before its newline", [b"ab\nabc", b"de"], 4, [b"ab", OVER]),
    ("oversized rest of a chunk", [b"ab\nabcdef"], 4, [b"ab", OVER]),
    ("nothing after oversized", [b"abcdef\n", b"ab\n", b"cd"], 4, [OVER]),
    ("oversized unterminated last line", [b"a\n", b"abcdefg"], 4, [b"a", OVER]),
    ("limit 0: only empty lines pass", [b"\n\nx\n"], 0, [b"", b"", OVER]),
]


def frame(chunks: list[bytes], limit: int) -> list[Line | Oversized]:
    framer = LineFramer(limit)
    got: list[Line | Oversized] = []
    for chunk in chunks:
        got.extend(framer.feed(chunk))
    got.extend(framer.end())
    return got


def shape(items: list[Line | Oversized]) -> list[Line | type[Oversized]]:
    return [Oversized if isinstance(item, Oversized) else item for item in items]


@pytest.mark.parametrize(
    ("chunks", "limit", "expected"),
    [row[1:] for row in FRAMER_TABLE],
    ids=[row[0] for row in FRAMER_TABLE],
)
def test_line_framer_table(
    chunks: list[bytes], limit: int, expected: list[Line | type[Oversized]]
) -> None:
    got = frame(chunks, limit)
    assert shape(got) == expected
    for item in got:
        if isinstance(item, Oversized):
            assert item.limit == limit and item.size > limit


def model(data: bytes, limit: int) -> list[Line | type[Oversized]]:
    """What framing ``data`` must give, whatever its chunks."""
    *complete, last = data.split(b"\n")
    expected: list[Line | type[Oversized]] = []
    for item in [*complete, last] if last else complete:
        if len(item) > limit:
            return [*expected, Oversized]
        expected.append(item)
    return expected


@given(
    lines=st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"\r")), max_size=8),
    terminated=st.booleans(),
    limit=st.integers(min_value=0, max_value=10),
    cuts=st.lists(st.integers(min_value=0, max_value=120), max_size=10),
)
def test_line_framer_any_chunking(
    lines: list[bytes], terminated: bool, limit: int, cuts: list[int]
) -> None:
    data = b"\n".join(lines) + (b"\n" if terminated and lines else b"")
    points = sorted({min(cut, len(data)) for cut in cuts} | {0, len(data)})
    chunks = [data[a:b] for a, b in itertools.pairwise(points)]
    assert shape(frame(chunks, limit)) == model(data, limit)
    byte_by_byte = [data[i : i + 1] for i in range(len(data))]
    assert shape(frame(byte_by_byte, limit)) == model(data, limit)
