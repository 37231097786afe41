"""Observability: Prometheus ``Metrics``, OpenTelemetry traces, log formats.

``tracing`` and ``logformat`` are the modules themselves (each has a
``configure``).  The names other layers use are exported here and load on
first use (``trioserve._lazy``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trioserve._lazy import lazy_exports

if TYPE_CHECKING:
    from trioserve.observe import _logformat as logformat
    from trioserve.observe import _tracing as tracing
    from trioserve.observe._logformat import LogFormat, log_fields
    from trioserve.observe._metrics import Metrics
    from trioserve.observe._tracing import TurnTrace

__all__ = [
    "LogFormat",
    "Metrics",
    "TurnTrace",
    "log_fields",
    "logformat",
    "tracing",
]

#: The private modules and what each exports here (loaded on first use).
_NAMES = {
    "_logformat": ("LogFormat", "log_fields"),
    "_metrics": ("Metrics",),
    "_tracing": ("TurnTrace",),
}
#: Private modules exported whole, by their public name.
_MODULES = {
    "logformat": "_logformat",
    "tracing": "_tracing",
}

if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, _NAMES, _MODULES)
