"""The A2A face: the agent card and A2A's JSON-RPC binding (``POST /a2a``), version 1.0.

The ``a2a-sdk`` package's server runs on asyncio, so only its types are
used (the protobuf messages of ``a2a.types``, written and read as
ProtoJSON); the binding is served here, over the session manager, as
``_a2a_tasks`` maps it.  Methods: ``SendMessage`` (blocking, or
``returnImmediately``), ``SendStreamingMessage`` and ``SubscribeToTask``
(SSE: one JSON-RPC response per frame, the frames made from logged events
with their ``seq`` as ``id``; ``Last-Event-ID`` resumes a subscription
after it), ``GetTask``, ``ListTasks``, ``CancelTask``, and the push
notification configs (``_a2a_push``: a task's configs are its turn's
webhooks).  The extended card is ``ExtendedAgentCardNotConfiguredError``.
A follow-up message to an ``input-required`` task decides its approval
(``_a2a_answer``) instead of starting a turn.

Errors are JSON-RPC errors with A2A's codes (task not found ``-32001``, not
cancelable ``-32002``, unsupported ``-32004``, invalid params ``-32602``,
...), answered ``200``; a refusal of the session manager (a turn in
flight, a cap, draining) is ``-32000`` with its reason.  The guard's
refusals (``Host``, the API key) stay HTTP ones.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any, Final

import trio
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    CancelTaskRequest,
    GetTaskRequest,
    HTTPAuthSecurityScheme,
    ListTasksRequest,
    ListTasksResponse,
    SecurityRequirement,
    SecurityScheme,
    SendMessageRequest,
    SendMessageResponse,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
)
from quart import Response, request
from quart_trio import QuartTrio

from trioserve import __version__
from trioserve.errors import InvalidRequest, NotFound, TrioserveError
from trioserve.http import _a2a_answer as answers
from trioserve.http import _a2a_push as push
from trioserve.http import _a2a_tasks as tasks
from trioserve.http import _faces as faces
from trioserve.http._a2a_rpc import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    NO_EXTENDED_CARD,
    NOT_CANCELABLE,
    PARSE_ERROR,
    REFUSED,
    TASK_NOT_FOUND,
    UNSUPPORTED,
    RpcError,
)
from trioserve.http._a2a_rpc import parse_params as _params
from trioserve.http._a2a_rpc import task_ref as _task_ref
from trioserve.http._approvals import decider
from trioserve.http._errors import key_digest, tenant
from trioserve.http._sse import SSEBody, sse_response
from trioserve.http._streams import StreamSlots
from trioserve.http._untrusted import parse_int, parse_json
from trioserve.protocol import APPROVAL_REQUESTED, MAX_SEQ, TurnStatus
from trioserve.sessions import SessionManager, Turn
from trioserve.stores.base import LoggedEvent, TurnRecord

A2A_PATH: Final = "/a2a"
CARD_PATH: Final = "/.well-known/agent-card.json"
PROTOCOL_VERSION: Final = "1.0"
MAX_ID: Final = 1024
MAX_PAGE: Final = 100

_dumps = tasks.dumps
_proto = tasks.proto_dict


def rpc_answer(rid: Any, result: Any = None, error: RpcError | None = None) -> Response:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": rid}
    if error is None:
        body["result"] = result
    else:
        body["error"] = {"code": error.code, "message": error.message}
    return Response(_dumps(body) + b"\n", status=200, content_type="application/json")


@dataclass(frozen=True)
class Answered:
    """A waiting task answered (``_a2a_answer``): its turn goes on, from its log after
    seq ``after``."""

    session_id: str
    turn_id: str
    after: int


class A2AFace:
    """The JSON-RPC methods, over one manager."""

    def __init__(self, manager: SessionManager, streams: StreamSlots, idle: float) -> None:
        self.manager = manager
        self.streams = streams
        self.idle = idle
        self.push = push.PushConfigs(manager)

    async def record(self, session_id: str, turn_id: str, who: str | None) -> TurnRecord:
        try:
            return await self.manager.get_turn(session_id, turn_id, who)
        except NotFound:
            raise RpcError(
                TASK_NOT_FOUND, f"task {tasks.task_id(session_id, turn_id)} not found"
            ) from None

    async def view(
        self, record: TurnRecord, who: str | None, up_to: int = MAX_SEQ
    ) -> tasks.TaskView:
        """The task of ``record`` with its logged events (up to seq ``up_to``) read in."""
        view = tasks.TaskView(record)
        batches = await self.manager.export(record.session_id, turn_id=record.id, tenant=who)
        async for batch in batches:
            for event in batch:
                if event.seq <= up_to:
                    view.take(event)
        return view

    async def send(self, params: Any, who: str | None) -> tuple[tasks.TaskView, Turn | Answered]:
        """Start the turn of a ``SendMessage``; its task, as started, and the turn (or a
        waiting task answered: its approval decided, the task as it goes on)."""
        req: SendMessageRequest = _params(params, SendMessageRequest())
        if not req.HasField("message"):
            raise RpcError(INVALID_PARAMS, "params.message: required")
        message = req.message
        webhook = None
        if req.configuration.HasField("task_push_notification_config"):
            config = req.configuration.task_push_notification_config
            webhook = await push.check(self.manager, config, push.IN_SEND)
        if message.task_id:  # a follow-up of a task: its answer, or a new turn of its session
            session_id, turn_id = _task_ref(message.task_id)
            record = await self.record(session_id, turn_id, who)
            answer = answers.answer_of(message)
            if answer is not None or record.status is TurnStatus.WAITING:
                if answer is not None:
                    record = await answers.parked(self.manager, record, who)
                if record.status is TurnStatus.WAITING:
                    return await self.answer(record, answer, who)
                if answer is not None and answer.explicit:
                    raise RpcError(
                        INVALID_PARAMS,
                        f"params.message.taskId: task {message.task_id} is"
                        f" {record.status.value}, not input-required",
                    )
        elif message.context_id:
            if len(message.context_id) > MAX_ID:
                raise RpcError(INVALID_PARAMS, f"params.message.contextId: over {MAX_ID} chars")
            session_id = await faces.named_session(
                self.manager, "a2a.context", message.context_id, who
            )
        else:
            session_id = (await self.manager.create_session(tenant=who)).id
        try:
            turn = await faces.start_turn(
                self.manager,
                tasks.user_text(message),
                protocol="a2a",
                session_id=session_id,
                tenant=who,
                on_disconnect="continue",
                webhook=webhook,
            )
        except InvalidRequest as exc:
            if webhook is None or not exc.message.startswith("webhook:"):
                raise
            raise push.refused(exc, push.IN_SEND) from None
        return tasks.TaskView(turn.record), turn

    async def answer(
        self, record: TurnRecord, answer: answers.Answer | None, who: str | None
    ) -> tuple[tasks.TaskView, Answered]:
        """Decide the approval the task of ``record`` waits for; the task, going on."""
        task = tasks.task_id(record.session_id, record.id)
        if answer is None:
            raise RpcError(
                INVALID_PARAMS,
                f"params.message.parts: task {task} is input-required: answer with a data part"
                ' {"approvalId", "decision": "approve" | "deny"} or the text yes or no',
            )
        view = await self.view(record, who)
        after = view.reply.last_seq
        await answers.decide(self.manager, record, answer, who, decider())
        view.record = await self.record(record.session_id, record.id, who)
        if view.record.status is TurnStatus.WAITING:  # decided; it goes on once a slot frees
            view.record = replace(view.record, status=TurnStatus.RUNNING)
        return view, Answered(record.session_id, record.id, after)

    async def batches(
        self, turn: Turn | Answered, who: str | None, idle: float = math.inf
    ) -> AsyncIterator[list[LoggedEvent]]:
        """The events of a started turn, or of an answered task after its answer."""
        if isinstance(turn, Turn):
            return self.manager.turn_events(turn, idle=idle)
        return await self.manager.events(
            turn.session_id, turn.after, turn_id=turn.turn_id, idle=idle, tenant=who
        )

    async def send_blocking(self, params: Any, who: str | None) -> dict[str, Any]:
        req: SendMessageRequest = _params(params, SendMessageRequest())
        view, turn = await self.send(params, who)
        if not req.configuration.return_immediately:
            # To its end, or until it waits for an approval (input-required: interrupted).
            session_id = view.context_id
            with trio.CancelScope() as until_parked:
                async for batch in await self.batches(turn, who):
                    for event in batch:
                        view.take(event)
                    if any(event.type == APPROVAL_REQUESTED for event in batch):
                        live = turn if isinstance(turn, Turn) else None
                        live = live or self.manager.running_turn(session_id)
                        if live is not None:
                            await live.feed.until_finished()  # parked once released
                        until_parked.cancel()
            view.record = await self.record(session_id, view.record.id, who)
        return _proto(SendMessageResponse(task=view.task()))

    async def get(self, params: Any, who: str | None) -> dict[str, Any]:
        req: GetTaskRequest = _params(params, GetTaskRequest())
        record = await self.record(*_task_ref(req.id), who)
        return _proto((await self.view(record, who)).task())

    async def cancel(self, params: Any, who: str | None) -> dict[str, Any]:
        req: CancelTaskRequest = _params(params, CancelTaskRequest())
        session_id, turn_id = _task_ref(req.id)
        record = await self.record(session_id, turn_id, who)
        if record.status not in (TurnStatus.RUNNING, TurnStatus.WAITING):
            raise RpcError(NOT_CANCELABLE, f"task {req.id} is {record.status.value}")
        await self.manager.cancel_turn(session_id, who)
        # Answer with the task as it ended: wait for its log to end (the stop grace, at most).
        with trio.move_on_after(self.manager.limits.adapter_stop_grace + 10):
            batches = await self.manager.events(session_id, turn_id=turn_id, tenant=who)
            async for _ in batches:
                pass
        record = await self.record(session_id, turn_id, who)
        return _proto((await self.view(record, who)).task())

    async def list_tasks(self, params: Any, who: str | None) -> dict[str, Any]:
        req: ListTasksRequest = _params(params, ListTasksRequest())
        size = min(req.page_size or 50, MAX_PAGE)
        if req.context_id:
            try:
                sessions = [await self.manager.get_session(req.context_id, who)]
            except NotFound:
                sessions = []
        else:
            sessions = (await self.manager.list_sessions(limit=size, tenant=who)).sessions
        found: list[Task] = []
        for session in sessions:
            for record in reversed(await self.manager.list_turns(session.id, who)):
                view = tasks.TaskView(record)
                if req.status and view.state() != req.status:
                    continue
                if req.include_artifacts:
                    view = await self.view(record, who)
                found.append(view.task(history=False, artifacts=req.include_artifacts))
                if len(found) == size:
                    break
            if len(found) == size:
                break
        answer = ListTasksResponse(tasks=found, page_size=size, total_size=len(found))
        return _proto(answer)

    def stream(
        self,
        rid: Any,
        view: tasks.TaskView,
        batches: AsyncIterator[list[LoggedEvent]],
        who: str | None,
        *on_close: Callable[[], None],
    ) -> SSEBody:
        """An SSE body: the task first, then a response per event, then the final status."""
        writer = tasks.TaskStream(view, rid)

        async def coda() -> bytes:
            record = await self.record(view.context_id, view.record.id, who)
            return writer.frame(view.final(record), None)

        first = writer.frame(StreamResponse(task=view.task()), None)
        return SSEBody(batches, *on_close, frames=writer.frames, prelude=first, coda=coda)


def agent_card(manager: SessionManager, url: str, *, auth: bool) -> AgentCard:
    """The card, from the spec: no env values, paths or secrets."""
    metadata = manager.spec.metadata
    description = metadata.description or f"The agent {metadata.name!r}, served by trioserve."
    card = AgentCard(
        name=metadata.name,
        description=description,
        version=__version__,
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version=PROTOCOL_VERSION)
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=push.enabled(manager)),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain", "application/json"],
        skills=[
            AgentSkill(
                id=metadata.name,
                name=metadata.name,
                description=description,
                tags=["agent", manager.spec.runtime.type],
            )
        ],
    )
    if auth:
        card.security_schemes["bearer"].CopyFrom(
            SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="Bearer", description="An API key of the server's --api-keys."
                )
            )
        )
        requirement = SecurityRequirement()
        requirement.schemes["bearer"].SetInParent()
        card.security_requirements.append(requirement)
    return card


def install(
    app: QuartTrio, manager: SessionManager, streams: StreamSlots, idle: float, *, auth: bool
) -> None:
    """Serve the card and ``POST /a2a`` on ``app``."""
    face = A2AFace(manager, streams, idle)

    @app.get(CARD_PATH)
    async def a2a_card() -> Response:
        url = request.host_url.rstrip("/") + A2A_PATH
        body = _dumps(_proto(agent_card(manager, url, auth=auth))) + b"\n"
        return Response(body, content_type="application/json")

    @app.post(A2A_PATH)
    async def a2a_rpc() -> Response:
        data = await request.get_data(parse_form_data=False)
        rid: Any = None
        try:
            try:
                value = parse_json(data if isinstance(data, bytes) else data.encode(), "request")
            except TrioserveError as exc:
                raise RpcError(PARSE_ERROR, exc.message) from None
            rid, method, params = _envelope(value)
            return await _dispatch(face, rid, method, params)
        except RpcError as exc:
            return rpc_answer(rid, error=exc)
        except NotFound as exc:
            return rpc_answer(rid, error=RpcError(TASK_NOT_FOUND, exc.message))
        except InvalidRequest as exc:
            return rpc_answer(rid, error=RpcError(INVALID_PARAMS, exc.message))
        except TrioserveError as exc:
            return rpc_answer(rid, error=RpcError(REFUSED, f"{exc.reason}: {exc.message}"))


def _envelope(value: Any) -> tuple[Any, str, Any]:
    if not isinstance(value, dict):
        raise RpcError(INVALID_REQUEST, "expected a JSON-RPC 2.0 request object")
    rid = value.get("id")
    if not (rid is None or (isinstance(rid, str | int) and not isinstance(rid, bool))):
        raise RpcError(INVALID_REQUEST, "id: expected a string, a number or null")
    if (isinstance(rid, str) and len(rid) > MAX_ID) or (isinstance(rid, int) and abs(rid) > 2**63):
        raise RpcError(INVALID_REQUEST, f"id: longer than {MAX_ID}")
    if value.get("jsonrpc") != "2.0":
        raise RpcError(INVALID_REQUEST, 'jsonrpc: expected "2.0"')
    method = value.get("method")
    if not isinstance(method, str):
        raise RpcError(INVALID_REQUEST, "method: expected a string")
    return rid, method, value.get("params")


async def _dispatch(face: A2AFace, rid: Any, method: str, params: Any) -> Response:
    who = tenant()
    if method == "SendMessage":
        return rpc_answer(rid, await face.send_blocking(params, who))
    if method == "GetTask":
        return rpc_answer(rid, await face.get(params, who))
    if method == "ListTasks":
        return rpc_answer(rid, await face.list_tasks(params, who))
    if method == "CancelTask":
        return rpc_answer(rid, await face.cancel(params, who))
    if method in ("SendStreamingMessage", "SubscribeToTask"):
        return await _streamed(face, rid, method, params, who)
    if method in push.METHODS:
        return rpc_answer(rid, await face.push.call(method, params, who))
    if method == "GetExtendedAgentCard":
        raise RpcError(NO_EXTENDED_CARD, "this agent has no extended card")
    raise RpcError(METHOD_NOT_FOUND, f"method {method[:100]!r} not found")


async def _streamed(face: A2AFace, rid: Any, method: str, params: Any, who: str | None) -> Response:
    slot = face.streams.take(who, key_digest())
    try:
        if method == "SendStreamingMessage":
            view, turn = await face.send(params, who)
            batches = await face.batches(turn, who, face.idle)
        else:
            req: SubscribeToTaskRequest = _params(params, SubscribeToTaskRequest())
            record = await face.record(*_task_ref(req.id), who)
            if record.status not in (TurnStatus.RUNNING, TurnStatus.WAITING):
                raise RpcError(UNSUPPORTED, f"task {req.id} is {record.status.value}: terminal")
            header = request.headers.get("Last-Event-ID", "").strip()
            after = parse_int("Last-Event-ID", header, maximum=MAX_SEQ) if header else None
            view = await face.view(record, who, MAX_SEQ if after is None else after)
            cursor = view.reply.last_seq if after is None else after
            batches = await face.manager.events(
                record.session_id, cursor, turn_id=record.id, idle=face.idle, tenant=who
            )
    except BaseException:
        slot.release()
        raise
    body = face.stream(rid, view, batches, who, slot.release)
    slot.closer = body.end
    return sse_response(body)
