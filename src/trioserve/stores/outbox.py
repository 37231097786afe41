"""The webhook outbox: the part of the store contract that keeps deliveries (``Store``
inherits it).

A delivery is one message (its ``id``: the ``webhook-id`` header, the same
on every attempt) of one event type (``event``: ``turn.ended``, ...) to one
URL.  It stays in the store until it is delivered (a 2xx) or given up, so
a restart or a worker's death loses none: at least once.

- **Gated on a turn.**  A delivery with a ``turn_id`` is stored before its
  turn (``enqueue_webhooks``, then ``create_turn``), so nothing is lost
  between the two; it becomes due only once the turn is finished (any
  finished status), whatever ended it: its process, a restart's recovery,
  a cancel in the queue.  Its ``payload`` may be ``None``: the deliverer
  renders it from the finished turn at the first attempt and keeps it
  (``webhook_failed``), so every attempt sends the same bytes.  A
  delivery with no ``turn_id`` is due at once; it must carry its payload
  (another event type: a turn waiting for an approval, ...).
- **Claimed with a lease.**  ``claim_webhooks`` hands each due delivery to
  one process (one atomic step), with a lease; one whose process died
  before it answered is claimed again once the lease has passed.
- **Left over.**  A delivery whose turn was never stored (its request was
  refused, then the process died before ``drop_unborn_webhooks``) or was
  deleted before its first attempt never becomes due;
  ``purge_webhooks`` deletes such deliveries once old enough.
"""

from __future__ import annotations

import abc
import builtins
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Final

from trioserve.stores.checks import check_limit, no_nul, no_nul_in, opt_utc, utc
from trioserve.stores.records import utcnow

__all__ = ["TURN_ENDED", "TURN_WAITING", "Outbox", "WebhookDelivery", "check_deliveries"]

#: The event type of a turn that ended (any finished status).
TURN_ENDED: Final = "turn.ended"
#: The event type of a turn that started waiting for an approval (due at once, its payload
#: rendered when it parked; sent to its ``turn.ended`` deliveries' URLs).
TURN_WAITING: Final = "turn.waiting"


@dataclass(frozen=True, slots=True)
class WebhookDelivery:
    """One webhook message to one URL, as the outbox keeps it (see the module doc)."""

    id: str
    event: str
    url: str
    session_id: str
    #: Due once this turn is finished; ``None``: due at ``next_attempt_at``.
    turn_id: str | None
    #: The JSON body; ``None``: rendered from the finished turn at the first attempt.
    payload: str | None
    created_at: datetime
    next_attempt_at: datetime
    attempts: int = 0
    #: When the first attempt was claimed (retries stop ``--webhook-retry-for`` after it).
    first_attempt_at: datetime | None = None
    last_error: str | None = None
    owner: str | None = None
    lease_expires_at: datetime | None = None


def check_deliveries(deliveries: Sequence[WebhookDelivery]) -> builtins.list[WebhookDelivery]:
    """New deliveries as the store keeps them (``enqueue_webhooks``, ``park_turn``):
    ``ValueError`` for one with no ``turn_id`` and no ``payload``, or a NUL in a text
    field; times must be timezone-aware."""
    checked = []
    for delivery in deliveries:
        what = f"webhook {delivery.id!r}"
        no_nul_in(what, delivery, ("id", "event", "url", "session_id", "turn_id", "payload"))
        if delivery.turn_id is None and delivery.payload is None:
            raise ValueError(f"{what}: a delivery of no turn needs its payload")
        checked.append(
            replace(
                delivery,
                created_at=utc(delivery.created_at, "created_at"),
                next_attempt_at=utc(delivery.next_attempt_at, "next_attempt_at"),
                first_attempt_at=opt_utc(delivery.first_attempt_at, "first_attempt_at"),
                lease_expires_at=opt_utc(delivery.lease_expires_at, "lease_expires_at"),
                attempts=0,
                owner=None,
            )
        )
    return checked


class Outbox(abc.ABC):
    """The contract's webhook outbox (see the module doc)."""

    async def enqueue_webhooks(self, deliveries: Sequence[WebhookDelivery]) -> None:
        """Store new deliveries in one atomic step; an id stored already is left as it is
        (a repeat of the same request enqueues nothing twice).

        ``ValueError`` for a delivery with no ``turn_id`` and no ``payload``,
        or a NUL in a text field; times must be timezone-aware.
        """
        checked = check_deliveries(deliveries)
        if checked:
            await self._enqueue_webhooks(checked)

    @abc.abstractmethod
    async def _enqueue_webhooks(self, deliveries: builtins.list[WebhookDelivery]) -> None:
        """``enqueue_webhooks`` with checked deliveries."""

    async def claim_webhooks(
        self, owner: str, until: datetime, *, now: datetime | None = None, limit: int = 16
    ) -> builtins.list[WebhookDelivery]:
        """Make ``owner`` the holder of up to ``limit`` due deliveries, their lease running to
        ``until``; return them as stored, the earliest due first.

        Due: ``next_attempt_at`` reached, no lease or one passed before
        ``now`` (default: now), and a payload, or no turn, or a finished
        turn.  Sets ``first_attempt_at`` to ``now`` where it has none.  One
        atomic step: processes claiming at once never claim the same delivery.
        """
        check_limit(limit)
        moment = utcnow() if now is None else utc(now, "now")
        return await self._claim_webhooks(owner, utc(until, "until"), moment, limit)

    @abc.abstractmethod
    async def _claim_webhooks(
        self, owner: str, until: datetime, now: datetime, limit: int
    ) -> builtins.list[WebhookDelivery]:
        """``claim_webhooks`` with checked arguments."""

    async def webhook_failed(
        self, delivery_id: str, owner: str, *, retry_at: datetime, error: str, payload: str
    ) -> bool:
        """An attempt of ``owner``'s failed: count it, keep ``error`` and ``payload`` (the
        body sent: a stored payload is kept as it is), release the lease, and make the
        delivery due again at ``retry_at``.

        ``False`` (nothing changes) when ``owner`` does not hold it any more.
        """
        no_nul(f"webhook {delivery_id!r}: error", error)
        no_nul(f"webhook {delivery_id!r}: payload", payload)
        at = utc(retry_at, "retry_at")
        return await self._webhook_failed(delivery_id, owner, at, error, payload)

    @abc.abstractmethod
    async def _webhook_failed(
        self, delivery_id: str, owner: str, retry_at: datetime, error: str, payload: str
    ) -> bool:
        """``webhook_failed`` with checked arguments."""

    @abc.abstractmethod
    async def finish_webhook(self, delivery_id: str) -> bool:
        """Delete a delivery: delivered, or given up.  ``False`` when it was not stored."""

    @abc.abstractmethod
    async def drop_unborn_webhooks(self, turn_id: str) -> int:
        """Delete the deliveries gated on ``turn_id`` if that turn is not stored (its
        request was refused), in one step; how many.  A stored turn's are kept."""

    @abc.abstractmethod
    async def turn_webhook_urls(self, turn_id: str) -> builtins.list[str]:
        """The URLs the turn's end will be POSTed to: those of its ``turn.ended`` deliveries
        still in the outbox (all of them while it has not ended), sorted."""

    @abc.abstractmethod
    async def pending_webhooks(self) -> int:
        """How many deliveries the outbox holds (due or not)."""

    async def purge_webhooks(self, cutoff: datetime) -> int:
        """Delete the deliveries created before ``cutoff`` that can never become due: no
        payload, and their turn is not stored; how many."""
        return await self._purge_webhooks(utc(cutoff, "cutoff"))

    @abc.abstractmethod
    async def _purge_webhooks(self, cutoff: datetime) -> int:
        """``purge_webhooks`` with a UTC cutoff."""
