"""Parsing what arrives from the network, before anything else looks at it.

What every transport reads:

- ``parse_json``: a request body or a WebSocket message as a JSON value.
  It must be UTF-8, nested at most ``MAX_DEPTH`` arrays and objects deep
  (checked before parsing, so no input can reach the parser's recursion
  limit), and hold no lone surrogate (``"\\ud800"`` is valid JSON but not
  text: it cannot be encoded, stored in SQLite or sent on).  A refusal is
  an ``InvalidRequest`` that names the field.
- ``parse_int``: a number in a query or a header (``after``, ``limit``,
  ``Last-Event-ID``): ASCII digits only, within a range, so what reaches a
  store always fits a 64-bit integer.
- ``parse_idempotency_key``: the ``Idempotency-Key`` header.

Everything here is linear in the size of the input.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from trioserve.errors import InvalidRequest
from trioserve.protocol import IDEMPOTENCY_KEY_HEADER, MAX_SEQ, check_idempotency_key

#: The largest seq (and the largest integer any store is asked about): SQLite's INTEGER.
#: Arrays and objects nested deeper than this are refused.  The bodies and
#: messages of the API need 2 (``{"inputs": {...}}``); the rest is room for
#: fields a newer client sends and this server ignores.
MAX_DEPTH: Final = 16

#: ``bytes.translate`` arguments keeping only brackets, all made square.
_SQUARE: Final = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKET: Final = bytes(b for b in range(256) if b not in b"[]{}")
#: A ``\u`` escape of a surrogate: the only way a lone one gets into decoded UTF-8 JSON.
_SURROGATE_ESCAPE: Final = re.compile(r"\\u[dD][89a-fA-F]")
_DIGITS: Final = re.compile(r"[0-9]+")
_PREVIEW: Final = 40


def parse_json(data: str | bytes, what: str) -> Any:
    """The JSON value of ``data`` (a body's bytes or a text message).

    ``what`` names it in errors ("request body", "message").  Raises
    ``InvalidRequest`` for bytes that are not UTF-8, malformed JSON, nesting
    deeper than ``MAX_DEPTH``, and a string (or an object key) holding a
    lone surrogate, naming where it is.
    """
    if isinstance(data, bytes):
        try:
            text = data.decode()
        except UnicodeDecodeError as exc:
            raise InvalidRequest(f"invalid {what}: not UTF-8 (byte {exc.start})") from None
    else:
        text, data = data, data.encode(errors="surrogatepass")
    if too_deep(data):
        raise InvalidRequest(
            f"invalid {what}: nested too deep (more than {MAX_DEPTH} levels of arrays and objects)"
        )
    try:
        value = json.loads(text)
    except ValueError as exc:
        problem = str(exc)
        if "integer string conversion" in problem:
            problem = "a number has too many digits"
        raise InvalidRequest(f"malformed JSON {what}: {problem}") from None
    if _SURROGATE_ESCAPE.search(text):
        bad = find_unencodable(value)
        if bad is not None:
            raise InvalidRequest(f"invalid {what}: {bad}")
    return value


def too_deep(data: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether the arrays and objects of the JSON ``data`` nest deeper than ``limit``.

    Brackets inside strings do not count.  Each pass removes the innermost
    pairs (one level); what is left after ``limit`` passes is too deep if it
    still holds a pair or more than ``limit`` unclosed brackets.  For
    malformed JSON the answer only bounds the depth a parser would reach.
    """
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    # Escaped backslashes, then escaped quotes, go; what is outside strings stays.
    unescaped = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = b"".join(unescaped.split(b'"')[::2]).translate(_SQUARE, _NOT_BRACKET)
    for _ in range(limit):
        inner = brackets.replace(b"[]", b"")
        if len(inner) == len(brackets):
            break
        brackets = inner
    return b"[]" in brackets or brackets.count(b"[") > limit


def find_unencodable(value: Any) -> str | None:
    """``"<path>: <problem>"`` for the first string or key in ``value`` that is not
    valid Unicode (a lone surrogate), or ``None``.  Paths are dotted, as in
    validation errors (``inputs.name``, ``items.0``); ``body`` is the top."""
    stack: list[tuple[tuple[str, ...], Any]] = [((), value)]
    while stack:
        path, item = stack.pop()
        where = ".".join(path) or "body"
        if isinstance(item, str):
            if not _encodable(item):
                return f"{where}: not valid Unicode (a lone surrogate in {_preview(item)})"
        elif isinstance(item, dict):
            for key, child in reversed(item.items()):
                if not _encodable(key):
                    problem = f"a key is not valid Unicode (a lone surrogate in {_preview(key)})"
                    return f"{where}: {problem}"
                stack.append(((*path, key), child))
        elif isinstance(item, list):
            stack.extend(((*path, str(i)), child) for i, child in reversed(list(enumerate(item))))
    return None


def parse_int(name: str, text: str, *, minimum: int = 0, maximum: int = MAX_SEQ) -> int:
    """``text`` as an integer from ``minimum`` to ``maximum``: ASCII digits, nothing else.

    No sign, no spaces, no other digits (Arabic-Indic one, superscript two); leading
    zeros are fine.  Raises ``InvalidRequest`` naming ``name``.
    """
    if _DIGITS.fullmatch(text):
        digits = text.lstrip("0") or "0"
        if len(digits) <= len(str(maximum)) and minimum <= int(digits) <= maximum:
            return int(digits)
    kind = {0: "a non-negative integer", 1: "a positive integer"}.get(
        minimum, f"an integer from {minimum}"
    )
    raise InvalidRequest(f"{name} must be {kind} (at most {maximum}), got {_preview(text)}")


def parse_idempotency_key(values: list[str]) -> str | None:
    """The ``Idempotency-Key`` header's key (``None``: none sent).

    A structured-field string (``"..."``, as the IETF draft writes it) is
    taken without its quotes; the key is 1 to 255 printable ASCII characters
    (``protocol.check_idempotency_key``).  More than one such header, or a bad
    key, is an ``InvalidRequest`` naming the header.
    """
    if not values:
        return None
    if len(values) > 1:
        raise InvalidRequest(f"{IDEMPOTENCY_KEY_HEADER}: expected one header, got {len(values)}")
    text = values[0].strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1]
    try:
        return check_idempotency_key(text)
    except ValueError as exc:
        raise InvalidRequest(f"{IDEMPOTENCY_KEY_HEADER}: {exc}") from None


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _preview(text: str) -> str:
    """``text`` quoted and cut short; a lone surrogate shows as its escape (``'\\ud800'``)."""
    return repr(text if len(text) <= _PREVIEW else text[:_PREVIEW] + "...")
