"""``/v1/crons``: the routes of scheduled turns over ``sessions.Crons`` (docs/api.md, "Crons").

A thin transport, as ``_app``'s routes: the body is read as every body is
(``parse_body``), the key's tenant handed on, the records shown as the API
shows them.  ``GET /v1/crons`` pages as ``GET /v1/sessions`` does
(``_paging``: newest first, a ``Trioserve-Next-Page`` token and a ``Link``).
"""

from __future__ import annotations

import json
from typing import Any

from quart import Response, request
from quart_trio import QuartTrio

from trioserve.errors import InvalidRequest
from trioserve.http import _paging as paging
from trioserve.http._errors import tenant
from trioserve.http._models import parse_body
from trioserve.http._untrusted import parse_int
from trioserve.protocol import CronBody, CronOut, CronPatchBody, CronRunOut
from trioserve.sessions import Crons, CronView, rfc3339
from trioserve.stores.base import SessionKey, TurnRecord
from trioserve.stores.crons import CronRecord, CronRun

__all__ = ["cron_out", "install"]

#: The largest ``?limit=`` of ``GET /v1/crons``.
MAX_LIMIT = 1000
_MAX_BEFORE = 512


def _run_out(run: CronRun, turn: TurnRecord | None) -> CronRunOut:
    fired = run.fired_at
    late = None if fired is None else round((fired - run.scheduled_at).total_seconds(), 6)
    return CronRunOut(
        scheduledAt=rfc3339(run.scheduled_at),
        firedAt=None if fired is None else rfc3339(fired),
        status=run.status,
        reason=run.reason,
        sessionId=run.session_id,
        turnId=run.turn_id,
        turnStatus=None if turn is None else turn.status.value,
        latenessSeconds=late,
        missed=run.missed,
    )


def cron_out(cron: CronRecord, view: CronView | None = None) -> dict[str, Any]:
    """A cron as the API shows it; with ``view``, its last runs too."""
    out = CronOut(
        id=cron.id,
        schedule=cron.schedule,
        timezone=cron.timezone,
        input=cron.input,
        sessionId=cron.session_id,
        inputs=cron.inputs,
        multitask=cron.multitask,
        webhook=cron.webhook,
        enabled=cron.enabled,
        endAt=None if cron.end_at is None else rfc3339(cron.end_at),
        catchUp=cron.catch_up,
        createdAt=rfc3339(cron.created_at),
        updatedAt=rfc3339(cron.updated_at),
        nextRunAt=None if cron.next_run_at is None else rfc3339(cron.next_run_at),
        lastRuns=None
        if view is None or view.runs is None
        else [_run_out(run, turn) for run, turn in view.runs],
    )
    body = out.model_dump()
    if view is None:
        del body["lastRuns"]
    return body


def _before(value: str | None) -> SessionKey | str | None:
    """``?before=``: a page token's position, or a cron id (``None``: the first page)."""
    if value is None:
        return None
    if not value or len(value) > _MAX_BEFORE:
        raise InvalidRequest(
            f"before must be a page token (the {paging.NEXT_PAGE_HEADER} header) or a cron id,"
            f" got {len(value)} characters"
        )
    return paging.decode_token(value) or value


def _json(value: Any, status: int = 200) -> Response:
    text = json.dumps(value, separators=(",", ":")) + "\n"
    return Response(text, status=status, content_type="application/json")


def install(app: QuartTrio, crons: Crons) -> None:
    """Add the ``/v1/crons`` routes to ``app``."""

    async def body() -> bytes:
        data = await request.get_data(parse_form_data=False)
        return data if isinstance(data, bytes) else data.encode()

    @app.post("/v1/crons")
    async def create_cron() -> Response:
        cron = await crons.create(parse_body(CronBody, await body()), tenant())
        response = _json(cron_out(cron), status=201)
        response.headers["Location"] = f"/v1/crons/{cron.id}"
        return response

    @app.get("/v1/crons")
    async def list_crons() -> Response:
        value = request.args.get("limit")
        limit = None if not value else parse_int("limit", value, minimum=1, maximum=MAX_LIMIT)
        before = _before(request.args.get("before"))
        page = await crons.list(tenant(), limit, before)
        response = _json([cron_out(cron) for cron in page.crons])
        if page.next is not None:
            query = request.args.items(multi=True)
            response.headers.update(paging.next_page_headers(request.path, query, page.next))
        return response

    @app.get("/v1/crons/<cron_id>")
    async def get_cron(cron_id: str) -> Response:
        view = await crons.view(cron_id, tenant())
        return _json(cron_out(view.cron, view))

    @app.patch("/v1/crons/<cron_id>")
    async def update_cron(cron_id: str) -> Response:
        changes = parse_body(CronPatchBody, await body())
        return _json(cron_out(await crons.update(cron_id, changes, tenant())))

    @app.delete("/v1/crons/<cron_id>")
    async def delete_cron(cron_id: str) -> Response:
        await crons.delete(cron_id, tenant())
        return Response("", status=204)
