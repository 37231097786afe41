"""The streams a tenant holds open: SSE responses and WebSockets, capped per tenant.

A stream holds a connection for as long as its client likes (a ``follow``
reader, a WebSocket left open), so without a cap one tenant could take every
connection of ``--max-connections`` and lock the others out.
``StreamSlots.take`` is called before a stream starts (before a turn it
would stream is admitted, before a WebSocket is accepted) and refuses one
over ``--max-streams-per-tenant`` with ``429 tenant_stream_cap``; the slot
is given back when the stream ends, however it ends.  Without API keys there
are no tenants, and no cap.

Each slot knows the key that opened it and, once the stream exists, how to
close it (``Slot.closer``): when a reload of the key file removes a key,
``revoke`` closes that key's streams, saying why.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from trioserve.errors import TenantStreamCapReached


class Slot:
    """One open stream's place: ``release`` gives it back (once); ``closer``, set by the
    stream, ends it with a reason."""

    def __init__(self, owner: StreamSlots | None, tenant: str, key: bytes | None) -> None:
        self._owner = owner
        self.tenant = tenant
        self.key = key
        self.closer: Callable[[str], None] | None = None

    def release(self) -> None:
        owner, self._owner = self._owner, None
        if owner is not None:
            owner.give_back(self)


class StreamSlots:
    """Open streams per tenant; ``max_per_tenant`` 0: no cap."""

    def __init__(self, max_per_tenant: int) -> None:
        self.max_per_tenant = max_per_tenant
        self.open: Counter[str] = Counter()
        self._slots: set[Slot] = set()

    def take(self, tenant: str | None, key: bytes | None = None) -> Slot:
        """A slot for a stream of ``tenant``, opened with the key of digest ``key``.

        ``TenantStreamCapReached`` if the tenant holds its maximum already.
        Without keys (no tenant) the slot counts nothing.
        """
        if tenant is None:
            return Slot(None, "", None)
        if self.max_per_tenant and self.open[tenant] >= self.max_per_tenant:
            raise TenantStreamCapReached(
                f"this tenant holds its maximum of {self.max_per_tenant} streams open"
                " (--max-streams-per-tenant): close one, or wait for one to end"
            )
        slot = Slot(self, tenant, key)
        self.open[tenant] += 1
        self._slots.add(slot)
        return slot

    def give_back(self, slot: Slot) -> None:
        self._slots.discard(slot)
        self.open[slot.tenant] -= 1
        if not self.open[slot.tenant]:
            del self.open[slot.tenant]

    def revoke(self, keys: Iterable[bytes], reason: str) -> int:
        """Close the open streams of the keys of digests ``keys``; how many."""
        gone = frozenset(keys)
        closed = 0
        for slot in list(self._slots):
            if slot.key in gone and slot.closer is not None:
                slot.closer(reason)
                closed += 1
        return closed
