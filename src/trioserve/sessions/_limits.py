"""What the session manager enforces (``trioserve run``'s limit flags)."""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass, field
from typing import Final, Literal

from trioserve.protocol import Multitask, OnDisconnect

#: Where a crashed adapter's stderr tail goes (``--adapter-stderr``).
AdapterStderr = Literal["client", "log"]
#: Whether a built-in Python adapter is forked from a fork server (``--fork-server``).
ForkServerMode = Literal["auto", "off"]
#: The ``whsec_`` prefix of a Standard Webhooks secret.
SECRET_PREFIX: Final = "whsec_"


@dataclass(frozen=True, slots=True)
class WebhookSettings:
    """Where and how turns' ends are POSTed (``_webhooks``; the ``--webhook*`` flags)."""

    #: ``--webhook``: the URL every turn's end is sent to (``None``: only turns that ask).
    url: str | None = None
    #: The ``whsec_`` secret that signs them; ``None``: webhooks are off.
    secret: str | None = None
    #: ``--webhook-allow``: the hosts a turn's own ``webhook`` may name (``_webhook_urls``).
    allow: tuple[str, ...] = ()
    #: How long a delivery is retried after its first attempt (``--webhook-retry-for``).
    retry_for: float = 24 * 3600.0
    #: The first retry's delay, doubled at each retry up to ``max_backoff``, with jitter.
    backoff: float = 5.0
    max_backoff: float = 3600.0
    #: Seconds to connect, and for a whole attempt (``--webhook-timeout``).
    connect_timeout: float = 5.0
    timeout: float = 15.0

    @property
    def enabled(self) -> bool:
        return self.secret is not None


def check_secret(secret: str) -> str:
    """``secret`` (stripped) if it is ``whsec_`` and base64 of 24 to 64 bytes, as the
    Standard Webhooks format says; else ``ValueError`` saying what is expected."""
    value = secret.strip()
    if not value.startswith(SECRET_PREFIX):
        raise ValueError(f"expected a secret starting with {SECRET_PREFIX!r}")
    try:
        key = base64.b64decode(value[len(SECRET_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"expected base64 after {SECRET_PREFIX!r}") from None
    if not 24 <= len(key) <= 64:
        raise ValueError(f"expected a key of 24 to 64 bytes, got {len(key)}")
    return value


@dataclass(frozen=True, slots=True)
class Limits:
    """What the session manager enforces.  0 means unlimited / off."""

    max_concurrent_turns: int = 8
    max_sessions: int = 1000
    session_ttl: float = 168 * 3600.0
    adapter_stop_grace: float = 5.0
    max_event_bytes: int = 8 * 1024 * 1024
    turn_timeout: float = 30 * 60.0  # 0 = no deadline
    event_retention: float = 7 * 86400.0  # 0 = keep logged events forever
    session_retention: float = 7 * 86400.0  # terminal sessions purged after; 0 = keep
    on_disconnect: OnDisconnect = "cancel"
    #: What a turn does when its session is busy, unless it says (``multitask``):
    #: ``reject`` is the reference's 409.
    multitask: Multitask = "reject"
    #: How many turns may wait on one session (``multitask: enqueue``); one more is a 429.
    max_queued_turns: int = 8
    warm_adapters: int = 1  # adapter processes started ahead of turns; 0 = off
    #: The pool may grow to this many when turns come faster than an adapter
    #: loads; None = one per core the server may use (``warm_ceiling``).
    warm_adapters_max: int | None = None
    warm_max_idle: float = 600.0  # a warm process idle this long is replaced; 0 = never
    #: ``auto``: a built-in Python adapter (``echo``, ``openai``) is forked for each
    #: turn from a fork server that imported it once (no warm pool then; exec'd where it
    #: cannot fork); ``off``: exec'd.
    fork_server: ForkServerMode = "auto"
    #: Where a crashed adapter's stderr tail goes: the client's ``error`` event
    #: (as the reference) or the server log only.
    adapter_stderr: AdapterStderr = "client"
    #: Per tenant (API key owner), only with API keys: 0 = no cap of its own.
    max_sessions_per_tenant: int = 100
    max_turns_per_tenant: int = 4
    #: Refuse (400) a create whose inputs leave a ``${inputs.<key>}`` of the task
    #: without a value; by default it stays as written (as in the reference).
    require_inputs: bool = False
    #: The store is shared with other server processes (``--workers``, replicas on
    #: PostgreSQL): single flight and the global caps are the store's, turns hold
    #: leases of ``turn_lease`` seconds (see ``_leases``).
    shared_store: bool = False
    turn_lease: float = 10.0
    #: How long an idempotency key answers repeats of its request (``_idempotency``);
    #: 0 = keys are not kept (a request's key is ignored).
    idempotency_window: float = 24 * 3600.0
    #: Crons one tenant may hold (``POST /v1/crons``); 0 = no cap.
    max_crons_per_tenant: int = 100
    #: A fire no process claimed within this many seconds of its time was missed
    #: (no process was up): it follows the cron's ``catchUp`` (``sessions._crons``).
    cron_misfire_grace: float = 60.0
    #: Tools (globs) that need a person's approval before they run, for every session,
    #: beside what its spec declares (``--require-approval``); see ``_approvals``.
    require_approval: tuple[str, ...] = ()
    #: How long an approval waits for a decision; then it is denied, ``expired``.
    approval_timeout: float = 24 * 3600.0
    #: Webhooks: where turns' ends are POSTed, signed, and how (``_webhooks``).
    webhooks: WebhookSettings = field(default_factory=WebhookSettings)

    @property
    def warm_ceiling(self) -> int:
        """The most warm adapters the pool may hold: ``warm_adapters_max``, by default one
        per core the server may use (never below ``warm_adapters``; 0 with the pool off)."""
        if not self.warm_adapters:
            return 0
        most = self.warm_adapters_max
        if most is None:
            most = len(os.sched_getaffinity(0))
        return max(self.warm_adapters, most)
