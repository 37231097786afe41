"""Session and turn ids: ``s_``/``t_`` + base36 milliseconds + 8 random hex digits."""

from __future__ import annotations

import secrets
import time


def new_session_id() -> str:
    """``s_<base36 millis><8 hex>``; clients treat it as opaque."""
    return "s_" + _base36(int(time.time() * 1000)) + secrets.token_hex(4)


def new_turn_id() -> str:
    return "t_" + _base36(int(time.time() * 1000)) + secrets.token_hex(4)


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out
