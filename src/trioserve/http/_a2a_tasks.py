"""A2A's shapes made from trioserve's: tasks from turns, stream responses from logged events.

Sans I/O: everything here takes records and events and returns the
``a2a-sdk`` package's protobuf messages (``a2a.types.a2a_pb2``), which the
face (``_a2a.py``) writes as ProtoJSON.  The mapping (docs/protocols.md):

- a task is a turn; its id names the session and the turn (``task_id``):
  ``<sessionId>.<turnId>``, so any replica finds it from the id alone;
- the context is the session;
- a turn's status is the task's state (``running`` working, ``waiting`` for
  an approval input-required, ``completed`` completed, ``cancelled``
  canceled, ``failed`` and ``interrupted`` failed); its ``approval.requested``
  is a status update in state input-required (the approval as a data part:
  decide it with ``POST …/approvals/{approvalId}``);
- assistant ``message`` events are the agent's reply: the ``reply``
  artifact's parts (each streamed piece appended, its ``seq`` in the
  update's metadata) and, once the turn ends, the agent's message in the
  history and in the final status;
- every other event (``tool.*``, ``session.started``, ``error``, ...) is a
  status update (state working) whose message holds the event as a data
  part: none is dropped.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from a2a.types.a2a_pb2 import (
    Artifact,
    Message,
    Part,
    Role,
    StreamResponse,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from google.protobuf import json_format
from google.protobuf.message import Message as Proto
from google.protobuf.struct_pb2 import Struct, Value

from trioserve.http import _faces as faces
from trioserve.protocol import APPROVAL_REQUESTED, TurnStatus
from trioserve.stores.base import LoggedEvent, TurnRecord

#: The artifact a task's reply text is.
REPLY: Final = "reply"
_TASK_ID: Final = re.compile(r"(s_[0-9a-z]{1,64})\.(t_[0-9a-z]{1,64})")

STATE_OF: Final[dict[TurnStatus, int]] = {
    TurnStatus.RUNNING: TaskState.TASK_STATE_WORKING,
    TurnStatus.WAITING: TaskState.TASK_STATE_INPUT_REQUIRED,
    TurnStatus.COMPLETED: TaskState.TASK_STATE_COMPLETED,
    TurnStatus.CANCELLED: TaskState.TASK_STATE_CANCELED,
    TurnStatus.FAILED: TaskState.TASK_STATE_FAILED,
    TurnStatus.INTERRUPTED: TaskState.TASK_STATE_FAILED,
}
TERMINAL: Final = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_REJECTED,
    }
)


def task_id(session_id: str, turn_id: str) -> str:
    return f"{session_id}.{turn_id}"


def parse_task_id(value: str) -> tuple[str, str] | None:
    """The session and turn a task id names (``None``: not a task id of this server)."""
    match = _TASK_ID.fullmatch(value)
    return None if match is None else (match.group(1), match.group(2))


def text_message(role: int, text: str, *, context_id: str, task: str, message_id: str) -> Message:
    return Message(
        message_id=message_id,
        context_id=context_id,
        task_id=task,
        role=role,  # type: ignore[arg-type]
        parts=[Part(text=text)],
    )


def user_text(message: Message) -> str:
    """A message's input: its text parts joined."""
    return "".join(part.text for part in message.parts if part.HasField("text"))


def event_part(value: dict[str, Any]) -> Part:
    """A logged event as a data part."""
    data = Value()
    data.struct_value.update(value)
    return Part(data=data, media_type="application/json")


class TaskView:
    """One task (a turn) as A2A shows it, fed with the turn's logged events."""

    def __init__(self, record: TurnRecord) -> None:
        self.record = record
        self.context_id = record.session_id
        self.id = task_id(record.session_id, record.id)
        self.reply = faces.Reply()
        self.pieces = 0  # artifact updates sent
        self.asked: dict[str, Any] | None = None  # the last approval.requested, as JSON

    def take(self, event: LoggedEvent) -> str | dict[str, Any] | None:
        """Read one logged event: the text of a reply piece to send, or the event's JSON
        object for a status update, or ``None`` (nothing to send)."""
        value = faces.event_object(event)
        self.reply.add(event, value)
        if event.type == APPROVAL_REQUESTED:
            self.asked = value
        if event.type == "message":
            found = faces.message_text(value.get("data"))
            if found is not None:
                text, delta = found
                if not delta and self.reply.pieces:
                    return None  # the round's whole text, already sent in pieces
                return text
        return value

    def add(self, event: LoggedEvent) -> StreamResponse | None:
        """The stream response of one logged event (``None``: nothing to send)."""
        taken = self.take(event)
        if taken is None:
            return None
        if isinstance(taken, str):
            return self.piece(taken, event.seq)
        return self.working(taken)

    def piece(self, text: str, seq: int) -> StreamResponse:
        """A reply piece's artifact update (appended to the reply after the first)."""
        metadata = Struct()
        metadata.update({"seq": seq})
        update = TaskArtifactUpdateEvent(
            metadata=metadata,
            task_id=self.id,
            context_id=self.context_id,
            artifact=Artifact(artifact_id=REPLY, name=REPLY, parts=[Part(text=text)]),
            append=self.pieces > 0,
            last_chunk=False,
        )
        self.pieces += 1
        return StreamResponse(artifact_update=update)

    def working(self, value: dict[str, Any]) -> StreamResponse:
        message = Message(
            message_id=f"{self.record.id}.{value.get('seq', 0)}",
            context_id=self.context_id,
            task_id=self.id,
            role=Role.ROLE_AGENT,
            parts=[event_part(value)],
        )
        state = TaskState.TASK_STATE_WORKING
        if value.get("type") == APPROVAL_REQUESTED:  # a person must decide: input-required
            state = TaskState.TASK_STATE_INPUT_REQUIRED
        status = TaskStatus(state=state, message=message)
        update = TaskStatusUpdateEvent(task_id=self.id, context_id=self.context_id, status=status)
        return StreamResponse(status_update=update)

    def final(self, record: TurnRecord) -> StreamResponse:
        """The last stream response: the task's end, with the agent's reply as its message."""
        self.record = record
        status = self.status()
        update = TaskStatusUpdateEvent(task_id=self.id, context_id=self.context_id, status=status)
        return StreamResponse(status_update=update)

    def state(self) -> int:
        return STATE_OF.get(self.record.status, TaskState.TASK_STATE_FAILED)

    def status(self) -> TaskStatus:
        state = self.state()
        status = TaskStatus(state=state)  # type: ignore[arg-type]
        status.timestamp.FromDatetime(self.record.ended_at or self.record.created_at)
        if state in TERMINAL:
            status.message.CopyFrom(self._agent_message())
        elif state == TaskState.TASK_STATE_INPUT_REQUIRED and self.asked is not None:
            status.message.CopyFrom(self.working(self.asked).status_update.status.message)
        return status

    def _agent_message(self) -> Message:
        message = text_message(
            Role.ROLE_AGENT,
            self.reply.text,
            context_id=self.context_id,
            task=self.id,
            message_id=f"{self.record.id}.reply",
        )
        if self.record.reason:
            metadata = Struct()
            metadata.update({"reason": self.record.reason, "lastSeq": self.reply.last_seq})
            message.metadata.CopyFrom(metadata)
        return message

    def task(self, *, history: bool = True, artifacts: bool = True) -> Task:
        """The task as it stands."""
        task = Task(id=self.id, context_id=self.context_id, status=self.status())
        if history:
            task.history.append(
                text_message(
                    Role.ROLE_USER,
                    self.record.input,
                    context_id=self.context_id,
                    task=self.id,
                    message_id=f"{self.record.id}.input",
                )
            )
            if self.state() in TERMINAL:
                task.history.append(self._agent_message())
        if artifacts and self.reply.text:
            task.artifacts.append(
                Artifact(artifact_id=REPLY, name=REPLY, parts=[Part(text=self.reply.text)])
            )
        return task


def dumps(value: Any) -> bytes:
    """Compact JSON, UTF-8."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def proto_dict(message: Proto) -> dict[str, Any]:
    """A protobuf message as its ProtoJSON object."""
    value: dict[str, Any] = json_format.MessageToDict(message)
    return value


class TaskStream:
    """A task's SSE frames: one JSON-RPC response (of request ``rid``) per frame.

    The reply's pieces, nearly all of a long turn's frames, are written from
    a template: the ProtoJSON ``MessageToDict`` writes of ``TaskView.piece``'s
    message, with the ``seq`` an integer (tests/http/test_a2a_frames.py
    checks it against the package's messages); the rest through the
    messages.
    """

    def __init__(self, view: TaskView, rid: Any) -> None:
        self.view = view
        self._head = b'data: {"jsonrpc":"2.0","id":%b,"result":' % dumps(rid)
        self._piece = b'{"artifactUpdate":{"taskId":%b,"contextId":%b,%b' % (
            faces.json_string(view.id),
            faces.json_string(view.context_id),
            b'"artifact":{"artifactId":"reply","name":"reply","parts":[{"text":',
        )

    def frame(self, result: StreamResponse, seq: int | None) -> bytes:
        """The frame of one stream response (``seq``: its SSE ``id``)."""
        head = b"" if seq is None else b"id: %d\n" % seq
        return head + self._head + dumps(proto_dict(result)) + b"}\n\n"

    def frames(self, batch: list[LoggedEvent]) -> bytes:
        """The frames of a batch of logged events."""
        chunks = []
        view = self.view
        for event in batch:
            taken = view.take(event)
            if taken is None:
                continue
            if isinstance(taken, str):
                append = b'"append":true,' if view.pieces else b""
                view.pieces += 1
                chunks.append(
                    b'id: %d\n%b%b%b}]},%b"metadata":{"seq":%d}}}}\n\n'
                    % (
                        event.seq,
                        self._head,
                        self._piece,
                        faces.json_string(taken),
                        append,
                        event.seq,
                    )
                )
            else:
                chunks.append(self.frame(view.working(taken), event.seq))
        return b"".join(chunks)
