"""API keys: the key file, new keys, and which tenant a bearer token stands for.

The key file (``--api-keys FILE``) holds one key per line, as the SHA-256 of
the key, the tenant it belongs to, and the key's scopes, if any::

    # comments start with '#'; blank lines are fine
    sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 acme
    sha256:60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752 ops admin

The one scope is ``admin``: the server-wide ``GET /metrics`` (every tenant's
counts) needs it.  The server never stores a key itself, only its digest,
and no message about the file shows a line's first field (a key pasted in
by mistake would be printed).  A token is checked by comparing its digest
with every entry's in constant time (``hmac.compare_digest``), going through
all of them whatever matched, so the time taken says nothing about which
entry (if any) matched.

``Keys`` holds the ring in force; ``reload`` reads the file again (on
SIGHUP) and says which entries went, so that their open streams can be
closed (``_streams``).

Nothing here knows about HTTP beyond the ``Authorization`` header's value.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Final

#: The start of every key ``new_key`` makes, so a leaked key is recognisable.
KEY_PREFIX: Final = "ts_"
#: The scope of keys that may read the server-wide ``GET /metrics``.
ADMIN: Final = "admin"
#: Every scope a key file line may give.
SCOPES: Final = frozenset({ADMIN})

_TENANT: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_DIGEST: Final = re.compile(r"sha256:([0-9a-fA-F]{64})")
TENANT_RULE: Final = (
    "1-64 characters: letters, digits, '.', '_', '-', starting with a letter or digit"
)


class KeyFileError(ValueError):
    """The key file cannot be used; the message names the file (and line)."""


def check_tenant(name: str) -> str:
    """``name`` if it is a valid tenant name, else ``ValueError`` saying the rule."""
    if not _TENANT.fullmatch(name):
        raise ValueError(f"invalid tenant name {name!r}: {TENANT_RULE}")
    return name


def digest(key: str) -> bytes:
    """The SHA-256 of a key (its UTF-8 bytes)."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


@dataclass(frozen=True, slots=True)
class KeyEntry:
    digest: bytes
    tenant: str
    scopes: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class KeyRing:
    """The keys a server accepts, each mapped to its tenant."""

    entries: tuple[KeyEntry, ...]
    source: str = "<keys>"

    def match(self, token: str) -> KeyEntry | None:
        """The entry of the key ``token`` is, or ``None``.

        Every entry is compared, in constant time, whether or not an earlier
        one matched.
        """
        wanted = digest(token)
        found: KeyEntry | None = None
        for entry in self.entries:
            if hmac.compare_digest(entry.digest, wanted):
                found = entry
        return found

    def tenant_for(self, token: str) -> str | None:
        """The tenant whose key ``token`` is, or ``None`` (``match``)."""
        entry = self.match(token)
        return None if entry is None else entry.tenant

    @property
    def tenants(self) -> frozenset[str]:
        return frozenset(e.tenant for e in self.entries)


def parse_keys(text: str, source: str) -> KeyRing:
    """Parse key file text; ``KeyFileError`` naming ``source:line`` for a bad line."""
    entries: list[KeyEntry] = []
    seen: dict[bytes, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        content = line.split("#", 1)[0].strip()
        if not content:
            continue
        where = f"{source}:{number}"
        parts = content.split()
        if len(parts) < 2:
            raise KeyFileError(
                f"{where}: expected 'sha256:<64 hex digits> TENANT [SCOPE...]', got {len(parts)}"
                " field"
            )
        hashed, tenant, *scopes = parts
        match = _DIGEST.fullmatch(hashed)
        if match is None:
            # Never the field itself: a key pasted in by mistake would be printed.
            hint = (
                ": it looks like a key, not its SHA-256 (see `trioserve keys new`); it is not shown"
                if hashed.startswith(KEY_PREFIX)
                else f" ({len(hashed)} characters; not shown, it may be a key)"
            )
            raise KeyFileError(f"{where}: expected 'sha256:' and 64 hex digits in field 1{hint}")
        try:
            check_tenant(tenant)
        except ValueError as exc:
            raise KeyFileError(f"{where}: {exc}") from None
        unknown = [scope for scope in scopes if scope not in SCOPES]
        if unknown:
            raise KeyFileError(
                f"{where}: unknown scope {unknown[0]!r} (known: {', '.join(sorted(SCOPES))})"
            )
        value = bytes.fromhex(match.group(1))
        if value in seen:
            raise KeyFileError(f"{where}: the same key is already on line {seen[value]}")
        seen[value] = number
        entries.append(KeyEntry(value, tenant, frozenset(scopes)))
    if not entries:
        raise KeyFileError(
            f"{source}: no keys (expected lines 'sha256:<64 hex digits> TENANT [SCOPE...]')"
        )
    return KeyRing(tuple(entries), source)


def load_keys(path: str | os.PathLike[str]) -> KeyRing:
    """Read and parse the key file at ``path`` (``KeyFileError`` if it can't be)."""
    where = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise KeyFileError(f"cannot read key file {where}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KeyFileError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return parse_keys(text, where)


def new_key(tenant: str) -> tuple[str, str]:
    """A new random key for ``tenant`` and its key file line."""
    check_tenant(tenant)
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, f"sha256:{digest(key).hex()} {tenant}"


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` value (scheme in any case), else ``None``."""
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


class Keys:
    """The key ring in force: read on every request, replaced whole by ``reload``."""

    def __init__(self, ring: KeyRing) -> None:
        self.ring = ring

    def reload(self) -> tuple[KeyRing, frozenset[bytes]]:
        """Read the key file again and put it in force; the new ring, and the digests of
        the entries that went (a key removed, or given to another tenant).

        ``KeyFileError`` (the ring in force is kept) if the file cannot be used.
        """
        new = load_keys(self.ring.source)
        kept = {(entry.digest, entry.tenant) for entry in new.entries}
        gone = frozenset(e.digest for e in self.ring.entries if (e.digest, e.tenant) not in kept)
        self.ring = new
        return new, gone
