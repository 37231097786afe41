"""Wire events: decoding adapter lines, synthesizing server events, SSE framing."""

from __future__ import annotations

import json
import re
from datetime import datetime

import pytest

from trioserve.http._sse import sse_frames
from trioserve.protocol import EVENTS_API_VERSION, KNOWN_TYPES
from trioserve.runtime._wire import (
    DecodeError,
    Event,
    decode_line,
    error_event,
    synthesize,
    with_seq,
)
from trioserve.stores import LoggedEvent

RFC3339_Z = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$")


# --- decode_line: valid events -------------------------------------------------------


def test_valid_event_keeps_raw_bytes_untouched() -> None:
    line = b'{"v": 1,  "type":"message", "ts":"2026-01-01T00:00:00Z","sessionId":"s_1",'
    line += b' "data":{"role":"assistant","content":"h\\u00e9llo \xc3\xa9"}, "extra":[1, 2.50]}'
    event = decode_line(line)
    assert event.raw == line
    assert event.type == "message"
    assert event.data == {"role": "assistant", "content": "h\u00e9llo \u00e9"}


def test_unknown_type_and_extra_fields_pass_through_byte_for_byte() -> None:
    line = b'{"type":"future.thing","v":1,"data":{"a":{"b":[null,true]}},"zzz":{"k":"v"}}'
    event = decode_line(line)
    assert event.type == "future.thing"
    assert event.type not in KNOWN_TYPES
    assert event.raw == line
    assert event.json()["zzz"] == {"k": "v"}


def test_data_is_optional() -> None:
    event = decode_line(b'{"v":1,"type":"warning"}')
    assert event.data == {}
    assert event.raw == b'{"v":1,"type":"warning"}'


def test_line_with_carriage_return_is_reserialized_to_one_equal_line() -> None:
    value = {"v": 1, "type": "message", "data": {"content": "a\r\nb", "n": 3}}
    # JSON whitespace between tokens may be \r; SSE would treat it as a line break.
    line = b'{"v":1,\r"type":"message",\r\n"data":{"content":"a\\r\\nb","n":3}}'
    event = decode_line(line)
    assert b"\r" not in event.raw
    assert b"\n" not in event.raw
    assert json.loads(event.raw) == value
    assert event.type == "message"


def test_trailing_carriage_return_of_a_crlf_line_is_not_forwarded() -> None:
    event = decode_line(b'{"v":1,"type":"message","data":{}}\r')
    assert b"\r" not in event.raw
    assert json.loads(event.raw) == {"v": 1, "type": "message", "data": {}}


# --- decode_line: invalid events ------------------------------------------------------


@pytest.mark.parametrize(
    "version",
    ["2", '"1"', "true", "1.0", "0", "null", "[1]"],
    ids=["v=2", "v-string", "v-true", "v-float", "v=0", "v-null", "v-list"],
)
def test_version_must_be_integer_one(version: str) -> None:
    line = f'{{"v":{version},"type":"message","data":{{}}}}'.encode()
    with pytest.raises(DecodeError, match=r"\bv\b"):
        decode_line(line)


def test_missing_version_is_an_error_naming_v() -> None:
    with pytest.raises(DecodeError, match=r"\bv\b"):
        decode_line(b'{"type":"message","data":{}}')


@pytest.mark.parametrize(
    "line",
    [b"hello", b"{", b'{"v":1,"type":"message"', b"", b"\xff\xfe", b"{'v':1}"],
    ids=["word", "brace", "truncated", "empty", "bad-utf8", "single-quotes"],
)
def test_non_json_is_a_decode_error(line: bytes) -> None:
    with pytest.raises(DecodeError, match="JSON"):
        decode_line(line)


def test_nesting_deeper_than_any_parser_goes_is_a_decode_error() -> None:
    deep = b'{"v":1,"type":"tool.result","data":{"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}}"
    with pytest.raises(DecodeError, match=r"not JSON \(nested too deep\)"):
        decode_line(deep)
    # Deeper than pydantic-core's limit (200) but within json's: still an event.
    deeper = b'{"v":1,"type":"tool.result","data":{"x":' + b"[" * 500 + b"]" * 500 + b"}}"
    assert decode_line(deeper).type == "tool.result"


@pytest.mark.parametrize("line", [b'[{"v":1,"type":"message"}]', b'"message"', b"1", b"null"])
def test_json_that_is_not_an_object_is_a_decode_error(line: bytes) -> None:
    with pytest.raises(DecodeError, match="object"):
        decode_line(line)


@pytest.mark.parametrize(
    "type_field",
    ["", ',"type":""', ',"type":5', ',"type":null', ',"type":["message"]'],
    ids=["missing", "empty", "number", "null", "list"],
)
def test_type_must_be_a_non_empty_string(type_field: str) -> None:
    line = f'{{"v":1{type_field},"data":{{}}}}'.encode()
    with pytest.raises(DecodeError, match="type"):
        decode_line(line)


@pytest.mark.parametrize("escape", ["\\n", "\\r"])
def test_type_containing_a_line_break_is_rejected(escape: str) -> None:
    # A type with a newline would let an adapter inject SSE fields.
    line = f'{{"v":1,"type":"message{escape}data: forged","data":{{}}}}'.encode()
    with pytest.raises(DecodeError, match="type"):
        decode_line(line)


def test_type_containing_nul_is_rejected() -> None:
    # The store keeps the type as a key (PostgreSQL's text cannot hold a NUL).
    with pytest.raises(DecodeError, match="field 'type' must not contain NUL"):
        decode_line(b'{"v":1,"type":"mess\\u0000age","data":{}}')


@pytest.mark.parametrize("data", ["[]", '"text"', "1", "null", "true"])
def test_data_must_be_an_object(data: str) -> None:
    line = f'{{"v":1,"type":"message","data":{data}}}'.encode()
    with pytest.raises(DecodeError, match="data"):
        decode_line(line)


def test_decode_error_is_a_value_error() -> None:
    assert issubclass(DecodeError, ValueError)


# --- synthesized events ---------------------------------------------------------------


def _check_server_event(event: Event, session_id: str, event_type: str) -> dict[str, object]:
    obj = json.loads(event.raw)
    assert b"\n" not in event.raw
    assert obj["v"] == 1
    assert obj["apiVersion"] == EVENTS_API_VERSION == "agent-controller.dev/events/v1alpha1"
    assert obj["type"] == event_type == event.type
    assert obj["sessionId"] == session_id
    assert RFC3339_Z.match(obj["ts"]), obj["ts"]
    datetime.fromisoformat(obj["ts"].replace("Z", "+00:00"))
    # What the server emits must decode like an adapter's event.
    again = decode_line(event.raw)
    assert again.type == event_type
    assert again.data == event.data
    return dict(obj)


def test_synthesize_carries_session_id_version_api_version_and_ts() -> None:
    event = synthesize("warning", "s_abc123", {"message": "careful", "n": 1})
    obj = _check_server_event(event, "s_abc123", "warning")
    assert obj["data"] == {"message": "careful", "n": 1}
    assert event.data == {"message": "careful", "n": 1}


def test_error_event_has_message_and_extra_fields() -> None:
    event = error_event("s_xyz", "adapter crashed\nbadly", exitCode=3)
    obj = _check_server_event(event, "s_xyz", "error")
    assert obj["data"] == {"message": "adapter crashed\nbadly", "exitCode": 3}
    assert not event.is_end
    assert event.end_reason is None


def test_synthesized_non_ascii_text_round_trips() -> None:
    event = error_event("s_1", "échec: 失败")
    assert json.loads(event.raw)["data"]["message"] == "échec: 失败"


# --- SSE framing ----------------------------------------------------------------------


def frame_of(event: Event, seq: int = 42) -> bytes:
    return sse_frames([LoggedEvent(seq, "t_1", event.type, event.raw)])


def test_sse_frame_format() -> None:
    line = b'{"v":1,"type":"tool.call","data":{"name":"bash"}}'
    event = decode_line(line)
    assert frame_of(event) == b"event: tool.call\ndata: " + line + b"\nid: 42\n\n"
    two = sse_frames([LoggedEvent(1, "t", "a", b"{}"), LoggedEvent(2, "t", "b", b"[]")])
    assert two == b"event: a\ndata: {}\nid: 1\n\nevent: b\ndata: []\nid: 2\n\n"


def test_sse_frame_of_synthesized_event() -> None:
    event = error_event("s_1", "boom")
    frame = frame_of(event, 7)
    assert frame.startswith(b"event: error\ndata: {")
    assert frame.endswith(b"}\nid: 7\n\n")
    assert frame.count(b"\n") == 4
    data = frame[len(b"event: error\ndata: ") : -len(b"\nid: 7\n\n")]
    assert json.loads(data) == json.loads(event.raw)


def test_with_seq_puts_seq_first_and_keeps_the_bytes() -> None:
    raw = b'{"v":1, "type":"message",  "data":{"text":"a \\"seq\\" in a string","seq":3}}'
    numbered = with_seq(raw, 17)
    assert numbered == b'{"seq":17,' + raw[1:]
    assert json.loads(numbered)["seq"] == 17
    assert json.loads(numbered)["data"]["seq"] == 3


def test_with_seq_replaces_an_adapters_own_top_level_seq() -> None:
    numbered = with_seq(b'{"seq":"mine","v":1,"type":"x","data":{}}', 5)
    assert numbered.count(b'"seq"') == 1
    assert json.loads(numbered) == {"seq": 5, "v": 1, "type": "x", "data": {}}


# --- Event helpers --------------------------------------------------------------------


@pytest.mark.parametrize("reason", ["completed", "error", "cancelled"])
def test_session_ended_is_end_with_reason(reason: str) -> None:
    line = f'{{"v":1,"type":"session.ended","data":{{"reason":"{reason}"}}}}'.encode()
    event = decode_line(line)
    assert event.is_end
    assert event.end_reason == reason


def test_session_ended_without_string_reason() -> None:
    assert decode_line(b'{"v":1,"type":"session.ended"}').end_reason is None
    event = decode_line(b'{"v":1,"type":"session.ended","data":{"reason":7}}')
    assert event.is_end
    assert event.end_reason is None


def test_other_types_are_not_end_even_with_reason() -> None:
    event = decode_line(b'{"v":1,"type":"session.paused","data":{"reason":"completed"}}')
    assert not event.is_end
    assert event.end_reason is None


# --- lines that are valid JSON but awkward to forward ---------------------------------


def test_reserialized_line_with_lone_surrogate_escape_is_forwarded_or_rejected() -> None:
    # Valid JSON (Python's json accepts lone surrogate escapes) with a \r separator:
    # decode_line must either forward it on one line or raise DecodeError, which is
    # the only error the adapter reader handles; anything else crashes the turn.
    line = b'{"v":1,\r"type":"message","data":{"content":"\\ud800"}}'
    try:
        event = decode_line(line)
    except DecodeError:
        return
    assert b"\r" not in event.raw
    assert json.loads(event.raw) == json.loads(line)


def test_every_accepted_event_can_be_framed() -> None:
    # A type with a lone surrogate escape decodes; framing it must not blow up.
    line = b'{"v":1,"type":"message\\ud800","data":{}}'
    try:
        event = decode_line(line)
    except DecodeError:
        return
    frame = frame_of(event)
    assert frame.startswith(b"event: message")
    assert frame.endswith(event.raw + b"\nid: 42\n\n")
