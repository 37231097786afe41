"""A user's program calling every method of ``Client`` and ``SyncClient``, fully typed.

``test_typing.py`` type-checks it with ``mypy --strict`` (as a user would
their own code: only ``trioserve.client`` and the standard library) and runs
it against a real server: ``python typed_program.py URL`` prints one line
per client.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import datetime

from trioserve.client import (
    APIError,
    Client,
    Event,
    LogStream,
    NotFoundError,
    Reconnect,
    Retry,
    Session,
    SessionPage,
    SyncClient,
    SyncLogStream,
    SyncTurnStream,
    Turn,
    TurnStream,
)


async def every_async_call(url: str) -> str:
    async with Client(url, timeout=10.0, retry=Retry(attempts=1)) as client:
        healthy: bool = await client.health() and await client.ready()
        session: Session = await client.create_session({"name": "Ada"})
        same: Session = await client.get_session(session.id)
        listed: list[Session] = await client.list_sessions(status="active", limit=10)
        page: SessionPage = await client.sessions_page(limit=1)
        every: list[str] = [s.id async for s in client.iter_sessions(page_size=2)]
        stream: TurnStream
        async with client.turn(session.id, "hi", transport="websocket") as stream:
            events: list[Event] = [event async for event in stream]
        record: Turn = await client.detach(session.id, "later")
        log: LogStream
        async with client.events(session.id, turn=record.id, reconnect=Reconnect()) as log:
            logged = [event.seq async for event in log]
        turns: list[Turn] = await client.list_turns(session.id)
        one: Turn = await client.get_turn(session.id, turns[0].id)
        exported: list[Event] = await client.export(session.id, after=0)
        try:
            await client.cancel(session.id)
        except NotFoundError as exc:
            reason: str = exc.reason
        await client.end_session(session.id)
        url_ws: str = client.websocket_url(session.id)
        created: datetime = same.created_at
    seen = [healthy, bool(listed), len(page.sessions), session.id in every, events[-1].end_reason]
    return report("async", *seen, bool(logged), one.status, len(exported), reason, url_ws, created)


def every_sync_call(url: str) -> str:
    with SyncClient(url, timeout=10.0, retry=Retry(attempts=0)) as client:
        healthy: bool = client.health() and client.ready()
        session: Session = client.create_session({"name": "Ada"})
        same: Session = client.get_session(session.id)
        listed: list[Session] = client.list_sessions(status="active", limit=10)
        page: SessionPage = client.sessions_page(limit=1)
        every: list[str] = [s.id for s in client.iter_sessions(page_size=2)]
        stream: SyncTurnStream
        with client.turn(session.id, "hi", transport="sse") as stream:
            events: list[Event] = list(stream)
        record: Turn = client.detach(session.id, "later")
        log: SyncLogStream
        with client.events(session.id, turn=record.id, transport="websocket") as log:
            logged = [event.seq for event in log]
        turns: list[Turn] = client.list_turns(session.id)
        one: Turn = client.get_turn(session.id, turns[0].id)
        exported: list[Event] = client.export(session.id, after=0)
        try:
            client.cancel(session.id)
        except APIError as exc:
            reason: str = exc.reason
        client.end_session(session.id)
        url_ws: str = client.websocket_url(session.id)
        created: datetime = same.created_at
    seen = [healthy, bool(listed), len(page.sessions), session.id in every, events[-1].end_reason]
    return report("sync", *seen, bool(logged), one.status, len(exported), reason, url_ws, created)


def report(kind: str, *seen: object) -> str:
    """One line: what each call returned, as the test expects it."""
    *values, url_ws, created = seen
    assert isinstance(url_ws, str) and isinstance(created, datetime)
    values += [url_ws.startswith("ws://"), created.tzinfo is not None]
    return " ".join([kind, *map(str, values)])


if __name__ == "__main__":
    print(asyncio.run(every_async_call(sys.argv[1])))
    print(every_sync_call(sys.argv[1]))
