"""decode_line's fast way (msgspec, ``data`` left undecoded) against its full way: the
same event, or the same refusal, for any line; and decode_lines, a pipe read's lines in
one call, against decode_line line by line (issue 23)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trioserve.runtime._wire import DecodeError, Event, _decode_full, decode_line, decode_lines

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
_types = st.sampled_from(["message", "session.ended", "", "a\nb", "a\rb", "a\x00b", "é", "a\tb"])


@st.composite
def lines(draw: st.DrawFn) -> bytes:
    obj: dict[str, Any] = {}
    if draw(st.booleans()):
        obj["v"] = draw(st.sampled_from([1, 1, 1, 2, 1.0, True, "1", None]))
    if draw(st.booleans()):
        obj["type"] = draw(_types | st.text() | st.integers())
    if draw(st.booleans()):
        obj["data"] = draw(st.dictionaries(st.text(), _json, max_size=4) | _json)
    for key in draw(st.lists(st.sampled_from(["ts", "sessionId", "seq", "x"]), max_size=3)):
        obj[key] = draw(_json)
    text = json.dumps(
        obj,
        ensure_ascii=draw(st.booleans()),
        separators=draw(st.sampled_from([(",", ":"), (", ", ": "), (",\r", ":")])),
    )
    line = text.encode("utf-8", "surrogatepass")
    return draw(st.sampled_from([line, b" " + line + b"\r", line + b"x", line[:-1]]))


def _outcome(decode: Any, line: bytes) -> tuple[str, bytes, str] | str:
    try:
        event: Event = decode(line)
    except DecodeError as exc:
        return f"refused: {exc}"
    return event.type, event.raw, repr(event.data)  # repr: NaN == NaN


@settings(max_examples=400, deadline=None)
@given(lines())
def test_the_fast_way_decodes_a_line_as_the_full_way_does(line: bytes) -> None:
    assert _outcome(decode_line, line) == _outcome(_decode_full, line)


def test_session_endeds_data_is_decoded_when_asked_for() -> None:
    event = decode_line(b'{"v":1,"type":"session.ended","data":{"reason":"completed","n":[1]}}')
    assert event.body is None, "the fast way builds no data"
    assert event.end_reason == "completed"
    assert event.data == {"reason": "completed", "n": [1]}
    deep = b'{"v":1,"type":"x","data":{"a":' + b"[" * 300 + b"]" * 300 + b"}}"
    assert decode_line(deep).data == json.loads(deep)["data"]


@pytest.mark.parametrize(
    "line",
    [
        b'{"v":1,"type":"message","data":{"text":"\xff"}}',  # not UTF-8: refused
        b'{"v":1,"type":"message","data":{"text":"\xed\xa0\x80"}}',  # json takes it
        b'{"v":1,"type":"message","data":{"text":"\\ud800"}}',
        b'{"v":1,"type":"message","data":{"x":NaN}}',
        b'{"v":1,"type":"message\\u0000","data":{}}',
        b'{"v":1,"type":"a","type":"b","data":{},"data":[]}',
    ],
    ids=["bad-utf8", "encoded-surrogate", "surrogate-escape", "nan", "nul-type", "repeated"],
)
def test_lines_the_fast_way_must_leave_to_the_full_way(line: bytes) -> None:
    assert _outcome(decode_line, line) == _outcome(_decode_full, line)


def _one_by_one(batch: list[bytes]) -> list[tuple[str, bytes, str]] | None:
    """What decode_line makes of each line, or None if it refuses one."""
    try:
        return [(e.type, e.raw, repr(e.data)) for e in map(decode_line, batch)]
    except DecodeError:
        return None


@settings(max_examples=300, deadline=None)
@given(st.lists(lines(), max_size=6))
def test_a_batch_decodes_as_its_lines_do_one_by_one_or_not_at_all(batch: list[bytes]) -> None:
    events = decode_lines(batch)
    if events is not None:  # else the caller goes line by line: nothing to compare
        assert [(e.type, e.raw, repr(e.data)) for e in events] == _one_by_one(batch)


def test_a_batch_of_plain_lines_is_one_call() -> None:
    batch = [b'{"v":1,"type":"message","data":{"text":"%d \xc3\xa9"}}' % i for i in range(50)]
    events = decode_lines(batch)
    assert events is not None and [e.raw for e in events] == batch
    assert [e.type for e in events] == ["message"] * 50


@pytest.mark.parametrize(
    "batch",
    [
        # Neither of the first two lines is JSON; read as one stream they make one object,
        # and the third line two: as many values as lines, none of them a line.
        [b'{"v":1,"type":"x","d":"}', b'{"}', b'{"v":1,"type":"y"},{"v":1,"type":"z"}'],
        [b'{"v":1,"type":"a"} {"v":1,"type":"b"}'],  # two objects on one line
        [b'{"v":1,"type":"a"}', b""],  # a blank line
        [b' {"v":1,"type":"a"}'],  # space around the object
        [b'{"v":1,"type":"a\\u00e9"}'],  # a type that is not ASCII
        [b'{"v":1,"type":"a"}', b'{"v":1,"type":"b","x":"\xff"}'],  # not UTF-8
    ],
)
def test_a_batch_with_any_doubt_goes_line_by_line(batch: list[bytes]) -> None:
    assert decode_lines(batch) is None


def test_a_batch_gives_events_by_index_slice_and_iteration_alike() -> None:
    batch = [b'{"v":1,"type":"t%d","data":{"n":%d}}' % (i % 3, i) for i in range(7)]
    events = decode_lines(batch)
    assert events is not None and len(events) == 7
    every = list(events)
    assert every == [decode_line(line) for line in batch]
    assert [events[i] for i in range(7)] == every and events[-1] == every[-1]
    assert events[2:5] == every[2:5] and events[::-2] == every[::-2]
    assert every[4].data == {"n": 4}, "data is decoded when asked for"
