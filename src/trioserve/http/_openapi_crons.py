"""The crons' paths in the OpenAPI document (``/v1/crons``; docs/api.md, "Crons")."""

from __future__ import annotations

from typing import Any, Final

from trioserve.http._openapi_components import (
    error_responses,
    json_body,
    json_response,
    param,
    schema_ref,
)
from trioserve.protocol import NEXT_PAGE_HEADER

__all__ = ["cron_paths"]

CRON_ID: Final = param(
    "cronId", "path", "The cron's id (`c_...`, opaque).", {"type": "string", "minLength": 1}
)


def cron_paths() -> dict[str, Any]:
    """``/v1/crons`` and ``/v1/crons/{cronId}``."""
    one = schema_ref("CronOut")
    return {
        "/v1/crons": {
            "post": {
                "operationId": "createCron",
                "summary": "Schedule turns: a five-field cron expression or `@every 30s` in an"
                " IANA time zone, each fire a turn on `sessionId` or on a new session.",
                "description": "A `400` names the field: an invalid expression, an unknown time"
                " zone, an interval under 1 s, `endAt` not in the future, both `sessionId` and"
                " `inputs`. `webhook` is stored and shown (no request is made to it yet).",
                "requestBody": json_body("CronBody", "The schedule, its turn and its options."),
                "responses": {
                    "201": json_response("The cron, with `nextRunAt`.", one),
                    **error_responses(("invalid_request", "payload_too_large", "cron_cap")),
                },
            },
            "get": {
                "operationId": "listCrons",
                "summary": "The tenant's crons, newest first; one page with `limit`.",
                "parameters": [
                    param(
                        "limit",
                        "query",
                        "At most this many (absent: all).",
                        {"type": "integer", "minimum": 1, "maximum": 1000},
                    ),
                    param(
                        "before",
                        "query",
                        f"Start after this position: a `{NEXT_PAGE_HEADER}` token or a cron id.",
                        {"type": "string", "minLength": 1, "maxLength": 512},
                    ),
                ],
                "responses": {
                    "200": json_response(
                        "The crons (a plain array, also when paged; no `lastRuns`).",
                        {"type": "array", "items": one},
                        **{NEXT_PAGE_HEADER: "NextPage", "Link": "Link"},
                    ),
                    **error_responses(("invalid_request",)),
                },
            },
        },
        "/v1/crons/{cronId}": {
            "parameters": [CRON_ID],
            "get": {
                "operationId": "getCron",
                "summary": "One cron, with `nextRunAt` and its last runs (newest first): when"
                " each fired, its turn and the turn's status, how late, or why it started none.",
                "responses": {
                    "200": json_response("The cron.", one),
                    **error_responses(("not_found", "route_not_found")),
                },
            },
            "patch": {
                "operationId": "updateCron",
                "summary": "Change a cron: enable, disable, reschedule (`nextRunAt` computed"
                " again from now), or its turn's input and options.",
                "requestBody": json_body(
                    "CronPatchBody", "The fields to change; absent or `null`: kept."
                ),
                "responses": {
                    "200": json_response("The cron as changed.", one),
                    **error_responses(
                        ("invalid_request", "not_found", "route_not_found", "payload_too_large")
                    ),
                },
            },
            "delete": {
                "operationId": "deleteCron",
                "summary": "Delete a cron and its runs; turns it started go on.",
                "responses": {
                    "204": {"description": "Deleted."},
                    **error_responses(("not_found", "route_not_found")),
                },
            },
        },
    }
