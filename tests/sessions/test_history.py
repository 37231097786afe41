"""A session's earlier turns as the server hands them to adapters that remember."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from trioserve.protocol import SessionStatus, TurnStatus
from trioserve.sessions._history import turn_context
from trioserve.stores.memory import MemoryStore
from trioserve.stores.records import LoggedEvent, Session, TurnEnd, TurnRecord, utcnow


class Log:
    """A memory store with one session, and turns logged as an adapter prints them."""

    def __init__(self) -> None:
        self.store = MemoryStore()
        self.seq = 0
        self.turns = 0

    async def open(self) -> None:
        now = utcnow()
        session = Session("s_1", "agent", "openai", SessionStatus.ACTIVE, now, now)
        await self.store.create(session)

    async def turn(
        self, text: str, events: list[tuple[str, dict[str, Any]]], status: TurnStatus
    ) -> None:
        self.turns += 1
        turn_id = f"t_{self.turns}"
        start = utcnow() + timedelta(seconds=self.turns)
        await self.store.create_turn(TurnRecord(turn_id, "s_1", text, TurnStatus.RUNNING, start))
        logged = []
        for event_type, data in events:
            self.seq += 1
            raw = json.dumps({"seq": self.seq, "v": 1, "type": event_type, "data": data})
            logged.append(LoggedEvent(self.seq, turn_id, event_type, raw.encode()))
        end = TurnEnd(status, status.value, start)
        await self.store.append_events("s_1", turn_id, logged, started_at=start, end=end)


def reply(text: str, **extra: Any) -> tuple[str, dict[str, Any]]:
    return "message", {"role": "assistant", "text": text, **extra}


async def test_completed_turns_oldest_first_with_whole_messages_and_tools() -> None:
    log = Log()
    await log.open()
    call = {"toolName": "add", "callId": "c1", "args": {}}
    await log.turn(
        "one",
        [
            ("session.started", {"pid": 1}),
            reply("O", delta=True),
            reply("One", final=True),
            ("tool.call", call),
            ("tool.result", {"callId": "c1", "content": "2"}),
            ("session.ended", {"reason": "completed"}),
        ],
        TurnStatus.COMPLETED,
    )
    await log.turn("failed", [reply("no", final=True)], TurnStatus.FAILED)
    await log.turn("", [reply("Two")], TurnStatus.COMPLETED)  # an empty input: the task
    await log.turn("silent", [("session.ended", {})], TurnStatus.COMPLETED)
    context = await turn_context(log.store, "s_1", "the task")
    assert [(t.input, [e.type for e in t.events]) for t in context.history] == [
        ("one", ["message", "tool.call", "tool.result"]),
        ("the task", ["message"]),
    ]
    assert context.history[0].events[0].data == {"role": "assistant", "text": "One", "final": True}
    assert context.omitted_turns == 0


async def test_older_turns_past_the_bounds_are_left_out_and_counted() -> None:
    log = Log()
    await log.open()
    for i in range(6):
        await log.turn(f"q{i}", [reply("x" * 100)], TurnStatus.COMPLETED)
    by_count = await turn_context(log.store, "s_1", "", max_turns=2)
    assert [t.input for t in by_count.history] == ["q4", "q5"] and by_count.omitted_turns == 4
    by_size = await turn_context(log.store, "s_1", "", max_bytes=600)  # about 170 bytes a turn
    assert [t.input for t in by_size.history] == ["q3", "q4", "q5"] and by_size.omitted_turns == 3
