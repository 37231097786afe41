"""A turn's task: its adapter's run, its deadline and first-event span, and its end.

``SessionManager.start_turn`` admits a turn and starts ``TurnRunner.run``
in the manager's nursery.  The run takes a warm adapter from the pool (or
starts one, through the launcher), feeds the turn's log while it runs, and
in a shielded cleanup with its own deadline ends the log (the turn's
``TurnState`` gives the final status and reason), writes it, and releases
the turn (its slot and the session) before the feed finishes, so a client
that saw the end of a stream can start the next turn at once.  When the
store refuses that last write the turn ends ``failed``, ``store_error``,
and ``EndRetries`` (``_end_retry.py``) writes its end again until the store
takes it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Awaitable, Callable, Iterator, Sequence
from functools import partial
from typing import Final

import trio

from trioserve.errors import LogConflict, StoreError
from trioserve.observe import Metrics, TurnTrace
from trioserve.protocol import TurnStatus
from trioserve.runtime import (
    AdapterLauncher,
    ForkServer,
    ProcessGuard,
    Started,
    WarmPool,
    crash_summary,
    stderr_text,
    wire,
)
from trioserve.sessions._approval_events import new_approval, requested_event
from trioserve.sessions._end_retry import STORE_ERROR, EndRetries
from trioserve.sessions._history import turn_context
from trioserve.sessions._limits import Limits
from trioserve.sessions._specs import SessionSpecs
from trioserve.sessions._turns import Turn, TurnLog, log_end
from trioserve.spec import (
    WITH_APPROVALS,
    WITH_HISTORY,
    ApprovalContext,
    CompiledSpec,
    TurnContext,
    approval_tools,
)
from trioserve.stores.approvals import ApprovalRecord
from trioserve.stores.base import Session, Store, TurnEnd

log = logging.getLogger("trioserve.manager")

_CLEANUP_DEADLINE: Final = 10.0  # shielded store writes at the end of a turn


class TurnRunner:
    """Runs the manager's admitted turns; ``release`` gives a finished turn's slot back."""

    def __init__(
        self,
        store: Store,
        limits: Limits,
        metrics: Metrics,
        specs: SessionSpecs,
        command: Sequence[str],
        *,
        pool: WarmPool | None,
        guard: ProcessGuard | None,
        forker: ForkServer | None = None,
        launcher: AdapterLauncher,
        release: Callable[[Turn], None],
        retries: EndRetries,
        park: Callable[[Turn, ApprovalRecord], Awaitable[None]],
    ) -> None:
        self.store = store
        self.limits = limits
        self.metrics = metrics
        self._specs = specs
        self._command = list(command)
        self._pool = pool
        self._forker = forker
        self._guard = guard
        self._launch = launcher  # runs each turn's adapter (``runtime/_launcher.py``)
        self._release = release
        self._retries = retries  # turns whose end the store refused (``_end_retry``)
        self._park_turn = park  # parks a turn on its approval, in the store (``_approvals``)

    async def run(self, turn: Turn, session: Session, trace: TurnTrace) -> None:
        """Run ``turn``'s adapter, then end its log and release the turn (see the module doc)."""
        turn_log = TurnLog(self.store, turn, self.metrics)
        try:
            async with trio.open_nursery() as nursery:
                # The turn's cancel scope is its nursery's (a cancel that came first holds).
                if turn.cancel_scope.cancel_called:
                    nursery.cancel_scope.cancel()
                turn.cancel_scope = nursery.cancel_scope
                timeout = self.limits.turn_timeout
                deadline = trio.current_time() + timeout if timeout > 0 else math.inf
                nursery.start_soon(turn_log.run, deadline, turn.deadline_passed)
                if trace.recording:
                    nursery.start_soon(_first_event, turn, trace)
                spec = self._specs.of(session)
                context = None
                if spec.runtime.type in WITH_HISTORY:  # the adapter remembers the session
                    turn.launched.set()  # a long history's read: its start need not wait
                    context = await turn_context(self.store, turn.session_id, spec.task)
                context = self._approvals(spec, turn, context)
                spec = spec.with_turn(turn.record.input or spec.task, turn.session_id, context)
                turn_log.add_many(turn.preface)  # a continuation's approval.resolved
                env = None if turn.env is None else {**os.environ, **turn.env}
                guard = trace.guard(self._guard)
                started = None
                if self._forker is not None:
                    turn.launched.set()  # nor the fork server's answer
                    forked = await self._forker.spawn(env, guard=guard)
                    if forked is not None:  # owned from here: no await until the launch
                        started = Started(forked)
                        turn.adapter = "fork"
                elif self._pool is not None and turn.env is None:
                    first = partial(turn.feed.wait, turn.feed.first_seq - 1)
                    started = await self._pool.take(first)
                    turn.warm = started is not None
                    if turn.warm:
                        turn.adapter = "warm"
                        trace.adapter_started(warm=True)
                turn.launched.set()  # its start goes on once this task yields: the spawn first
                turn.outcome = await self._launch(
                    self._command,
                    spec,
                    turn.session_id,
                    turn_log,
                    policy=turn.process,
                    max_event_bytes=self.limits.max_event_bytes,
                    env=env,
                    guard=guard,
                    started=started,
                    state=turn.state,
                )
                if self.limits.adapter_stderr == "log":
                    _log_crash(turn)
                turn_log.stop()  # the nursery's tasks end by themselves, not cancelled
                if trace.recording:
                    nursery.cancel_scope.cancel()  # _first_event may still wait
        except Exception as exc:
            store_failed = _store_failure(exc)
            if store_failed is None:
                turn.state.failed()
                log.exception("turn %s of session %s failed", turn.id, turn.session_id)
            else:
                turn.state.failed("store_error")
                log.error(
                    "turn %s of session %s: the store refused its log: %s",
                    turn.id,
                    turn.session_id,
                    store_failed,
                )
        finally:
            turn.launched.set()  # ended before its launch
            trace.ending()
            end = turn_log.end_turn()
            written = False
            # Shielded from the turn's cancellation, with a deadline of its own.
            cleanup = trio.current_time() + _CLEANUP_DEADLINE
            with trio.CancelScope(shield=True, deadline=cleanup):
                try:
                    if end.status is TurnStatus.WAITING:
                        end = turn.end = await self._park(turn, turn_log, end)
                    if end.status is not TurnStatus.WAITING:  # parked: _park wrote the log
                        await turn_log.close(end)
                    written = True
                except LogConflict:  # closed by another process (shared store)
                    written = True
                    with contextlib.suppress(StoreError, OSError):
                        await turn_log.adopt_stored()
                except (StoreError, OSError) as exc:
                    log.error("turn %s: could not write its log: %s", turn.id, exc)
            if not written:  # the store has it running: write its end again, with backoff
                end = turn.end = TurnEnd(TurnStatus.FAILED, STORE_ERROR, end.ended_at)
                events, started_at = turn_log.unwritten()
                self._retries.add(turn.session_id, turn.id, events, started_at)
            self._release(turn)
            turn_log.finish()
            log_end(turn, turn_log.sent)
            trace.finish(end.status.value, end.reason)
            self.metrics.turn_ended(turn, turn_log.first_event_at)

    def _approvals(
        self, spec: CompiledSpec, turn: Turn, context: TurnContext | None
    ) -> TurnContext | None:
        """``context`` with what the adapter is told of approvals (``trioserve.approval``,
        and ``trioserve.resume`` for a continuation), for the runtime types that take it."""
        if spec.runtime.type not in WITH_APPROVALS:
            return context
        refs = [(ref.name, ref.config) for ref in spec.tools]
        tools = approval_tools(spec.runtime.options, refs, list(self.limits.require_approval))
        if not tools and turn.resume is None:
            return context
        turn.state.may_wait = bool(tools)
        return (context or TurnContext()).model_copy(
            update={"approval": ApprovalContext(tools=tools), "resume": turn.resume}
        )

    async def _park(self, turn: Turn, turn_log: TurnLog, end: TurnEnd) -> TurnEnd:
        """The adapter asked for an approval and ended ``waiting``: log the server's
        ``approval.requested``, write the log, park the turn in the store.  The turn's
        end if the store refused (``failed``, its events still logged)."""
        request = turn.state.approval or {}
        approval = new_approval(turn, request, self.limits.approval_timeout)
        turn_log.add(requested_event(approval))
        try:
            await turn_log.close(None)
            await self._park_turn(turn, approval)
        except (StoreError, OSError) as exc:
            log.error("turn %s: could not park it for its approval: %s", turn.id, exc)
            turn_log.add(
                wire.error_event(
                    turn.session_id, "the turn could not wait for its approval", reason=STORE_ERROR
                )
            )
            return TurnEnd(TurnStatus.FAILED, STORE_ERROR, end.ended_at)
        log.info(
            "turn %s of session %s waits for approval %s (tool %s)",
            turn.id,
            turn.session_id,
            approval.id,
            approval.tool,
        )
        return end


def _store_failure(exc: BaseException) -> BaseException | None:
    """The store's error, when that is all ``exc`` (maybe a group of them) is."""
    if isinstance(exc, StoreError | OSError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        leaves = list(_leaves(exc))
        if leaves and all(isinstance(leaf, StoreError | OSError) for leaf in leaves):
            return leaves[0]
    return None


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc


def _log_crash(turn: Turn) -> None:
    """With ``--adapter-stderr log``: a crashed adapter's stderr tail, for the operator only."""
    outcome = turn.outcome
    if outcome is None or outcome.error_reason != "adapter_exit":
        return
    log.warning(
        "turn %s of session %s: %s; stderr: %s",
        turn.id,
        turn.session_id,
        crash_summary(outcome),
        stderr_text(outcome) or "(none)",
    )


async def _first_event(turn: Turn, trace: TurnTrace) -> None:
    """Ends the turn's ``first_event`` span once its first event is logged."""
    await turn.feed.wait(turn.feed.first_seq - 1)
    if turn.feed.published >= turn.feed.first_seq:
        trace.first_event()
