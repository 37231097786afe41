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
    from trioserve.sessions._limits import AdapterStderr, Limits
    from trioserve.sessions._manager import SessionManager
    from trioserve.sessions._turns import Turn

__all__ = [
    "AdapterStderr",
    "Limits",
    "SessionManager",
    "Turn",
]

#: The private modules and what each exports here (loaded on first use).
_NAMES = {
    "_limits": ("AdapterStderr", "Limits"),
    "_manager": ("SessionManager",),
    "_turns": ("Turn",),
}

if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, _NAMES)
