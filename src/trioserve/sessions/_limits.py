"""What the session manager enforces (``trioserve run``'s limit flags)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from trioserve.protocol import OnDisconnect

#: Where a crashed adapter's stderr tail goes (``--adapter-stderr``).
AdapterStderr = Literal["client", "log"]


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
    warm_adapters: int = 1  # adapter processes started ahead of turns; 0 = off
    #: The pool may grow to this many when turns come faster than an adapter
    #: loads; None = ``warm_adapters`` (no growth).
    warm_adapters_max: int | None = None
    warm_max_idle: float = 600.0  # a warm process idle this long is replaced; 0 = never
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
