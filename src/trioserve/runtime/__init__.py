"""The adapter runtime: one turn's adapter process, its wire lines, the warm pool.

``run_adapter`` runs a turn's adapter (``_process``), deciding its end with
the sans-IO ``TurnState`` (``_lifecycle``) over the ``LineFramer``; the
``WarmPool`` keeps adapters started ahead of turns; the ``ForkServer``
forks a built-in Python adapter for each turn instead.  ``reaper``,
``forkserver`` and ``echo_adapter`` are programs (``python -m``): this package imports none of
its modules until a name is used (``trioserve._lazy``), so they start
without trio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trioserve._lazy import lazy_exports

if TYPE_CHECKING:
    from trioserve.runtime import _wire as wire
    from trioserve.runtime._forker import (
        ForkServer,
        ForkServerError,
        ForkTarget,
        fork_target,
    )
    from trioserve.runtime._handle import ProcessHandle
    from trioserve.runtime._launcher import AdapterLauncher
    from trioserve.runtime._lifecycle import Action, StopReason, TurnState, exit_label
    from trioserve.runtime._pool import WarmPool
    from trioserve.runtime._process import (
        AdapterOutcome,
        ProcessGuard,
        Started,
        crash_summary,
        run_adapter,
        stderr_text,
    )

__all__ = [
    "Action",
    "AdapterLauncher",
    "AdapterOutcome",
    "ForkServer",
    "ForkServerError",
    "ForkTarget",
    "ProcessGuard",
    "ProcessHandle",
    "Started",
    "StopReason",
    "TurnState",
    "WarmPool",
    "crash_summary",
    "exit_label",
    "fork_target",
    "run_adapter",
    "stderr_text",
    "wire",
]

#: The private modules and what each exports here (loaded on first use).
_NAMES = {
    "_forker": ("ForkServer", "ForkServerError", "ForkTarget", "fork_target"),
    "_handle": ("ProcessHandle",),
    "_launcher": ("AdapterLauncher",),
    "_lifecycle": ("Action", "StopReason", "TurnState", "exit_label"),
    "_pool": ("WarmPool",),
    "_process": (
        "AdapterOutcome",
        "ProcessGuard",
        "Started",
        "crash_summary",
        "run_adapter",
        "stderr_text",
    ),
}
#: Private modules exported whole, by their public name.
_MODULES = {
    "wire": "_wire",
}

if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, _NAMES, _MODULES)
