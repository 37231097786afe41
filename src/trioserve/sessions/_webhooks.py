"""Webhooks: a turn's end POSTed, signed, to the URLs it named, at least once.

The manager calls ``expect`` when it admits a turn, before the turn is
stored: the turn's ``webhook`` (checked here: a 400 naming the field,
``_webhook_urls``) and the server's ``--webhook`` each get a delivery in
the store's outbox (``stores.outbox``), gated on the turn's end.  A turn
that is refused drops them (``unborn``).  Whatever then ends the turn (its
own end, a cancel in the queue, a restart's recovery, another worker)
makes the deliveries due: nothing is lost between the end and the POST,
whichever process dies.  A turn that starts waiting for an approval
(``waiting``) gets a ``turn.waiting`` to the same URLs, its body made as
it parks (the turn record and the approval), stored with the park in one
atomic step (``park_turn``), due at once.  A turn's
deliveries can be added, listed and removed later (``add``, ``of_turn``,
``remove``: A2A's push notification configs); their ids are made from the
turn and the URL (``delivery_id``).

``run`` is each server process's deliverer: it claims due deliveries
with a lease (one process per delivery), renders a turn's body once
(``render``; kept in the outbox at the first failure, so every attempt
sends the same bytes), and POSTs it (``_webhook_send``).  A 2xx deletes
the delivery; anything else is retried with exponential backoff and full
jitter until ``--webhook-retry-for`` after the first attempt, then given
up.  One log line per attempt; metrics for sent, failed, pending, latency.
"""

from __future__ import annotations

import hashlib
import logging
import random
import secrets
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Final

import trio
from standardwebhooks import Webhook

from trioserve.errors import InvalidRequest, StoreError, TurnNotFound
from trioserve.observe import Metrics
from trioserve.protocol import TurnWaitingWebhook, TurnWebhook
from trioserve.sessions._limits import WebhookSettings
from trioserve.sessions._views import rfc3339, turn_out
from trioserve.sessions._webhook_urls import WebhookPolicy, url_host
from trioserve.stores.approvals import parked
from trioserve.stores.base import Store, TurnRecord, utcnow
from trioserve.stores.outbox import TURN_ENDED, TURN_WAITING, WebhookDelivery

if TYPE_CHECKING:
    from trioserve.sessions._webhook_send import Attempt

#: One signed POST: (url, delivery id, body, deadline) -> how it went (``_webhook_send.send``
#: with the deliverer's client and signer).
Post = Callable[[str, str, bytes, float], Awaitable["Attempt"]]

__all__ = ["Webhooks", "delivery_id", "render"]

log = logging.getLogger("trioserve.webhooks")

#: How often the outbox is looked at when nothing wakes the deliverer (other processes'
#: turns, retries coming due), and how many deliveries are in flight at once.
POLL_SECONDS: Final = 1.0
IN_FLIGHT: Final = 16
#: A claimed delivery's lease runs this long past an attempt's deadline (``--webhook-timeout``):
#: a process killed mid-attempt delays that delivery by at most the two.
LEASE_MARGIN: Final = 5.0
#: Deliveries that can never become due (``Store.purge_webhooks``) are purged this long
#: after they were made, looked for every ``_PURGE_EVERY`` seconds.
_PURGE_EVERY: Final = 600.0


def render(event: str, turn: TurnRecord, at: datetime) -> str:
    """The body of a turn's webhook: ``type``, ``timestamp``, ``sessionId`` and ``data``,
    the turn record exactly as ``GET …/turns/{turnId}`` shows it."""
    body = TurnWebhook(
        type=event, timestamp=rfc3339(at), sessionId=turn.session_id, data=turn_out(turn)
    )
    return body.model_dump_json()


def delivery_id(turn_id: str, url: str) -> str:
    """The id (``webhook-id``) of the delivery of a turn's end to ``url``: one per turn and
    URL, so the same URL named twice is one delivery."""
    return "msg_" + hashlib.sha256(f"turn\n{turn_id}\n{url}".encode()).hexdigest()[:24]


def _shown(url: str) -> str:
    """A URL for the log: its query (which may hold a token) left out."""
    return url.split("?", 1)[0]


class Webhooks:
    """The manager's webhooks (see the module doc)."""

    def __init__(self, store: Store, settings: WebhookSettings, metrics: Metrics) -> None:
        self.store = store
        self.settings = settings
        self.metrics = metrics
        explicit = [] if settings.url is None else [url_host(settings.url)]
        self.policy = WebhookPolicy(settings.allow, explicit)
        self.owner = f"webhooks:{secrets.token_hex(6)}"
        self._wake = trio.Event()
        self._signer = None if settings.secret is None else Webhook(settings.secret)

    async def check(self, webhook: str) -> str:
        """``webhook`` if a turn may carry it: webhooks are on and ``--webhook-allow``
        takes it (``InvalidRequest`` naming the field otherwise)."""
        if not self.settings.enabled:
            raise InvalidRequest(
                "webhook: webhooks are off on this server (no --webhook-secret-file)"
            )
        return await self.policy.check(webhook)

    async def expect(self, record: TurnRecord, webhook: str | None) -> int:
        """Check a turn's ``webhook`` (``InvalidRequest`` naming the field) and store its
        deliveries, due once the turn ends; how many (``unborn`` takes them back)."""
        urls = [] if self.settings.url is None else [self.settings.url]
        if webhook is not None:
            urls.append(await self.check(webhook))
        if not urls or not self.settings.enabled:
            return 0
        now = utcnow()
        await self.store.enqueue_webhooks(
            [
                WebhookDelivery(
                    delivery_id(record.id, url),
                    TURN_ENDED,
                    url,
                    record.session_id,
                    record.id,
                    None,
                    now,
                    now,
                )
                for url in dict.fromkeys(urls)
            ]
        )
        return len(urls)

    async def add(self, turn: TurnRecord, url: str) -> str:
        """Send ``turn``'s end (and its ``turn.waiting``) to ``url`` too, as if the turn had
        named it (checked the same way: ``InvalidRequest`` naming ``webhook``); due at once
        if the turn has ended already.  The delivery's id (the same for the same URL)."""
        if not self.settings.enabled:
            raise InvalidRequest(
                "webhook: webhooks are off on this server (no --webhook-secret-file)"
            )
        url = await self.policy.check(url)
        now = utcnow()
        found = delivery_id(turn.id, url)
        where = (url, turn.session_id, turn.id)
        await self.store.enqueue_webhooks(
            [WebhookDelivery(found, TURN_ENDED, *where, None, now, now)]
        )
        self.wake()
        return found

    async def of_turn(self, turn_id: str) -> list[tuple[str, str]]:
        """The ids and URLs the turn's end is still to be POSTed to, the server's own
        ``--webhook`` left out (a client neither sees nor removes it)."""
        urls = await self.store.turn_webhook_urls(turn_id)
        return [(delivery_id(turn_id, u), u) for u in urls if u != self.settings.url]

    async def remove(self, turn_id: str, found: str) -> bool:
        """Drop the turn's delivery ``found`` (an id of ``of_turn``); whether it was there."""
        if found not in dict(await self.of_turn(turn_id)):
            return False
        return await self.store.finish_webhook(found)

    async def unborn(self, turn_id: str, expected: int) -> None:
        """Drop a refused turn's deliveries (it was never stored); shielded, bounded."""
        if not expected:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            try:
                await self.store.drop_unborn_webhooks(turn_id)
            except StoreError as exc:  # purged later (``purge_webhooks``)
                log.warning("webhooks of refused turn %s not dropped: %s", turn_id, exc)

    async def waiting(
        self, session_id: str, turn_id: str, approval: dict[str, Any]
    ) -> list[WebhookDelivery]:
        """The deliveries of the running turn's ``turn.waiting``, for ``approval`` (as
        clients see it): one to each URL its end goes to, due at once, its body the turn
        as it will be stored once parked.  The store parks the turn with them
        (``park_turn``: one atomic step).  One delivery id per approval and URL, so a
        repeat enqueues nothing twice."""
        if not self.settings.enabled:
            return []
        urls = await self.store.turn_webhook_urls(turn_id)
        if not urls:
            return []
        turn = parked(await self.store.get_turn(session_id, turn_id))
        now = utcnow()
        body = TurnWaitingWebhook(
            type=TURN_WAITING,
            timestamp=rfc3339(now),
            sessionId=turn.session_id,
            data=turn_out(turn),
            approval=approval,
        ).model_dump_json()
        deliveries = []
        for url in urls:
            digest = hashlib.sha256(f"{approval.get('approvalId')}\n{url}".encode()).hexdigest()
            where = (url, turn.session_id, turn.id)
            deliveries.append(
                WebhookDelivery(f"msg_{digest[:24]}", TURN_WAITING, *where, body, now, now)
            )
        return deliveries

    def wake(self) -> None:
        """A turn ended here: look at the outbox now."""
        self._wake.set()

    async def run(self) -> None:
        """Deliver due deliveries until cancelled (nothing when webhooks are off)."""
        if self._signer is None:
            return
        # Only now: httpx costs a server that sends no webhook 40 ms of start-up and MiBs.
        from trioserve.sessions._webhook_send import open_client, send

        settings = self.settings
        client = open_client(self.policy, settings.connect_timeout, settings.timeout)
        post: Post = partial(send, client, self._signer)
        lease = timedelta(seconds=settings.timeout + LEASE_MARGIN)  # past an attempt's deadline
        in_flight = 0
        next_purge = trio.current_time()

        async def deliver(delivery: WebhookDelivery) -> None:
            nonlocal in_flight
            try:
                await self._deliver(post, delivery)
            except StoreError as exc:  # the lease passes: claimed again later
                log.warning("webhook %s: the store failed: %s", delivery.id, exc)
            except Exception:  # a bug: logged, and the deliverer goes on
                log.exception("webhook %s: attempt failed", delivery.id)
            finally:
                in_flight -= 1

        try:
            async with trio.open_nursery() as nursery:
                while True:
                    with trio.move_on_after(POLL_SECONDS):
                        await self._wake.wait()
                    self._wake = trio.Event()
                    try:
                        if trio.current_time() >= next_purge:
                            next_purge = trio.current_time() + _PURGE_EVERY
                            cutoff = utcnow() - timedelta(seconds=max(settings.retry_for, 3600))
                            await self.store.purge_webhooks(cutoff)
                        now = utcnow()
                        claimed = await self.store.claim_webhooks(
                            self.owner, now + lease, now=now, limit=IN_FLIGHT - in_flight
                        )
                        self.metrics.webhooks_pending.set(await self.store.pending_webhooks())
                    except StoreError as exc:
                        log.warning("webhooks: the store failed: %s", exc)
                        continue
                    for delivery in claimed:
                        in_flight += 1
                        nursery.start_soon(deliver, delivery)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await client.aclose()

    async def _deliver(self, post: Post, delivery: WebhookDelivery) -> None:
        payload = delivery.payload
        if payload is None:
            payload = await self._render(delivery)
            if payload is None:
                return
        if not self.policy.permits(url_host(delivery.url)) and delivery.url != self.settings.url:
            log.warning(
                "webhook %s to %s given up: its host is not in --webhook-allow any more",
                delivery.id,
                _shown(delivery.url),
            )
            await self._give_up(delivery)
            return
        attempt = await post(delivery.url, delivery.id, payload.encode(), self.settings.timeout)
        number = delivery.attempts + 1
        self.metrics.webhook_attempt_seconds.observe(attempt.seconds)
        if attempt.delivered:
            log.info(
                "webhook %s (%s of turn %s) attempt %d to %s: delivered, %s",
                delivery.id,
                delivery.event,
                delivery.turn_id,
                number,
                _shown(delivery.url),
                attempt.detail,
            )
            self.metrics.webhooks_sent.inc()
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await self.store.finish_webhook(delivery.id)
            return
        self.metrics.webhook_attempts_failed.inc()
        first = delivery.first_attempt_at or utcnow()
        retry_at = utcnow() + timedelta(seconds=self._backoff(number))
        last = retry_at > first + timedelta(seconds=self.settings.retry_for)
        log.warning(
            "webhook %s (%s of turn %s) attempt %d to %s failed: %s; %s",
            delivery.id,
            delivery.event,
            delivery.turn_id,
            number,
            _shown(delivery.url),
            attempt.detail,
            "given up (--webhook-retry-for)" if last else f"next at {rfc3339(retry_at)}",
        )
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            if last:
                await self._give_up(delivery)
            else:
                await self.store.webhook_failed(
                    delivery.id,
                    self.owner,
                    retry_at=retry_at,
                    error=attempt.detail,
                    payload=payload,
                )
        self.wake()  # a slot is free

    def _backoff(self, attempts: int) -> float:
        """Full jitter: a random delay up to ``backoff * 2**(attempts-1)``, capped, and at
        least half of it (so retries never bunch at once)."""
        settings = self.settings
        ceiling = min(settings.max_backoff, settings.backoff * 2 ** min(attempts - 1, 30))
        return random.uniform(ceiling / 2, ceiling)

    async def _render(self, delivery: WebhookDelivery) -> str | None:
        """The turn's body, or ``None`` when its turn is gone (deleted before the first
        attempt: the delivery is dropped)."""
        assert delivery.turn_id is not None
        try:
            turn = await self.store.get_turn(delivery.session_id, delivery.turn_id)
        except TurnNotFound:
            turn = None
        except StoreError as exc:
            log.warning("webhook %s: its turn could not be read: %s", delivery.id, exc)
            return None  # the lease passes, the next claim tries again
        if turn is None:
            log.warning("webhook %s: turn %s is gone; dropped", delivery.id, delivery.turn_id)
            await self._give_up(delivery)
            return None
        if not turn.status.finished:  # not claimed so (the outbox's gate): never sent early
            return None
        return render(delivery.event, turn, utcnow())

    async def _give_up(self, delivery: WebhookDelivery) -> None:
        self.metrics.webhooks_failed.inc()
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await self.store.finish_webhook(delivery.id)
