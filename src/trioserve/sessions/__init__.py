"""Sessions and turns: the ``SessionManager``, its ``Limits``, running ``Turn``s.

The manager admits sessions and turns (caps, single-flight), runs each turn
as a task, logs its events and serves the logs; see ``_manager``.  The
modules are private; the names other layers use are exported here and load
on first use (``trioserve._lazy``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trioserve._lazy import lazy_exports

if TYPE_CHECKING:
    from trioserve.sessions._cron_fire import CronScheduler
    from trioserve.sessions._crons import CronPage, Crons, CronView
    from trioserve.sessions._idempotency import TurnReplay
    from trioserve.sessions._inputs import input_names
    from trioserve.sessions._limits import (
        AdapterStderr,
        ForkServerMode,
        Limits,
        WebhookSettings,
        check_secret,
    )
    from trioserve.sessions._manager import SessionManager
    from trioserve.sessions._queue import QueuedTurn
    from trioserve.sessions._turns import Turn, turn_protocol
    from trioserve.sessions._views import rfc3339, session_out, turn_out

__all__ = [
    "AdapterStderr",
    "CronPage",
    "CronScheduler",
    "CronView",
    "Crons",
    "ForkServerMode",
    "Limits",
    "QueuedTurn",
    "SessionManager",
    "Turn",
    "TurnReplay",
    "WebhookSettings",
    "check_secret",
    "input_names",
    "rfc3339",
    "session_out",
    "turn_out",
    "turn_protocol",
]

#: The private modules and what each exports here (loaded on first use).
_NAMES = {
    "_cron_fire": ("CronScheduler",),
    "_crons": ("CronPage", "CronView", "Crons"),
    "_idempotency": ("TurnReplay",),
    "_inputs": ("input_names",),
    "_limits": ("AdapterStderr", "ForkServerMode", "Limits", "WebhookSettings", "check_secret"),
    "_manager": ("SessionManager",),
    "_queue": ("QueuedTurn",),
    "_turns": ("Turn", "turn_protocol"),
    "_views": ("rfc3339", "session_out", "turn_out"),
}

if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, _NAMES)
