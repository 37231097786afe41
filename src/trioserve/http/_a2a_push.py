"""A2A's push notification configs: a task's configs are its turn's webhooks.

A config's URL is a delivery of the turn's end in the webhook outbox
(``sessions._webhooks``), exactly as if the turn had been started with
that ``webhook``: checked by ``--webhook-allow`` (a refusal is invalid
params naming the field), stored durably with the turn, POSTed signed
(Standard Webhooks, ``--webhook-secret-file``) when the turn ends, and a
``turn.waiting`` when it waits for an approval, retried until delivered or
given up.  The body is the outbox's envelope (``type``, ``timestamp``,
``sessionId``, ``data``: the turn record), not A2A's ``StreamResponse``.

- ``CreateTaskPushNotificationConfig`` (and ``SendMessage``'s
  ``configuration.taskPushNotificationConfig``) adds the URL; on a task
  that has ended already its end is POSTed at once.  The config's ``id`` is
  the delivery's (its POSTs' ``webhook-id``), made from the task and the
  URL: a client's own ``id`` is not kept, the same URL twice is one config.
- ``Get``/``List``/``DeleteTaskPushNotificationConfig`` show and remove the
  task's deliveries still to be sent (a config is gone once its POST is
  delivered or given up).  The server's own ``--webhook`` is never shown.
- ``token`` and ``authentication`` are refused (invalid params): there is
  nowhere to keep them; a receiver checks the signature instead.

With no ``--webhook-secret-file`` webhooks are off: the card says
``pushNotifications: false`` and these methods are ``-32003``.
"""

from __future__ import annotations

from typing import Any, Final

from a2a.types.a2a_pb2 import (
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    TaskPushNotificationConfig,
)

from trioserve.errors import InvalidRequest, NotFound
from trioserve.http import _a2a_tasks as tasks
from trioserve.http._a2a_rpc import (
    INVALID_PARAMS,
    PUSH_NOT_SUPPORTED,
    TASK_NOT_FOUND,
    RpcError,
    parse_params,
    task_ref,
)
from trioserve.sessions import SessionManager
from trioserve.stores.base import TurnRecord

METHODS: Final = (
    "CreateTaskPushNotificationConfig",
    "GetTaskPushNotificationConfig",
    "ListTaskPushNotificationConfigs",
    "DeleteTaskPushNotificationConfig",
)
#: Where ``SendMessage`` carries a config.
IN_SEND: Final = "params.configuration.taskPushNotificationConfig"


def enabled(manager: SessionManager) -> bool:
    """Whether webhooks can be sent (a secret signs them): the card's ``pushNotifications``."""
    return manager.webhooks.settings.enabled


def refused(exc: InvalidRequest, where: str) -> RpcError:
    """A webhook refusal (``webhook: …``) as invalid params naming ``where``'s ``url``."""
    reason = exc.message.removeprefix("webhook:").strip()
    return RpcError(INVALID_PARAMS, f"{where}.url: {reason}")


async def check(manager: SessionManager, config: TaskPushNotificationConfig, where: str) -> str:
    """A config's URL, if this server can send to it (else invalid params naming the field)."""
    if not enabled(manager):
        raise RpcError(PUSH_NOT_SUPPORTED, "push notifications are off (no webhook secret)")
    if config.token:
        raise RpcError(
            INVALID_PARAMS,
            f"{where}.token: not supported; check the POST's webhook-signature instead",
        )
    if config.HasField("authentication"):
        raise RpcError(
            INVALID_PARAMS,
            f"{where}.authentication: not supported; check the POST's webhook-signature instead",
        )
    if not config.url:
        raise RpcError(INVALID_PARAMS, f"{where}.url: required")
    try:
        return await manager.webhooks.policy.check(config.url)
    except InvalidRequest as exc:
        raise refused(exc, where) from None


def shown(task: str, config_id: str, url: str) -> TaskPushNotificationConfig:
    return TaskPushNotificationConfig(id=config_id, task_id=task, url=url)


class PushConfigs:
    """The four methods, over one manager."""

    def __init__(self, manager: SessionManager) -> None:
        self.manager = manager

    async def _task(self, value: str, who: str | None) -> TurnRecord:
        if not enabled(self.manager):
            raise RpcError(PUSH_NOT_SUPPORTED, "push notifications are off (no webhook secret)")
        session_id, turn_id = task_ref(value)
        try:
            return await self.manager.get_turn(session_id, turn_id, who)
        except NotFound:
            found = tasks.task_id(session_id, turn_id)
            raise RpcError(TASK_NOT_FOUND, f"task {found} not found") from None

    async def call(self, method: str, params: Any, who: str | None) -> dict[str, Any]:
        """Answer one of ``METHODS``."""
        if method == "CreateTaskPushNotificationConfig":
            config = parse_params(params, TaskPushNotificationConfig())
            record = await self._task(config.task_id, who)
            url = await check(self.manager, config, "params")
            try:
                found = await self.manager.webhooks.add(record, url)
            except InvalidRequest as exc:
                raise refused(exc, "params") from None
            return tasks.proto_dict(shown(config.task_id, found, url))
        if method == "ListTaskPushNotificationConfigs":
            req = parse_params(params, ListTaskPushNotificationConfigsRequest())
            record = await self._task(req.task_id, who)
            configs = [shown(req.task_id, *pair) for pair in await self._of(record)]
            return tasks.proto_dict(ListTaskPushNotificationConfigsResponse(configs=configs))
        if method == "GetTaskPushNotificationConfig":
            got = parse_params(params, GetTaskPushNotificationConfigRequest())
            record = await self._task(got.task_id, who)
            for config_id, url in await self._of(record):
                if config_id == got.id:
                    return tasks.proto_dict(shown(got.task_id, config_id, url))
            raise RpcError(TASK_NOT_FOUND, f"push config {got.id[:100]!r} of task not found")
        gone = parse_params(params, DeleteTaskPushNotificationConfigRequest())
        record = await self._task(gone.task_id, who)
        if not await self.manager.webhooks.remove(record.id, gone.id):
            raise RpcError(TASK_NOT_FOUND, f"push config {gone.id[:100]!r} of task not found")
        return {}

    async def _of(self, record: TurnRecord) -> list[tuple[str, str]]:
        return await self.manager.webhooks.of_turn(record.id)
