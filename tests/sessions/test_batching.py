"""The event path in batches (issue 23): a real adapter's lines, read a pipe read at a time,
numbered, stored and published batch by batch, in order, and nothing lost when a
batch's store write fails."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import pytest
import trio
import trio.testing

from tests.helpers import typed_spec
from trioserve.errors import StoreError
from trioserve.protocol import SessionStatus, TurnStatus
from trioserve.runtime import wire
from trioserve.runtime._handle import ProcessHandle
from trioserve.runtime._lifecycle import TurnState
from trioserve.runtime._process import run_adapter
from trioserve.sessions._feed import Feed
from trioserve.sessions._turns import Turn, TurnLog, logged, logged_batch
from trioserve.stores import LoggedEvent, MemoryStore, Session, TurnRecord, utcnow

SAFETY = 30  # seconds: a hung test fails instead of hanging the suite
EVENTS = 3000

#: An adapter that reads its spec, then prints ``EVENTS`` message events in a few big
#: writes (so that a pipe read holds many lines) and its end.
ADAPTER = f"""
import json, sys
sys.stdin.buffer.read()
def line(kind, data):
    return json.dumps({{"v": 1, "type": kind, "sessionId": "s_1", "data": data}}) + "\\n"
out = [line("session.started", {{}})]
out += [line("message", {{"role": "assistant", "text": "piece %d" % i}}) for i in range({EVENTS})]
for start in range(0, len(out), 500):
    sys.stdout.write("".join(out[start:start + 500]))
    sys.stdout.flush()
sys.stdout.write(line("session.ended", {{"reason": "completed"}}))
"""


class Recording(MemoryStore):
    """A memory store that keeps the size of each batch it appended, and refuses the
    appends listed in ``fail`` (by their number, from 1; a refused one is kept too).

    An append the writer's cancellation interrupts (the turn ended as it wrote) appends
    nothing and is not kept: its events go with the turn's end."""

    def __init__(self, fail: frozenset[int] = frozenset()) -> None:
        super().__init__()
        self.batches: list[int] = []
        self._fail = fail

    async def append_events(self, *args: Any, **kwargs: Any) -> None:
        events = args[2] if len(args) > 2 else kwargs["events"]
        if len(self.batches) + 1 in self._fail:
            self.batches.append(len(events))
            raise StoreError("the disk is full for a moment")
        await super().append_events(*args, **kwargs)
        self.batches.append(len(events))


async def _turn(store: MemoryStore) -> Turn:
    now = utcnow()
    await store.create(Session("s_1", "a", "exec", SessionStatus.ACTIVE, now, now))
    record = TurnRecord("t_1", "s_1", "hi", TurnStatus.RUNNING, now)
    await store.create_turn(record)
    return Turn(record, Feed(first_seq=1), TurnState("s_1"))


async def _run(store: Recording) -> tuple[list[LoggedEvent], BaseException | None]:
    """One turn of the adapter through the turn's log, as the runner runs it; returns
    what a reader following its feed saw, and what stopped the log writer."""
    turn = await _turn(store)
    log = TurnLog(store, turn)
    seen: list[LoggedEvent] = []
    failed: BaseException | None = None

    async def follow() -> None:
        pos = 0
        while True:
            batch = turn.feed.after(pos)
            assert batch is not None, "the feed's window holds a whole test turn"
            seen.extend(batch)
            pos = seen[-1].seq if seen else pos
            if turn.feed.finished and not turn.feed.after(pos):
                return
            await turn.feed.wait(pos)

    async def write() -> None:
        nonlocal failed
        try:
            await log.run()
        except StoreError as exc:  # as the runner does: the turn stops, failed
            failed = exc
            nursery.cancel_scope.cancel()

    with trio.fail_after(SAFETY):
        async with trio.open_nursery() as readers:
            readers.start_soon(follow)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(write)
                await run_adapter(
                    [sys.executable, "-c", ADAPTER],
                    typed_spec().with_turn("hi", "s_1"),
                    "s_1",
                    log,
                    policy=ProcessHandle(grace=2.0),
                    max_event_bytes=1 << 20,
                    state=turn.state,
                )
                nursery.cancel_scope.cancel()
            if failed is not None:
                turn.state.failed("store_error")
            end = log.end_turn()
            await log.close(end)
            log.finish()
    return seen, failed


def _check_log(stored: list[LoggedEvent], messages_read: int = EVENTS) -> None:
    """Every event once, numbered 1, 2, ... in the adapter's order, its bytes the
    adapter's with ``seq`` put first."""
    assert [e.seq for e in stored] == list(range(1, len(stored) + 1))
    assert stored[0].type == "session.started"
    messages = [e for e in stored if e.type == "message"]
    assert len(messages) == messages_read
    assert stored[1 : 1 + len(messages)] == messages
    for i, event in enumerate(messages):
        value = json.loads(event.raw)
        assert next(iter(value)) == "seq" and value["seq"] == event.seq
        assert value["data"]["text"] == f"piece {i}"
        adapter_bytes = json.dumps(
            {"v": 1, "type": "message", "sessionId": "s_1", "data": value["data"]}
        ).encode()
        assert event.raw == b'{"seq":%d,' % event.seq + adapter_bytes[1:]


async def test_a_pipe_reads_lines_are_stored_and_published_as_batches_in_order() -> None:
    store = Recording()
    seen, failed = await _run(store)
    assert failed is None
    stored = await store.read_events("s_1")
    _check_log(stored)
    assert stored[-1].type == "session.ended"
    assert seen == stored, "a reader sees what the store has, in its order, once each"
    # The lines of a read went to the store together: far fewer writes than events.
    assert sum(store.batches) == len(stored)
    assert max(store.batches) > 1
    assert len(store.batches) < len(stored) // 10
    record = await store.get_turn("s_1", "t_1")
    assert (record.status, record.first_seq, record.last_seq) == (
        TurnStatus.COMPLETED,
        1,
        len(stored),
    )


@pytest.mark.parametrize("failing", [1, 2], ids=["first-batch", "second-batch"])
async def test_nothing_is_lost_when_a_batchs_store_write_fails(failing: int) -> None:
    store = Recording(fail=frozenset({failing}))
    seen, failed = await _run(store)
    assert isinstance(failed, StoreError)
    stored = await store.read_events("s_1")
    # The refused batch and all read after it were kept and written with the turn's
    # end: every line read is stored once, in order (the turn, stopped, logs no more).
    # The adapter may have written its last line before the failure stopped the turn:
    # then its session.ended was read, and is stored last.
    adapter_ended = stored[-1].type == "session.ended"
    messages = len(stored) - 1 - adapter_ended
    _check_log(stored, messages_read=messages)
    assert len(stored) >= sum(store.batches[:failing]), "the refused batch is stored"
    assert seen == stored
    record = await store.get_turn("s_1", "t_1")
    assert (record.status, record.reason) == (TurnStatus.FAILED, "store_error")
    assert record.last_seq == len(stored)


class Slow(MemoryStore):
    """A memory store whose appends each take ``seconds``; ``appended`` counts events."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.appended = 0

    async def append_events(self, *args: Any, **kwargs: Any) -> None:
        await trio.sleep(self.seconds)
        await super().append_events(*args, **kwargs)
        self.appended += len(args[2] if len(args) > 2 else kwargs["events"])


def _message(i: int) -> wire.Event:
    data = {"role": "assistant", "text": f"piece {i}"}
    line = json.dumps({"v": 1, "type": "message", "sessionId": "s_1", "data": data})
    return wire.decode_line(line.encode())


async def test_the_turns_deadline_passes_once_on_its_writer_while_events_come() -> None:
    """The turn's timeout rides on its log writer: ``at_deadline`` is called once, at the
    deadline, though events keep coming after it, and they are all written."""
    store = Slow(0.0)
    log = TurnLog(store, await _turn(store))
    calls: list[tuple[float, int]] = []  # (when, events stored then)

    def passed() -> None:
        calls.append((trio.current_time(), store.appended))

    deadline = trio.current_time() + 0.3
    with trio.fail_after(SAFETY):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(log.run, deadline, passed)
            for i in range(40):  # an event every 20 ms, across the deadline
                await log.send(_message(i))
                await trio.sleep(0.02)
            nursery.cancel_scope.cancel()
    assert len(calls) == 1
    assert calls[0][0] >= deadline
    assert 5 <= calls[0][1] < 39, "at the deadline, not at the end"
    assert store.appended == 40


async def test_a_write_under_way_at_the_deadline_is_finished_first() -> None:
    store = Slow(0.5)
    log = TurnLog(store, await _turn(store))
    stored_then: list[int] = []
    with trio.fail_after(SAFETY):
        async with trio.open_nursery() as nursery:
            log.add(_message(0))
            deadline = trio.current_time() + 0.1  # while the write takes 0.5 s
            nursery.start_soon(log.run, deadline, lambda: stored_then.append(store.appended))
            await trio.sleep(0.8)
            nursery.cancel_scope.cancel()
    assert stored_then == [1], "called once, after the write it did not cut"


async def test_a_stopped_log_calls_no_deadline_that_passed_meanwhile() -> None:
    """A turn that ended is over: a deadline passing before its writer wakes to stop
    does not stop it again (its verdict is taken after)."""
    store = MemoryStore()
    log = TurnLog(store, await _turn(store))
    called: list[int] = []
    with trio.fail_after(SAFETY):
        async with trio.open_nursery() as nursery:
            deadline = trio.current_time() + 0.05
            nursery.start_soon(log.run, deadline, lambda: called.append(1))
            await trio.testing.wait_all_tasks_blocked()
            time.sleep(0.1)  # the deadline passes while the loop is held: the writer sees
            log.stop()  # both the deadline and the stop when it next runs
    assert called == [], "the deadline came after the stop"


SEVENTH = {
    "plain": b'{"v":1,"type":"message","data":{"text":"7"}}',
    "a seq of its own": b'{"v":1,"seq":99,"type":"message","data":{"seq":5}}',
    "a seq written with escapes": b'{"v":1,"s\\u0065q":99,"type":"message","data":{}}',
    "a seq in its data": b'{"v":1,"type":"message","data":{"seq":5}}',
}


@pytest.mark.parametrize("seventh", SEVENTH.values(), ids=SEVENTH.keys())
def test_a_pipe_reads_batch_is_numbered_as_its_events_are_one_by_one(seventh: bytes) -> None:
    lines = [b'{"v":1,"type":"message","data":{"text":"%d"}}' % i for i in range(40)]
    lines[7] = seventh
    batch = wire.decode_lines(lines)
    assert isinstance(batch, wire.EventBatch)  # the columns, no Event made
    numbered, size = logged_batch(batch, 11, "t_1")
    one_by_one = [logged(wire.decode_line(line), 11 + i, "t_1") for i, line in enumerate(lines)]
    assert numbered == one_by_one
    assert size == sum(len(event.raw) for event in one_by_one)
    assert logged_batch(list(batch), 11, "t_1") == (numbered, size), "Events number the same"
    assert numbered[7].raw.startswith(b'{"seq":18,')
    assert json.loads(numbered[7].raw)["seq"] == 18, "the one seq a client reads is the log's"
    if b"99" not in seventh:  # kept byte for byte, the log's seq put first
        assert numbered[7].raw == b'{"seq":18,' + seventh[1:]
