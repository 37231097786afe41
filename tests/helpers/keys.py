"""API keys for tests: two tenants' keys and their key file lines."""

from __future__ import annotations

import hashlib

from trioserve.http._auth import KeyRing, parse_keys

KEY_A = "ts_key-of-tenant-a"
KEY_B = "ts_key-of-tenant-b"


def key_line(key: str, tenant: str, *scopes: str) -> str:
    """The key file line of ``key`` for ``tenant`` (with ``scopes``, if any)."""
    return " ".join([f"sha256:{hashlib.sha256(key.encode()).hexdigest()}", tenant, *scopes])


def two_tenants() -> KeyRing:
    """``KEY_A`` of tenant ``alpha``, ``KEY_B`` of tenant ``beta``."""
    return parse_keys(f"{key_line(KEY_A, 'alpha')}\n{key_line(KEY_B, 'beta')}\n", "keys.txt")


def auth(key: str) -> dict[str, str]:
    """The ``Authorization`` header of ``key``."""
    return {"Authorization": f"Bearer {key}"}
