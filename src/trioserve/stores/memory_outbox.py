"""The memory store's webhook outbox (``stores.outbox``'s contract), a dict by id.

As the rest of ``MemoryStore``: each call is one atomic step taken after
a checkpoint; the outbox lasts as long as the process.
"""

from __future__ import annotations

import abc
import builtins
from dataclasses import replace
from datetime import datetime

from trioserve.stores.outbox import TURN_ENDED, Outbox, WebhookDelivery
from trioserve.stores.records import TurnRecord

__all__ = ["MemoryOutbox"]


class MemoryOutbox(Outbox, abc.ABC):
    """``Outbox`` over ``_webhooks``; ``MemoryStore`` gives the dicts and ``_enter``."""

    _turns: dict[str, TurnRecord]
    _webhooks: dict[str, WebhookDelivery]

    @abc.abstractmethod
    async def _enter(self) -> None:
        """A checkpoint; ``StoreError`` once the store is closed."""

    def _due(self, delivery: WebhookDelivery, now: datetime) -> bool:
        if delivery.next_attempt_at > now:
            return False
        if delivery.lease_expires_at is not None and delivery.lease_expires_at >= now:
            return False
        if delivery.payload is not None or delivery.turn_id is None:
            return True
        turn = self._turns.get(delivery.turn_id)
        return turn is not None and turn.status.finished

    async def _enqueue_webhooks(self, deliveries: builtins.list[WebhookDelivery]) -> None:
        await self._enter()
        for delivery in deliveries:
            self._webhooks.setdefault(delivery.id, delivery)

    async def _claim_webhooks(
        self, owner: str, until: datetime, now: datetime, limit: int
    ) -> builtins.list[WebhookDelivery]:
        await self._enter()
        due = sorted(
            (d for d in self._webhooks.values() if self._due(d, now)),
            key=lambda d: (d.next_attempt_at, d.id),
        )[:limit]
        claimed = []
        for delivery in due:
            first = delivery.first_attempt_at or now
            held = replace(delivery, owner=owner, lease_expires_at=until, first_attempt_at=first)
            self._webhooks[delivery.id] = held
            claimed.append(held)
        return claimed

    async def _webhook_failed(
        self, delivery_id: str, owner: str, retry_at: datetime, error: str, payload: str
    ) -> bool:
        await self._enter()
        delivery = self._webhooks.get(delivery_id)
        if delivery is None or delivery.owner != owner:
            return False
        self._webhooks[delivery_id] = replace(
            delivery,
            attempts=delivery.attempts + 1,
            next_attempt_at=retry_at,
            last_error=error,
            payload=delivery.payload if delivery.payload is not None else payload,
            owner=None,
            lease_expires_at=None,
        )
        return True

    async def finish_webhook(self, delivery_id: str) -> bool:
        await self._enter()
        return self._webhooks.pop(delivery_id, None) is not None

    async def drop_unborn_webhooks(self, turn_id: str) -> int:
        await self._enter()
        if turn_id in self._turns:
            return 0
        unborn = [d.id for d in self._webhooks.values() if d.turn_id == turn_id]
        for delivery_id in unborn:
            del self._webhooks[delivery_id]
        return len(unborn)

    async def turn_webhook_urls(self, turn_id: str) -> builtins.list[str]:
        await self._enter()
        found = self._webhooks.values()
        return sorted({d.url for d in found if d.turn_id == turn_id and d.event == TURN_ENDED})

    async def pending_webhooks(self) -> int:
        await self._enter()
        return len(self._webhooks)

    async def _purge_webhooks(self, cutoff: datetime) -> int:
        await self._enter()
        stale = [
            d.id
            for d in self._webhooks.values()
            if d.payload is None
            and d.turn_id is not None
            and d.turn_id not in self._turns
            and d.created_at < cutoff
        ]
        for delivery_id in stale:
            del self._webhooks[delivery_id]
        return len(stale)
