"""The turn lifecycle: every rule that decides how a turn goes and ends (sans-IO).

As in h11, the rules live in one object that does no I/O: ``TurnState``.
The code that does the I/O tells it what happened and does what it
answers.  The adapter reader (``runtime._process.run_adapter``) gives it
the adapter's output (lines, an oversized line), a failed start, the
process exit; the turn (``sessions._turns.Turn``) gives it stop requests
(a cancel, the deadline, the end of the session, a shutdown, the client
leaving); the turn's runner (``sessions._manager``) gives it a failure of
its own (a store that failed, a bug) and asks it, at the end, for the last
events to log and the turn's final status and reason.  Its answers are
events to log (in order, before anything else is logged) and ``Action``s
for the process.  docs/design.md, "The turn state table", lists every rule.

It lives in ``runtime`` (not ``sessions``) because the adapter reader, the
lowest of the code that calls it, may import nothing above ``runtime``.

Kept as they were before this module existed (issue 11): a stopped turn
gets a ``session.ended`` ``cancelled`` made by the server when its adapter
sends none; a crash, an oversized line or a failed start end the turn with
an ``error`` and no ``session.ended``; the adapter's report decides the
status only once its run is over (a run cut short by an outright cancel
counts as stopped).
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Sequence
from typing import Any, Final, Literal, NamedTuple, cast

from trioserve.protocol import APPROVAL_REQUESTED, SESSION_ENDED, OnDisconnect, TurnStatus
from trioserve.runtime import _wire as wire
from trioserve.runtime._framing import Line, Oversized
from trioserve.units import format_duration

#: Why the server stopped a turn.
StopReason = Literal[
    "cancelled",
    "turn_timeout",
    "session_ended",
    "server_shutdown",
    "client_disconnected",
    "interrupted",
]
#: Why an adapter's run failed (the turn's reason, status ``failed``).
FailReason = Literal["adapter_start_failed", "event_too_large", "adapter_exit"]

#: Why a turn's runner failed, and its ``error`` event's message (when it logged nothing).
RunnerFailure = Literal["internal", "store_error"]
RUNNER_FAILURES: Final[dict[str, str]] = {
    "internal": "internal error",
    "store_error": "the session store refused the turn's log",
}

#: The stop reasons whose turn gets an ``error`` notice (``data.reason``) before its end.
NOTICES: Final[dict[str, str]] = {
    "turn_timeout": "turn stopped: it ran longer than the turn timeout ({limit})",
    "server_shutdown": "turn stopped: the server is shutting down",
}
#: Event types ``output`` acts on (line by line): they end the turn or park it.
_ROUTED: Final = frozenset({SESSION_ENDED, APPROVAL_REQUESTED})
#: How much of an undecodable line its ``error`` event quotes.
PREVIEW_BYTES: Final = 200


class Action(enum.Enum):
    """What to do to the turn's adapter after a stop request."""

    NONE = "none"
    #: SIGINT to its group now, SIGKILL after the stop grace; its output is still read.
    INTERRUPT = "interrupt"
    #: SIGKILL at once (a forced shutdown); its output is still read until it is gone.
    FORCE = "force"
    #: Cancel the turn's task outright: SIGKILL, no more output read.
    CANCEL = "cancel"


class Verdict(NamedTuple):
    """How a turn ended: its record's final status and reason."""

    status: TurnStatus
    reason: str


def describe_exit(code: int) -> str:
    """``exited with status 3`` or ``was killed by SIGKILL``."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def crash_summary(exit_code: int | None) -> str:
    """``adapter exited with status 3 before session.ended`` (or ``was killed by ...``)."""
    return f"adapter {describe_exit(-1 if exit_code is None else exit_code)} before session.ended"


def exit_label(code: int | None) -> str | None:
    """``0``, ``3``, or the signal that killed it (``SIGKILL``); ``None``: never ran."""
    if code is None or code >= 0:
        return None if code is None else str(code)
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal{-code}"


class TurnState:
    """The state of one turn, fed by the I/O code; see the module doc.

    Every method is an input.  Those returning a list return the events to
    log, in order; the stop requests return the ``Action`` for the adapter.
    """

    def __init__(
        self,
        session_id: str,
        *,
        turn_timeout: float = 0.0,
        on_disconnect: OnDisconnect = "cancel",
        stderr_to_client: bool = True,
    ) -> None:
        self.session_id = session_id
        self.on_disconnect: OnDisconnect = on_disconnect
        self.stderr_to_client = stderr_to_client
        self._limit = format_duration(turn_timeout)
        #: Why the server stopped the turn, if it did (the first reason wins).
        self.stop_reason: StopReason | None = None
        #: The ``data.message`` of the ``session.ended`` the server makes for a stopped
        #: turn, when the reason's words are not enough (``interrupted by turn t_...``).
        self.stop_message: str | None = None
        #: ``data.reason`` of the adapter's ``session.ended`` (``completed`` if it has none).
        self.end_reason: str | None = None
        #: Why the adapter's run failed, and the message of the ``error`` that says so.
        self.failure: FailReason | None = None
        self.error: str | None = None
        #: Whether a ``session.ended`` was logged (the adapter's or the server's).
        self.ended = False
        #: False once the sink took no more events (a test sink whose reader left).
        self.listening = True
        #: Whether the adapter's run is over (``run_adapter`` returned).
        self.run_over = False
        #: Whether the runner itself failed (a store failure, a bug).
        self.runner_failed = False
        #: Why it failed: ``internal`` (a bug) or ``store_error`` (the store refused a write).
        self.runner_failure: RunnerFailure = "internal"
        #: Set by ``finish``: how the turn ended.
        self.verdict: Verdict | None = None
        #: How many events the state has given to log.
        self.emitted = 0
        #: Whether the adapter was told it may wait for approvals (``trioserve.approval``);
        #: then its ``approval.requested`` is kept here (``approval``), not logged as it is,
        #: and its ``session.ended`` ``waiting`` parks the turn (``parked``), not logged.
        self.may_wait = False
        self.approval: dict[str, Any] | None = None
        self.parked = False

    @property
    def reading(self) -> bool:
        """Whether the adapter's output is still wanted."""
        return (
            self.listening
            and not self.ended
            and not self.parked
            and self.failure is None
            and self.verdict is None
        )

    @property
    def finished(self) -> bool:
        return self.verdict is not None

    # -- the adapter -------------------------------------------------------------------

    def start_failed(self, command: Sequence[str], exc: OSError) -> list[wire.Event]:
        """The adapter could not be started."""
        why = exc.strerror or exc
        return self._fail(
            "adapter_start_failed", f"adapter failed to start ({' '.join(command)}): {why}"
        )

    def output(self, items: Sequence[Line | Oversized]) -> Sequence[wire.Event]:
        """Lines the adapter printed (from ``LineFramer``), an ``Oversized`` maybe last.

        Each line becomes its event; an undecodable line an ``error`` event
        (a blank one nothing).  The first ``session.ended`` ends the reading
        (what follows it is dropped), preceded by the stop notice of a turn
        stopped by its deadline or a shutdown.  An oversized line ends it
        with an ``error``: the turn fails with ``event_too_large``.
        """
        if not self.reading:
            return []
        oversized = items[-1] if items and type(items[-1]) is Oversized else None
        lines = cast("Sequence[Line]", items[:-1] if oversized is not None else items)
        batch = wire.decode_lines(lines)
        events: Sequence[wire.Event]
        if batch is None or not _ROUTED.isdisjoint(batch.types):
            # Doubt, or one of them ends the turn or asks for an approval: line by line.
            events = self._decoded(lines)
            if not self.reading:
                return events
        else:
            events = batch
            self.emitted += len(events)
        if oversized is not None:
            limit = oversized.limit
            message = f"adapter printed an event line longer than {limit} bytes; adapter stopped"
            events = [*events, *self._fail("event_too_large", message)]
        return events

    def _decoded(self, lines: Sequence[Line]) -> list[wire.Event]:
        """``output``'s lines one by one: the events, what ends the turn acted on."""
        events: list[wire.Event] = []
        for line in lines:
            try:
                event = wire.decode_line(line)
            except wire.DecodeError as exc:
                if line.strip():
                    preview = line[:PREVIEW_BYTES].decode(errors="replace")
                    message = f"adapter printed an undecodable line ({exc}): {preview}"
                    events.append(wire.error_event(self.session_id, message))
                continue
            if self.may_wait and event.type == APPROVAL_REQUESTED:
                self.approval = event.data  # the server logs its own (``sessions._approvals``)
                continue
            if event.type == SESSION_ENDED:
                if self.approval is not None and event.data.get("reason") == "waiting":
                    self.parked = True
                    self.end_reason = "waiting"
                    self.emitted += len(events)
                    return events
                self.end_reason = event.end_reason or "completed"
                events.extend(self._ending(event))
                self.emitted += len(events)
                return events
            events.append(event)
        self.emitted += len(events)
        return events

    def nobody_listening(self) -> None:
        """The sink took no more events: reading stops, no crash is reported."""
        self.listening = False

    def exited(
        self, exit_code: int | None, *, stopped_by_server: bool, stderr_tail: bytes
    ) -> list[wire.Event]:
        """The adapter is gone (reaped): a crash gets its ``error``, with its stderr tail.

        A crash is an exit without ``session.ended`` and without an error
        already reported, while someone listens, not caused by the server.
        """
        crashed = self.end_reason is None and self.failure is None
        if not (crashed and self.listening and not stopped_by_server):
            return []
        message = crash_summary(exit_code)
        stderr = stderr_tail.decode(errors="replace").strip()
        if not stderr:
            message = f"{message} (no stderr output)"
        elif not self.stderr_to_client:
            message = f"{message}; its stderr is in the server log"
        else:
            message = f"{message}; stderr: {stderr}"
        return self._fail("adapter_exit", message, exitCode=exit_code)

    def run_finished(self) -> None:
        """The adapter's run is over (not cut short): its report now decides the status."""
        self.run_over = True

    # -- the turn ------------------------------------------------------------------------

    def stop(
        self, reason: StopReason, *, force: bool = False, message: str | None = None
    ) -> Action:
        """Stop the turn, keeping its stream (the first reason given wins, with ``message``
        for its ``session.ended``)."""
        if self.stop_reason is None:
            self.stop_reason = reason
            self.stop_message = message
        return Action.FORCE if force else Action.INTERRUPT

    def deadline_passed(self) -> Action:
        return self.stop("turn_timeout")

    def cancel(self, reason: StopReason) -> Action:
        """Stop the turn outright (the server is stopping): no more output is read."""
        if self.stop_reason is None:
            self.stop_reason = reason
        return Action.CANCEL

    def client_disconnected(self) -> Action:
        """The client that started the turn left: stop it unless ``onDisconnect`` says continue."""
        if self.on_disconnect == "cancel" and not self.finished:
            return self.stop("client_disconnected")
        return Action.NONE

    def failed(self, reason: RunnerFailure = "internal") -> None:
        """The turn's runner failed: the turn fails, ``internal`` (a bug) or ``store_error``
        (the store refused a write of its log).  The first reason given wins."""
        if not self.runner_failed:
            self.runner_failure = reason
        self.runner_failed = True

    def finish(self) -> list[wire.Event]:
        """The turn is over: the last events to log; sets ``verdict``.

        A failed runner that logged nothing logs an ``error``; a stopped turn
        whose adapter sent no ``session.ended`` gets one, ``cancelled``.
        """
        events: list[wire.Event] = []
        if self.runner_failed and self.emitted == 0:
            why = self.runner_failure
            extra = {} if why == "internal" else {"reason": why}
            events.append(wire.error_event(self.session_id, RUNNER_FAILURES[why], **extra))
        elif self.stop_reason is not None and not self.ended:  # a parked turn too
            data: dict[str, Any] = {"reason": "cancelled"}
            if self.stop_message is not None:
                data["message"] = self.stop_message
            elif self.stop_reason != "cancelled":
                data["message"] = self.stop_reason.replace("_", " ")
            events.extend(self._ending(wire.synthesize(SESSION_ENDED, self.session_id, data)))
        self.emitted += len(events)
        self.verdict = self._verdict()
        return events

    def _verdict(self) -> Verdict:
        if self.runner_failed:
            return Verdict(TurnStatus.FAILED, self.runner_failure)
        if self.run_over and self.failure is not None:
            return Verdict(TurnStatus.FAILED, self.failure)
        reason = self.end_reason if self.run_over else None
        if reason == "waiting" and self.parked and self.stop_reason is None:
            return Verdict(TurnStatus.WAITING, "approval")
        if reason == "completed":
            return Verdict(TurnStatus.COMPLETED, "completed")
        if reason == "cancelled" or self.stop_reason is not None:
            return Verdict(TurnStatus.CANCELLED, self.stop_reason or "cancelled")
        return Verdict(TurnStatus.FAILED, reason or "adapter_exit")

    # -- outputs -------------------------------------------------------------------------

    def _ending(self, end: wire.Event) -> list[wire.Event]:
        """``end`` (a ``session.ended``), after the stop notice if the turn has one."""
        self.ended = True
        notice = NOTICES.get(self.stop_reason or "")
        if notice is None:
            return [end]
        error = wire.error_event(
            self.session_id, notice.format(limit=self._limit), reason=self.stop_reason
        )
        return [error, end]

    def _fail(self, reason: FailReason, message: str, **extra: Any) -> list[wire.Event]:
        self.failure, self.error = reason, message
        self.emitted += 1
        return [wire.error_event(self.session_id, message, **extra)]
