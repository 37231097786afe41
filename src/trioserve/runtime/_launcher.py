"""The adapter launcher: the seam between a turn and whatever runs its adapter.

``SessionManager`` runs each turn's adapter through an ``AdapterLauncher``.
The server's is ``run_adapter`` (``runtime/_process.py``): a child process,
or one the warm pool started.  Tests pass a stand-in that plays a turn in
the test's own Trio run (``tests/helpers/scripted.py``), so tests of
sessions, turns, the event log and the transports need no process; tests
of processes (the adapter, the pool, the reaper, the server's life) keep
``run_adapter``.

A launcher has ``run_adapter``'s contract: it feeds what the adapter
prints and how it ends to the turn's ``state`` (``runtime._lifecycle``) and
hands the events that makes to ``sink``, honours ``policy`` (``interrupt``:
SIGINT, SIGKILL past the grace), tells ``guard`` of every process it starts
and reaps, and returns the ``AdapterOutcome``; cancelled, it stops what it
started before it returns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from trioserve.runtime._handle import ProcessHandle
from trioserve.runtime._lifecycle import TurnState
from trioserve.runtime._process import AdapterOutcome, EventSink, ProcessGuard, Started
from trioserve.spec import CompiledSpec


class AdapterLauncher(Protocol):
    """Runs one turn's adapter to its end; ``run_adapter`` is the real one."""

    async def __call__(
        self,
        command: Sequence[str],
        spec: CompiledSpec,
        session_id: str,
        sink: EventSink,
        *,
        policy: ProcessHandle,
        max_event_bytes: int,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        guard: ProcessGuard | None = None,
        started: Started | None = None,
        state: TurnState | None = None,
    ) -> AdapterOutcome: ...
