"""Parsers for flag values: durations and byte sizes."""

from __future__ import annotations

import pytest

from trioserve.units import format_duration, format_size, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("168h", 168 * 3600.0),
        ("1h30m", 5400.0),
        ("500ms", 0.5),
        ("1.5s", 1.5),
        ("30", 30.0),
        ("2.5", 2.5),
        ("0", 0.0),
        ("0s", 0.0),
        ("7d", 7 * 86400.0),
        ("2h45m30s", 2 * 3600 + 45 * 60 + 30.0),
        ("25s", 25.0),
        ("1m", 60.0),
        ("  45s ", 45.0),
    ],
)
def test_parse_duration_accepts(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["", "   ", "-1", "-1s", "5x", "h", "1h-3m", "nan", "inf", "-inf", "1h 30m", "s30"]
)
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["5x", "h", "1h-3m", "1h 30m"])
def test_parse_duration_error_says_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_duration(text)
    message = str(info.value)
    assert repr(text) in message
    # It names both forms: plain seconds and unit suffixes.
    assert "seconds" in message
    assert "ms" in message
    assert "1h30m" in message


@pytest.mark.parametrize("text", ["-1", "nan", "inf"])
def test_parse_duration_rejects_non_finite_and_negative_numbers(text: str) -> None:
    with pytest.raises(ValueError, match="non-negative"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("8MiB", 8 * 1024 * 1024),
        ("64k", 64 * 1024),
        ("64KiB", 64 * 1024),
        ("1048576", 1048576),
        ("1MB", 1_000_000),
        ("1kb", 1000),
        ("2G", 2 * 1024**3),
        ("8 MiB", 8 * 1024 * 1024),
        ("100b", 100),
    ],
)
def test_parse_size_accepts(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["0", "0MiB", "-1", "8 XB", "", "MiB", "1.5MiB", "8MiBs"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


def test_parse_size_error_says_what_is_accepted() -> None:
    with pytest.raises(ValueError) as info:
        parse_size("8 XB")
    message = str(info.value)
    assert "'8 XB'" in message
    assert "bytes" in message
    assert "MiB" in message


def test_parse_size_zero_says_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        parse_size("0")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (25, "25s"),
        (5, "5s"),
        (60, "1m"),
        (90, "90s"),
        (1800, "30m"),
        (3600, "1h"),
        (168 * 3600, "168h"),
        (1.5, "1.5s"),
        (0.5, "500ms"),
        (0.25, "250ms"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    "text", ["0", "25s", "5s", "30s", "1m", "90m", "1h", "1h30m", "168h", "7d", "1.5s", "500ms"]
)
def test_format_duration_round_trips(text: str) -> None:
    seconds = parse_duration(text)
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)


@pytest.mark.parametrize("seconds", [259200.5, 1000000.5])
def test_format_duration_output_parses_back_to_the_same_value(seconds: float) -> None:
    # format_duration is documented as the inverse of parse_duration.
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("size", "text"),
    [(8 << 20, "8MiB"), (64 * 1024, "64KiB"), (1 << 30, "1GiB"), (1000, "1000"), (1536, "1536")],
)
def test_format_size_is_the_inverse_of_parse_size(size: int, text: str) -> None:
    assert format_size(size) == text
    assert parse_size(text) == size
