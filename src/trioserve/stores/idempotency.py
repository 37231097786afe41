"""Idempotency keys: the part of the store contract that keeps them (``Store`` inherits it).

A request sent with an idempotency key claims it (``IdempotencyClaim``);
the store keeps the key with what the request answered
(``IdempotencyRecord``) until the claim's ``expires_at``, so a repeat of
the request answers the same without doing anything, from any process
sharing the store and after restarts.

A key is bound at most once while it lasts: ``create`` and ``create_turn``
(given ``idempotency=``) store the claim with the session or turn they
store, in the same atomic step, and ``remember_refusal`` stores it with a
refusal.  Whichever call binds a key first wins; every later one, also one
racing it from another process, raises ``IdempotencyKeyBound`` with the
winner's record and stores nothing.  A record is bound from its claim's
``created_at`` until its ``expires_at``: a claim made at or after that is
a new request, and replaces it.  Keys are a tenant's own: another tenant's
identical key is another key.
"""

from __future__ import annotations

import abc
from datetime import datetime
from typing import Final

from trioserve.stores.checks import utc
from trioserve.stores.records import IdempotencyClaim, IdempotencyRecord, utcnow

__all__ = ["MAX_KEY_LENGTH", "IdempotencyKeys", "binding", "check_claim"]

#: The longest key a store takes, in characters.
MAX_KEY_LENGTH: Final = 255


def check_key(tenant: str | None, key: str) -> None:
    """A key is a non-empty ``str`` of at most ``MAX_KEY_LENGTH`` characters but NUL, and a tenant
    ``None`` or a non-empty ``str`` (else ``ValueError``)."""
    if type(key) is not str or not 0 < len(key) <= MAX_KEY_LENGTH or "\x00" in key:
        raise ValueError(f"an idempotency key must be 1 to {MAX_KEY_LENGTH} characters, no NUL")
    if tenant is not None and (type(tenant) is not str or not tenant):
        raise ValueError("an idempotency key's tenant must be None or a non-empty str")


def check_claim(claim: IdempotencyClaim) -> IdempotencyClaim:
    """What every ``Store`` method refuses in a claim (``ValueError``); the claim in UTC."""
    check_key(claim.tenant, claim.key)
    if type(claim.fingerprint) is not str or not claim.fingerprint:
        raise ValueError("an idempotency claim needs its request's fingerprint")
    created = utc(claim.created_at, "created_at")
    expires = utc(claim.expires_at, "expires_at")
    if expires <= created:
        raise ValueError(f"claim of key {claim.key!r}: it expires before it is made")
    return IdempotencyClaim(claim.tenant, claim.key, claim.fingerprint, created, expires)


def binding(
    claim: IdempotencyClaim | None, session_id: str, turn_id: str | None = None
) -> IdempotencyRecord | None:
    """The record ``create`` (``session_id``) or ``create_turn`` (``turn_id`` too) stores for
    its ``idempotency=`` claim, checked (``None`` without one)."""
    if claim is None:
        return None
    return IdempotencyRecord(check_claim(claim), session_id=session_id, turn_id=turn_id)


class IdempotencyKeys(abc.ABC):
    """The idempotency-key methods of ``Store`` (see the module doc)."""

    async def find_key(self, tenant: str | None, key: str) -> IdempotencyRecord | None:
        """The record of ``tenant``'s ``key`` (``None``: never bound, or expired by now)."""
        check_key(tenant, key)
        return await self._find_key(tenant, key, utcnow())

    @abc.abstractmethod
    async def _find_key(
        self, tenant: str | None, key: str, now: datetime
    ) -> IdempotencyRecord | None:
        """``find_key``: the record unless it expired at or before ``now``."""

    async def remember_refusal(self, claim: IdempotencyClaim, reason: str, message: str) -> None:
        """Bind ``claim``'s key to a refusal (its ``reason`` and ``message``).

        ``IdempotencyKeyBound`` (and nothing stored) when the key is bound
        already; an atomic step, as ``create``'s binding.
        """
        record = IdempotencyRecord(check_claim(claim), refusal=reason, message=message)
        await self._bind_key(record)

    @abc.abstractmethod
    async def _bind_key(self, record: IdempotencyRecord) -> None:
        """Store ``record`` unless its key is bound at its claim's ``created_at``
        (``IdempotencyKeyBound``); an expired record of the key is replaced."""

    async def purge_keys(self, cutoff: datetime) -> int:
        """Delete the records that expired at or before ``cutoff``; return how many.

        May work in several atomic steps, as ``drop_events``.
        """
        return await self._purge_keys(utc(cutoff, "cutoff"))

    @abc.abstractmethod
    async def _purge_keys(self, cutoff: datetime) -> int:
        """``purge_keys`` with a UTC cutoff."""
