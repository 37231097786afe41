"""Wire events: the JSON lines an adapter prints (protocol v1).

An adapter writes one JSON object per line.  ``decode_line`` checks what
routing needs (a JSON object, ``v`` is 1, a string ``type``, an object
``data`` when present) and keeps the original bytes, so an event reaches the
client untouched: unknown types and extra fields pass through as they came.
Events the server makes itself (``error`` for a crash, a garbage line, an
oversized line) are built by ``synthesize`` and carry the real session id.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import Any, Final, Literal, NamedTuple, overload

import msgspec
from pydantic_core import from_json

from trioserve.protocol import (
    ERROR,
    EVENTS_API_VERSION,
    PROTOCOL_VERSION,
    EndOfTurn,
)


class _EventFields(NamedTuple):
    type: str
    #: ``data`` decoded, or ``None``: decode it from ``raw`` when asked for.
    body: dict[str, Any] | None
    raw: bytes


class Event(_EventFields, EndOfTurn):
    """One event on its way to a client.

    ``raw`` is the event's JSON exactly as it will be sent (one line, no
    newline); ``data`` is its ``data`` object, decoded when asked for (on
    the streaming path only a ``session.ended``'s is: routing needs nothing
    else of an event); ``is_end`` and ``end_reason`` as the client's
    (``protocol.EndOfTurn``).  (A named tuple: one is made per event on the
    streaming path.)
    """

    __slots__ = ()

    @property
    def data(self) -> dict[str, Any]:
        if self.body is not None:
            return self.body
        data: dict[str, Any] = _loads(self.raw).get("data", {})
        return data

    def json(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.raw)
        return value


class DecodeError(ValueError):
    """A line that is not a valid v1 wire event."""


def _loads(text: bytes) -> Any:
    """JSON ``text`` decoded: by pydantic-core, else (a lone surrogate escape, nesting
    deeper than 200) by ``json``, whose exceptions pass."""
    try:
        return from_json(text)
    except ValueError:
        return json.loads(text)


def rfc3339_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _dumps(obj: object) -> bytes:
    try:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:  # a lone surrogate: keep it as a \u escape
        return json.dumps(obj, separators=(",", ":")).encode()


class _AnyObject(msgspec.Struct, gc=False):
    """Any JSON object, skipped (checked as JSON, nothing of it built)."""


class _Head(msgspec.Struct, gc=False):
    """What routing needs of an event line, as msgspec checks it: the rest is skipped."""

    v: Literal[1]
    type: str
    data: _AnyObject | msgspec.UnsetType = msgspec.UNSET
    #: A ``seq`` of the event's own, which numbering replaces (``with_seq``).
    seq: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


_decode_head: Final = msgspec.json.Decoder(_Head).decode
_new_event: Final = tuple.__new__  # an Event without its Python __new__ (a third of its cost)


def decode_line(line: bytes) -> Event:
    """Decode one adapter stdout line (without its newline) into an Event.

    Raises ``DecodeError`` naming what is wrong.  The original bytes are kept
    (without surrounding whitespace) unless they contain a carriage return,
    which would break SSE framing: then the event is re-serialized (same
    JSON value).

    This is the streaming path's one parse of a line, and most lines take
    its fast way: msgspec checks that the line is JSON and reads ``v``,
    ``type`` and that ``data`` is an object, building nothing else; ``data``
    is decoded only if it is asked for (``Event.data``).  Any doubt sends a
    line the full way (``_decode_full``), which decides and words the error:
    a line that is not ASCII and not strict UTF-8 (msgspec does not check
    the UTF-8 of what it skips; ``json`` accepts an encoded lone surrogate),
    what msgspec refuses and the full way may accept (``NaN``, lone surrogate
    escapes, nesting past its limit), a type that is not printable ASCII, a
    carriage return.
    """
    if line.isascii() or _is_utf8(line):
        try:
            event_type = _decode_head(line).type
        except (msgspec.MsgspecError, RecursionError):
            pass
        else:
            raw = line if line[:1] == b"{" and line[-1:] == b"}" else line.strip()
            if (
                event_type.isprintable()
                and event_type.isascii()
                and event_type
                and b"\r" not in raw
            ):
                return _new_event(Event, (event_type, None, raw))
    return _decode_full(line)


_decode_heads: Final = msgspec.json.Decoder(_Head).decode_lines
_TYPE_OF: Final = attrgetter("type")
_SEQ_OF: Final = attrgetter("seq")  # UNSET is false


def decode_lines(lines: Sequence[bytes]) -> EventBatch | None:
    """``decode_line`` of each of ``lines`` in one call, or ``None``: decode them one by one.

    The streaming path's way for the lines of one pipe read: one msgspec call reads
    them all (``decode_lines``: JSON values one after another), and what
    ``decode_line`` checks per line is checked once for the batch: strict UTF-8, no
    carriage return, each line one object with nothing around it (it starts with
    ``{`` and ends with ``}``, so no value can span two lines, and as many values as
    lines means each line is one), each type non-empty printable ASCII.  Any doubt
    makes it ``None``: the caller then takes the lines one by one, which words the
    errors and re-serializes what must be.
    """
    if not lines:
        return EventBatch([], [], False)
    joined = b"\n".join(lines)
    if b"\r" in joined or not _object_lines(lines):
        return None
    if not joined.isascii():
        try:
            joined.decode()
        except UnicodeDecodeError:
            return None
    try:
        heads = _decode_heads(joined)
    except (msgspec.MsgspecError, RecursionError):
        return None
    if len(heads) != len(lines):
        return None
    types = list(map(_TYPE_OF, heads))
    for event_type in set(types):
        if not (event_type and event_type.isascii() and event_type.isprintable()):
            return None
    return EventBatch(types, lines, any(map(_SEQ_OF, heads)))


class EventBatch(Sequence[Event]):
    """The events of a pipe read's lines, as ``decode_lines`` found them: two columns,
    their types and their lines (each event's ``raw``), and whether one of them has a
    ``seq`` of its own (``own_seq``: numbering replaces it, ``with_seq``).

    The streaming path numbers and logs the columns (``sessions._turns.logged_batch``)
    and never makes an ``Event`` of them (110 ns an event); any other reader gets
    ``Event`` objects, made as it asks for them.
    """

    __slots__ = ("own_seq", "raws", "types")

    def __init__(self, types: list[str], raws: Sequence[bytes], own_seq: bool) -> None:
        self.types = types
        self.raws = raws
        self.own_seq = own_seq

    def __len__(self) -> int:
        return len(self.raws)

    @overload
    def __getitem__(self, index: int) -> Event: ...

    @overload
    def __getitem__(self, index: slice) -> list[Event]: ...

    def __getitem__(self, index: int | slice) -> Event | list[Event]:
        if isinstance(index, slice):
            return list(map(Event, self.types[index], repeat(None), self.raws[index]))
        return Event(self.types[index], None, self.raws[index])

    def __iter__(self) -> Iterator[Event]:
        return map(_new_event, repeat(Event), zip(self.types, repeat(None), self.raws))


_FIRST_BYTE: Final = itemgetter(0)
_LAST_BYTE: Final = itemgetter(-1)
_OPEN: Final = frozenset(b"{")
_CLOSE: Final = frozenset(b"}")


def _object_lines(lines: Sequence[bytes]) -> bool:
    """Whether each line starts with ``{`` and ends with ``}`` (in C: no Python call a
    line, and no argument parsing: ``bytes.startswith`` by ``map`` was twice the time)."""
    try:
        return set(map(_FIRST_BYTE, lines)) == _OPEN and set(map(_LAST_BYTE, lines)) == _CLOSE
    except IndexError:  # a blank line
        return False


def _is_utf8(line: bytes) -> bool:
    try:
        line.decode()
    except UnicodeDecodeError:
        return False
    return True


def _decode_full(line: bytes) -> Event:
    """``decode_line`` the slow way: every value built, and each problem named.

    pydantic-core's parser first; a line it refuses gets a second opinion
    from ``json``, which also accepts lone surrogate escapes (``"\\ud800"``)
    and nesting deeper than 200 (up to its recursion limit), and words the
    error message.
    """
    try:
        obj = _loads(line)
    except (UnicodeDecodeError, ValueError) as exc:
        raise DecodeError(f"not JSON ({exc})") from None
    except RecursionError:  # deeper than either parser goes
        raise DecodeError("not JSON (nested too deep)") from None
    if type(obj) is not dict:
        raise DecodeError(f"expected a JSON object, got {type(obj).__name__}")
    version = obj.get("v")
    if version != PROTOCOL_VERSION or type(version) is not int:
        raise DecodeError(f"unsupported protocol version v={version!r} (expected 1)")
    event_type = obj.get("type")
    if type(event_type) is not str or not event_type:
        raise DecodeError("field 'type' must be a non-empty string")
    if not event_type.isascii():
        try:
            event_type.encode()
        except UnicodeEncodeError:
            raise DecodeError("field 'type' is not valid Unicode") from None
    if "\n" in event_type or "\r" in event_type:
        raise DecodeError("field 'type' must not contain line breaks")
    if "\x00" in event_type:  # no SSE event name, no store key holds one
        raise DecodeError("field 'type' must not contain NUL")
    data = obj.get("data", _NO_DATA)
    if type(data) is not dict:
        if data is not _NO_DATA:
            raise DecodeError("field 'data' must be a JSON object")
        data = {}
    raw = line if line[:1] == b"{" and line[-1:] == b"}" else line.strip()
    if b"\r" in raw:
        raw = _dumps(obj)
    return Event(event_type, data, raw)


_NO_DATA: Final[Any] = object()


def synthesize(
    event_type: str,
    session_id: str,
    data: dict[str, Any],
) -> Event:
    """Build an event the server emits itself, for ``session_id``."""
    obj = {
        "v": PROTOCOL_VERSION,
        "apiVersion": EVENTS_API_VERSION,
        "type": event_type,
        "ts": rfc3339_now(),
        "sessionId": session_id,
        "data": data,
    }
    return Event(event_type, data, _dumps(obj))


def error_event(session_id: str, message: str, **extra: Any) -> Event:
    """A synthetic ``error`` event with ``data.message`` (and any extra fields)."""
    return synthesize(ERROR, session_id, {"message": message, **extra})


def with_seq(raw: bytes, seq: int) -> bytes:
    """The event JSON ``raw`` with a top-level ``"seq": seq`` (replacing any ``seq`` it had).

    The original bytes are kept, ``seq`` going first; only an event that
    already has a top-level ``seq`` of its own is re-serialized (also one
    whose key is written with escapes, ``"s\\u0065q"``).
    """
    if b'"seq"' in raw or b"\\u" in raw:
        obj = json.loads(raw)
        if "seq" in obj:
            del obj["seq"]
            return _dumps({"seq": seq, **obj})
    return b'{"seq":%d,' % seq + raw[1:]
