"""Paging ``GET /v1/sessions``: the ``before`` cursor and the next-page headers.

A page token is the position of a page's last session in the list's order
(most recent activity first, then id descending): the unpadded URL-safe
base64 of ``<lastActiveAt in microseconds since the epoch>:<id>``.  Clients
treat it as opaque.  Because it carries the position itself, a token stays
valid when its session changes or is deleted, and sessions created (or
active) after the page was read never shift the pages that follow.

``before`` also takes a plain session id: the page then starts after that
session as it stands now (the session manager looks it up).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Final
from urllib.parse import urlencode

from trioserve.errors import InvalidRequest
from trioserve.protocol import NEXT_PAGE_HEADER
from trioserve.stores.base import SessionKey

__all__ = [
    "NEXT_PAGE_HEADER",
    "before_arg",
    "decode_token",
    "encode_token",
    "next_page_headers",
]

#: The response header carrying the next page's token (only when there is one).

_MAX_BEFORE: Final = 512  # characters: tokens and ids are far shorter
_TOKEN: Final = re.compile(r"[A-Za-z0-9_-]+")
_MICROS: Final = re.compile(r"-?[0-9]{1,18}")
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND: Final = timedelta(microseconds=1)


def encode_token(key: SessionKey) -> str:
    """The page token of a position in the list."""
    micros = (key.last_active_at - _EPOCH) // _MICROSECOND
    raw = f"{micros}:{key.id}".encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_token(text: str) -> SessionKey | None:
    """The position a page token stands for; ``None`` if ``text`` is not one we made."""
    if not _TOKEN.fullmatch(text):
        return None
    try:
        decoded = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("ascii")
    except (binascii.Error, ValueError):  # UnicodeDecodeError is a ValueError
        return None
    micros, colon, session_id = decoded.partition(":")
    if not colon or not session_id or "\x00" in session_id or not _MICROS.fullmatch(micros):
        return None
    try:
        key = SessionKey(_EPOCH + int(micros) * _MICROSECOND, session_id)
    except OverflowError:  # beyond datetime's years 1 .. 9999
        return None
    return key if encode_token(key) == text else None


def before_arg(value: str | None) -> SessionKey | str | None:
    """``?before=``: a page token's position, or a session id (``None``: the first page)."""
    if value is None:
        return None
    if not value or len(value) > _MAX_BEFORE:
        got = "an empty value" if not value else f"{len(value)} characters"
        raise InvalidRequest(
            f"before must be a page token (the {NEXT_PAGE_HEADER} header) or a session id, "
            f"got {got}"
        )
    return decode_token(value) or value


def next_page_headers(
    path: str, query: Iterable[tuple[str, str]], key: SessionKey
) -> dict[str, str]:
    """``Trioserve-Next-Page`` and an RFC 8288 ``Link`` to the page after ``key``.

    The link keeps the request's other query parameters (the filter, the limit).
    """
    token = encode_token(key)
    params = [(name, value) for name, value in query if name != "before"]
    link = f"{path}?{urlencode([*params, ('before', token)])}"
    return {NEXT_PAGE_HEADER: token, "Link": f'<{link}>; rel="next"'}
