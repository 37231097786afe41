"""The AG-UI face: ``POST /ag-ui``, a run of the agent as a stream of AG-UI events.

The request body is the protocol's ``RunAgentInput`` (validated with the
``ag-ui-protocol`` package's models); the answer is an SSE stream of AG-UI
events, each one of that package's models.  The mapping, through
``_faces`` onto an ordinary turn:

- ``threadId`` is a session: the session of that id if the caller's tenant
  has one, else the session the thread got on its first run (created then,
  and bound to the thread in the store like an idempotency key, for
  ``--idempotency-window``).
- ``runId`` is a turn, under an idempotency key made of the thread and the
  run: a run posted again (a client that lost its stream) runs nothing and
  streams that turn again, from its start or after ``Last-Event-ID``.
- The input is the text of the last ``user`` message (its text parts).
- Events (``AguiRun``): ``RUN_STARTED`` first (its ``metadata.trioserve``
  names the session and turn); assistant ``message`` events become
  ``TEXT_MESSAGE_START`` / ``_CONTENT`` / ``_END`` (streamed pieces,
  ``delta: true``, are one message, closed by the round's whole text or by
  any other event); ``tool.call`` becomes ``TOOL_CALL_START`` / ``_ARGS`` /
  ``_END`` and ``tool.result`` ``TOOL_CALL_RESULT``; every other event
  (``session.started``, ``error``, ``model.*``, ``session.ended``, a
  message without text) is a ``RAW`` event holding it, never dropped.  The
  run ends with ``RUN_FINISHED`` (outcome ``success``, or ``cancelled``)
  or ``RUN_ERROR`` (``code``: the turn's reason) from the turn's record; a
  turn that waits for an approval ends its run ``RUN_FINISHED`` with outcome
  ``interrupt`` (the approval as the interrupt: ``id`` the approval's,
  ``toolCallId``, ``expiresAt``), which the next run's ``resume`` answers
  (``_agui_resume``: no new turn, the rest of the waiting one).
- Each frame made from a logged event carries the event's ``seq`` as its
  SSE ``id``: one cursor with the v0.8 API.

The stream holds one of its tenant's stream slots; a client that leaves is a
client that left the turn (``onDisconnect``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, Final, cast

from ag_ui.core import (
    BaseEvent,
    Interrupt,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunFinishedSuccessOutcome,
    RunStartedEvent,
    TextPart,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    UserMessage,
)
from pydantic import ValidationError
from quart import Response, request
from quart_trio import QuartTrio

from trioserve.errors import Draining, InvalidRequest, SessionBusy
from trioserve.http import _agui_resume as resume
from trioserve.http import _faces as faces
from trioserve.http._approvals import decider
from trioserve.http._errors import key_digest, tenant
from trioserve.http._models import describe_validation_error
from trioserve.http._sse import SSEBody, sse_response
from trioserve.http._streams import StreamSlots
from trioserve.http._untrusted import parse_int, parse_json
from trioserve.protocol import APPROVAL_REQUESTED, MAX_SEQ, TURN_ID_HEADER, TurnStatus
from trioserve.sessions import SessionManager, Turn, TurnReplay, turn_protocol
from trioserve.stores.base import LoggedEvent

AGUI_PATH: Final = "/ag-ui"
#: The longest ``threadId`` and ``runId`` taken.
MAX_ID: Final = 1024
_SOURCE: Final = "trioserve"


#: The hot events' SSE frames, written from templates: each is byte for byte what the
#: package's model (``model_dump_json(by_alias=True)``) writes, which
#: tests/http/test_agui_frames.py checks for every template.
START_FRAME: Final = b'data: {"type":"TEXT_MESSAGE_START","messageId":%b,"role":"assistant"}\n\n'
CONTENT_FRAME: Final = b'data: {"type":"TEXT_MESSAGE_CONTENT","messageId":%b,"delta":%b}\n\n'
END_FRAME: Final = b'data: {"type":"TEXT_MESSAGE_END","messageId":%b}\n\n'
RAW_FRAME: Final = b'data: {"type":"RAW","event":%b,"source":"trioserve"}\n\n'
#: A whole message's three frames, the last with the event's seq.
WHOLE_FRAMES: Final = START_FRAME + CONTENT_FRAME + b"id: %d\n" + END_FRAME


class AguiRun:
    """One run's AG-UI events, made from its logged events (sans I/O).

    Each logged event is parsed once (``faces.event_object``); the frames of
    text messages and ``RAW`` events are written from templates (no model
    per event: these are nearly all of a long turn's frames), the rest from
    the package's models.
    """

    def __init__(self, thread_id: str, run_id: str, session_id: str, turn_id: str) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.session_id = session_id
        self.turn_id = turn_id
        self.started = False
        self.last_seq = 0
        self._open: bytes | None = None  # the streamed text message being sent: its JSON id
        self.approval: dict[str, Any] | None = None  # the last approval.requested's data
        # A message's id is the turn's and the event's seq: its JSON, without the last quote.
        self._id_head = faces.json_string(turn_id)[:-1]

    def frames(self, batch: list[LoggedEvent]) -> bytes:
        """The SSE frames of ``batch``: its events' AG-UI events (``RUN_STARTED`` first);
        the last frame of each logged event carries its ``seq`` as the SSE ``id``."""
        chunks = [self.start()]
        for event in batch:
            chunks.append(self.translate(event))
        if batch:
            self.last_seq = batch[-1].seq
        return b"".join(chunks)

    def finish(self, status: TurnStatus | None, reason: str | None) -> bytes:
        """The last frames: the message still open closed, then how the run ended."""
        frames = self._close_message()
        result = {
            "sessionId": self.session_id,
            "turnId": self.turn_id,
            "status": None if status is None else status.value,
            "reason": reason,
            "lastSeq": self.last_seq,
        }
        made: BaseEvent
        if status is TurnStatus.COMPLETED:
            made = self._finished(result, RunFinishedSuccessOutcome())
        elif status is TurnStatus.CANCELLED:
            made = self._finished(result, RunFinishedCancelledOutcome())
        elif status is TurnStatus.WAITING and self.approval is not None:
            made = self._finished(result, RunFinishedInterruptOutcome(interrupts=[self._ask()]))
        else:
            message = f"the turn ended {result['status'] or 'without a record'} ({reason})"
            made = RunErrorEvent(message=message, code=reason or "internal")
        return self.start() + b"".join(frames) + _encode(made)

    def translate(self, event: LoggedEvent) -> bytes:
        """The SSE frames of one logged event's AG-UI events, the last with its ``seq``."""
        value = faces.event_object(event)
        data = value.get("data")
        if not isinstance(data, dict):
            data = {}
        if event.type == APPROVAL_REQUESTED:
            self.approval = data
        if event.type == "message":
            found = faces.message_text(data)
            if found is not None:
                text, delta = found
                if text and delta and self._open is not None:  # the next streamed piece
                    return b"id: %d\n%b" % (
                        event.seq,
                        CONTENT_FRAME % (self._open, faces.json_string(text)),
                    )
                if text and not delta and self._open is None:  # a whole message
                    message_id = b'%b.%d"' % (self._id_head, event.seq)
                    return WHOLE_FRAMES % (
                        message_id,
                        message_id,
                        faces.json_string(text),
                        event.seq,
                        message_id,
                    )
                made = self._message(event, text, delta, final=_flag(data, "final"))
            else:
                made = [*self._close_message(), RAW_FRAME % faces.event_json(event)]
        elif event.type == "tool.call" and _ids(data, "callId", "toolName"):
            made = self._tool_call(data)
        elif event.type == "tool.result" and _ids(data, "callId"):
            result = ToolCallResultEvent(
                message_id=f"{self.turn_id}.{event.seq}",
                tool_call_id=data["callId"],
                content=_text(data.get("content")),
                role="tool",
            )
            made = [*self._close_message(), _encode(result)]
        else:
            made = [*self._close_message(), RAW_FRAME % faces.event_json(event)]
        if not made:
            return b""
        made[-1] = b"id: %d\n%b" % (event.seq, made[-1])
        return b"".join(made)

    def _message(self, event: LoggedEvent, text: str, delta: bool, *, final: bool) -> list[bytes]:
        if delta:
            made = []
            if self._open is None:
                self._open = b'%b.%d"' % (self._id_head, event.seq)
                made.append(START_FRAME % self._open)
            if text:
                made.append(CONTENT_FRAME % (self._open, faces.json_string(text)))
            return made
        if self._open is not None and final:
            return self._close_message()  # the round's whole text, already streamed
        made = self._close_message()
        message_id = b'%b.%d"' % (self._id_head, event.seq)
        made.append(START_FRAME % message_id)
        if text:
            made.append(CONTENT_FRAME % (message_id, faces.json_string(text)))
        made.append(END_FRAME % message_id)
        return made

    def _tool_call(self, data: dict[str, Any]) -> list[bytes]:
        call_id = data["callId"]
        args = data.get("args")
        made: list[BaseEvent] = [
            ToolCallStartEvent(tool_call_id=call_id, tool_call_name=data["toolName"]),
            ToolCallArgsEvent(tool_call_id=call_id, delta=_text(args if args is not None else {})),
            ToolCallEndEvent(tool_call_id=call_id),
        ]
        return [*self._close_message(), *map(_encode, made)]

    def _close_message(self) -> list[bytes]:
        if self._open is None:
            return []
        message_id, self._open = self._open, None
        return [END_FRAME % message_id]

    def start(self) -> bytes:
        """``RUN_STARTED``, the first time (then nothing)."""
        if self.started:
            return b""
        self.started = True
        trioserve = {"sessionId": self.session_id, "turnId": self.turn_id}
        started = RunStartedEvent(
            thread_id=self.thread_id, run_id=self.run_id, metadata={"trioserve": trioserve}
        )
        return _encode(started)

    def _ask(self) -> Interrupt:
        """The waiting approval as AG-UI's interrupt."""
        data = self.approval or {}
        tool = data.get("tool")
        return Interrupt(
            id=str(data.get("approvalId")),
            reason="approval",
            message=f"approve the call of {tool}?",
            tool_call_id=data.get("callId") or None,
            expires_at=data.get("expiresAt"),
            metadata={"tool": tool, "arguments": data.get("arguments")},
        )

    def _finished(self, result: dict[str, Any], outcome: Any) -> RunFinishedEvent:
        return RunFinishedEvent(
            thread_id=self.thread_id, run_id=self.run_id, result=result, outcome=outcome
        )


def _encode(event: BaseEvent) -> bytes:
    """The SSE frame of one event made with the package's model."""
    return b"data: %b\n\n" % event.model_dump_json(by_alias=True).encode()


def _flag(data: dict[str, Any], name: str) -> bool:
    return data.get(name) is True


def _ids(data: dict[str, Any], *names: str) -> bool:
    return all(isinstance(data.get(n), str) for n in names)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def run_input(raw: bytes) -> RunAgentInput:
    """The request body as a ``RunAgentInput``; ``InvalidRequest`` naming what is wrong."""
    value = parse_json(raw, "request body")
    if not isinstance(value, dict):
        raise InvalidRequest("request body: expected a RunAgentInput object")
    try:
        run = RunAgentInput.model_validate(value)
    except ValidationError as exc:
        raise InvalidRequest(describe_validation_error(exc, "RunAgentInput")) from None
    for name, given in (("threadId", run.thread_id), ("runId", run.run_id)):
        if not 1 <= len(given) <= MAX_ID:
            raise InvalidRequest(f"{name}: expected 1 to {MAX_ID} characters, got {len(given)}")
    return run


def user_text(run: RunAgentInput) -> str:
    """The input of the run: the text of the last ``user`` message ("" if there is none)."""
    for message in reversed(run.messages):
        if not isinstance(message, UserMessage):
            continue
        if isinstance(message.content, str):
            return message.content
        return "".join(part.text for part in message.content if isinstance(part, TextPart))
    return ""


def install(app: QuartTrio, manager: SessionManager, streams: StreamSlots, idle: float) -> None:
    """Serve ``POST /ag-ui`` on ``app``."""

    @app.post(AGUI_PATH)
    async def ag_ui_run() -> Response:
        if manager.draining:
            raise Draining("server is draining; not accepting new runs")
        data = await request.get_data(parse_form_data=False)
        run = run_input(data if isinstance(data, bytes) else data.encode())
        text = user_text(run)
        header = request.headers.get("Last-Event-ID", "").strip()
        after = parse_int("Last-Event-ID", header, maximum=MAX_SEQ) if header else 0
        who = tenant()
        slot = streams.take(who, key_digest())
        try:
            session_id = await faces.named_session(manager, "ag-ui.thread", run.thread_id, who)
            closers: tuple[Callable[[], None], ...] = (slot.release,)
            turn: Turn | TurnReplay | None = None
            if run.resume:  # it answers the interrupt of the thread's waiting turn
                turn_id, seen = await resume.answer(manager, session_id, run, who, decider())
                seen = after or seen  # what the client says it saw, else all before the answer
                batches = resume.until_next_wait(
                    manager,
                    session_id,
                    await manager.events(session_id, seen, turn_id=turn_id, idle=idle, tenant=who),
                )
            else:
                key = faces.face_key("ag-ui.run", run.thread_id, run.run_id)
                with turn_protocol("ag-ui"):
                    started = await manager.keyed.start_turn(
                        key, session_id, text, tenant=who, multitask="reject"
                    )
                if not isinstance(started, Turn | TurnReplay):  # reject never queues
                    raise SessionBusy(f"session {session_id} already has a turn in flight")
                turn = started
                if isinstance(turn, TurnReplay):
                    turn_id = turn.turn_id
                    batches = await manager.events(
                        session_id, after, turn_id=turn_id, idle=idle, tenant=who
                    )
                else:
                    turn_id = turn.id
                    batches = until_parked(turn, manager.turn_events(turn, idle=idle))
                    closers = (turn.client_left, slot.release)
        except BaseException:
            slot.release()
            raise
        events = AguiRun(run.thread_id, run.run_id, session_id, turn_id)

        async def coda() -> bytes:
            if isinstance(turn, Turn) and turn.end is not None:
                return events.finish(turn.end.status, turn.end.reason)
            record = await manager.get_turn(session_id, events.turn_id, who)
            return events.finish(record.status, record.reason)

        body = SSEBody(batches, *closers, frames=events.frames, prelude=events.start(), coda=coda)
        slot.closer = body.end
        return sse_response(body, {TURN_ID_HEADER: events.turn_id})


async def until_parked(
    turn: Turn, batches: AsyncIterator[list[LoggedEvent]]
) -> AsyncIterator[list[LoggedEvent]]:
    """The turn's batches up to its end, or until it waits for an approval (its run is then
    over: the run ends ``interrupt``; the turn goes on once decided)."""
    async with contextlib.aclosing(cast(AsyncGenerator[list[LoggedEvent], None], batches)):
        async for batch in batches:
            yield batch
            if any(event.type == APPROVAL_REQUESTED for event in batch):
                await turn.feed.until_finished()  # parked once its run has released it
                if turn.end is not None and turn.end.status is TurnStatus.WAITING:
                    return
