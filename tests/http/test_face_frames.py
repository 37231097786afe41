"""The faces' frames written from templates are the frames the protocols' packages write.

AG-UI's text messages and ``RAW`` events and A2A's reply pieces are written
from byte templates (no model per event: docs/benchmarks.md, faces); here
each template's frame is checked against the package's own model of the
same event: AG-UI byte for byte (``model_dump_json(by_alias=True)``), A2A
as the same JSON value as ``MessageToDict`` of the message (which writes
the ``seq`` as a float), and parsed back into the package's message.
Sans I/O: the writers are fed logged events directly.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from a2a.types.a2a_pb2 import StreamResponse
from ag_ui.core import Event, RawEvent
from google.protobuf import json_format
from pydantic import TypeAdapter

from trioserve.http._a2a_tasks import TaskStream, TaskView, proto_dict
from trioserve.http._agui import AguiRun
from trioserve.protocol import TurnStatus
from trioserve.stores.records import LoggedEvent, TurnRecord

EVENT: TypeAdapter[Any] = TypeAdapter(Event)
TEXTS = [
    "plain",
    "",
    'quotes " and \\ backslashes',
    "é, 漢字 and 🐍",
    "a line\nbreak, a tab\t, a NUL \x00 and U+2028 \u2028",
    "</script>",
]


def logged(seq: int, kind: str, data: dict[str, Any]) -> LoggedEvent:
    value = {"seq": seq, "v": 1, "type": kind, "sessionId": "s_abc", "data": data}
    raw = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    return LoggedEvent(seq, "t_xyz", kind, raw)


def frames(body: bytes) -> list[tuple[int | None, bytes]]:
    """The (id, data) of each SSE frame of ``body``."""
    out = []
    for block in body.split(b"\n\n"):
        if not block:
            continue
        seq, data = None, b""
        for line in block.split(b"\n"):
            name, _, value = line.partition(b": ")
            if name == b"id":
                seq = int(value)
            elif name == b"data":
                data = value
        out.append((seq, data))
    return out


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("delta", [False, True])
def test_agui_text_frames_are_the_models_bytes(text: str, delta: bool) -> None:
    run = AguiRun("thread", "run", "s_abc", "t_xyz")
    run.started = True
    data: dict[str, Any] = {"role": "assistant", "text": text}
    if delta:
        data["delta"] = True
    events = [logged(2, "message", data), logged(3, "session.ended", {"reason": "completed"})]
    made = frames(run.frames(events))
    for _, raw in made:
        model = EVENT.validate_json(raw)
        assert model.model_dump_json(by_alias=True).encode() == raw
    kinds = [EVENT.validate_json(raw).type.value for _, raw in made]
    # A whole message is its three frames; a piece opens one, which the next event closes.
    expected = ["TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END", "RAW"]
    if not text:  # no content frame for an empty text
        expected.remove("TEXT_MESSAGE_CONTENT")
    assert kinds == expected
    contents = [EVENT.validate_json(raw) for _, raw in made]
    assert "".join(getattr(e, "delta", "") for e in contents) == text
    # The last frame of each logged event carries its seq.
    assert [seq for seq, _ in made if seq is not None] == [2, 3]


def test_agui_raw_frames_hold_the_event_as_logged() -> None:
    run = AguiRun("thread", "run", "s_abc", "t_xyz")
    run.started = True
    event = logged(1, "session.started", {"note": 'é \u2028 "q"'})
    [(seq, raw)] = frames(run.frames([event]))
    assert seq == 1
    model = RawEvent(event=json.loads(event.raw), source="trioserve")
    assert raw == model.model_dump_json(by_alias=True).encode()
    # An adapter's own spacing is kept (the event's bytes as logged), the value the same.
    spaced = LoggedEvent(2, "t_xyz", "error", b'{"seq":2, "type": "error", "data": {}}')
    [(_, raw)] = frames(run.frames([spaced]))
    assert EVENT.validate_json(raw) == RawEvent(event=json.loads(spaced.raw), source="trioserve")


def test_agui_a_lone_surrogate_is_escaped_not_lost() -> None:
    run = AguiRun("thread", "run", "s_abc", "t_xyz")
    run.started = True
    raw = b'{"seq":1,"v":1,"type":"message","data":{"role":"assistant","text":"a\\ud800b"}}'
    made = frames(run.frames([LoggedEvent(1, "t_xyz", "message", raw)]))
    content = json.loads(made[1][1])
    assert content["type"] == "TEXT_MESSAGE_CONTENT" and content["delta"] == "a\ud800b"


def record() -> TurnRecord:
    now = datetime.now(UTC)
    return TurnRecord("t_xyz", "s_abc", "hi", TurnStatus.RUNNING, now, started_at=now)


@pytest.mark.parametrize("rid", [7, "req-\u00e9", None])
def test_a2a_piece_frames_are_the_messages_json(rid: Any) -> None:
    pieces = [{"role": "assistant", "text": t, "delta": True} for t in TEXTS]
    events = [logged(i + 2, "message", data) for i, data in enumerate(pieces)]
    events.append(logged(len(events) + 2, "tool.call", {"callId": "c", "toolName": "x"}))
    written = frames(TaskStream(TaskView(record()), rid).frames(events))
    reference = TaskView(record())
    assert len(written) == len(events)
    for event, (seq, raw) in zip(events, written, strict=True):
        expected = reference.add(event)
        assert expected is not None and seq == event.seq
        value = json.loads(raw)
        assert value == {"jsonrpc": "2.0", "id": rid, "result": proto_dict(expected)}
        parsed = json_format.ParseDict(value["result"], StreamResponse())
        assert parsed == expected
