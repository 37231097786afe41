"""Parsing untrusted input: JSON bodies and messages, numbers in queries and headers."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trioserve.errors import InvalidRequest
from trioserve.http._untrusted import MAX_DEPTH, parse_int, parse_json, too_deep
from trioserve.protocol import MAX_SEQ

SETTINGS = settings(max_examples=300, deadline=None, derandomize=True, database=None)


def nested(depth: int, inner: str = "1") -> bytes:
    return ("[" * depth + inner + "]" * depth).encode()


def refused(data: str | bytes, what: str = "request body") -> str:
    with pytest.raises(InvalidRequest) as info:
        parse_json(data, what)
    return info.value.message


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"inputs":{"name":"\\ud800"}}', "inputs.name: not valid Unicode (a lone surrogate"),
        (b'{"input":"ok \\udfff"}', "input: not valid Unicode"),
        (b'{"inputs":{"\\udc00":"x"}}', "inputs: a key is not valid Unicode"),
        (b'{"x":[1,{"y":["\\ud800"]}]}', "x.1.y.0: not valid Unicode"),
        (b'"\\ud800"', "body: not valid Unicode"),
        # A high surrogate followed by something other than a low one.
        (b'{"input":"\\ud83d\\u0041"}', "input: not valid Unicode"),
    ],
)
def test_lone_surrogates_are_refused_naming_the_field(body: bytes, message: str) -> None:
    text = refused(body)
    assert text.startswith("invalid request body: ")
    assert message in text
    text.encode()  # the message itself is valid Unicode (the surrogate is shown escaped)


def test_surrogate_pairs_and_escaped_backslashes_are_fine() -> None:
    assert parse_json(b'{"input":"\\ud83d\\ude00"}', "request body") == {"input": "\U0001f600"}
    assert parse_json(b'{"input":"\\\\ud800"}', "request body") == {"input": "\\ud800"}
    assert parse_json('{"input":"é ☃ \U0001f600"}', "message") == {"input": "é ☃ \U0001f600"}


def test_bytes_that_are_not_utf8_are_refused() -> None:
    # An encoded surrogate is not UTF-8 either.
    assert refused(b'{"input":"\xed\xa0\x80"}') == "invalid request body: not UTF-8 (byte 10)"
    assert refused(b"\xff\xfe{\x00}\x00") == "invalid request body: not UTF-8 (byte 0)"


def test_nesting_up_to_the_limit_is_fine_and_deeper_is_refused() -> None:
    assert parse_json(nested(MAX_DEPTH), "message") == json.loads(nested(MAX_DEPTH))
    deep = f"invalid message: nested too deep (more than {MAX_DEPTH} levels of arrays and objects)"
    assert refused(nested(MAX_DEPTH + 1), "message") == deep
    assert refused(b'{"a":' * (MAX_DEPTH + 1) + b"1" + b"}" * (MAX_DEPTH + 1), "message") == deep


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000,
        b"[" * (1 << 20),
        b"{" * (1 << 20),
        b'{"a":' * 200_000,
        nested(100_000),
        b'[{"a":' * 100_000,
    ],
    ids=["open-100k", "open-1MiB", "braces-1MiB", "keys-200k", "closed-100k", "mixed-100k"],
)
def test_deep_nesting_is_refused_before_parsing(body: bytes) -> None:
    # json.loads would raise RecursionError on each of these.
    assert "nested too deep" in refused(body)


def test_brackets_in_strings_do_not_count() -> None:
    text = "[{" * 50_000 + '\\"' + "]}" * 10
    body = json.dumps({"input": text, "note": '\\"[[[[[[[[[[[[[[[[[[[[[[[[\\'}).encode()
    assert parse_json(body, "request body")["input"] == text


def test_malformed_json_is_refused_with_the_parsers_words() -> None:
    assert refused(b"{nope").startswith("malformed JSON request body: Expecting property name")
    assert refused(b"1" * 5000) == "malformed JSON request body: a number has too many digits"


def depth_of(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    return 0


tricky_text = st.text(alphabet='[]{}"\\ab,:', max_size=12)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | tricky_text,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(tricky_text, children, max_size=3)
    ),
    max_leaves=60,
)


levels = st.integers(0, 2 * MAX_DEPTH).flatmap(
    lambda n: st.lists(st.booleans(), min_size=n, max_size=n)
)


def wrapped(value: Any, levels: list[bool]) -> Any:
    """``value`` inside one list (True) or object (False) per level."""
    for in_list in levels:
        value = [1, value] if in_list else {"k[": value}
    return value


@SETTINGS
@given(st.builds(wrapped, json_values, levels))
def test_too_deep_agrees_with_the_real_depth(value: Any) -> None:
    data = json.dumps(value).encode()
    assert too_deep(data) == (depth_of(value) > MAX_DEPTH)
    assert too_deep(data, limit=3) == (depth_of(value) > 3)


@SETTINGS
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_any_bytes_parse_or_are_refused_cleanly(data: bytes) -> None:
    try:
        parse_json(data, "request body")
    except InvalidRequest as exc:
        exc.message.encode()


near_surrogates = st.text(st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010), max_size=4)


@SETTINGS
@given(
    st.recursive(
        near_surrogates,
        lambda children: (
            st.lists(children, max_size=3) | st.dictionaries(near_surrogates, children, max_size=3)
        ),
        max_leaves=10,
    )
)
def test_nothing_unencodable_gets_through(value: Any) -> None:
    data = json.dumps(value).encode()  # escapes lone surrogates as \udXXX
    try:
        parsed = parse_json(data, "request body")
    except InvalidRequest as exc:
        assert "not valid Unicode" in exc.message or "nested too deep" in exc.message
        return
    json.dumps(parsed, ensure_ascii=False).encode()  # every string and key encodes


@pytest.mark.parametrize(
    ("text", "value"),
    [("0", 0), ("12", 12), ("007", 7), (str(MAX_SEQ), MAX_SEQ), ("0" * 5000 + "1", 1)],
)
def test_parse_int_takes_ascii_digits(text: str, value: int) -> None:
    assert parse_int("after", text) == value


@pytest.mark.parametrize(
    "text",
    [
        "",
        "-1",
        "+1",
        " 1",
        "1 ",
        "1\n",
        "1.0",
        "1e3",
        "0x10",
        "1_000",
        "\u00b2",  # superscript two: str.isdigit() says yes, int() says no
        "\u0661",  # Arabic-Indic one: int() would take it
        "\uff11",  # fullwidth one
        str(MAX_SEQ + 1),
        "1" * 4300,
        "9" * 100_000,
    ],
)
def test_parse_int_refuses_anything_else(text: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_int("after", text)
    message = info.value.message
    assert message.startswith(f"after must be a non-negative integer (at most {MAX_SEQ}), got ")
    assert len(message) < 200


def test_parse_int_range() -> None:
    assert parse_int("limit", "1", minimum=1, maximum=10) == 1
    assert parse_int("limit", "10", minimum=1, maximum=10) == 10
    for text in ("0", "11", "00000000000000000000000011"):
        with pytest.raises(
            InvalidRequest, match=r"limit must be a positive integer \(at most 10\)"
        ):
            parse_int("limit", text, minimum=1, maximum=10)
