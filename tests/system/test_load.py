"""Load: 64 sessions x 5 turns through the Python client, three runs, nothing lost, none twice.

The server keeps an idle connection for less time than the client's pool
does (``keep_alive`` 0.3 s against the pool's 4 s), and each session pauses
between its turns for 0 to 0.6 s, so the client keeps sending requests on
connections the server is closing: at their keep-alive deadline, just
after, or while the server, busy, has not read them yet.  The server serves
a request waiting at the deadline; the client sends again, with its
idempotency key, one whose connection was closed before it was answered.
No transport error reaches the caller, every turn completes, and each
session has exactly its five turns: none ran twice.
"""

from __future__ import annotations

import random

import trio

from tests.helpers import ServerFactory
from trioserve.client import Client

SESSIONS, TURNS, RUNS = 64, 5, 3
KEEP_ALIVE = 0.3


async def session_of_turns(
    client: Client, name: str, pauses: random.Random, sessions: list[str]
) -> None:
    """A session, then its turns one after the other, each after a pause."""
    session = await client.create_session()
    sessions.append(session.id)
    for turn in range(TURNS):
        await trio.sleep(pauses.uniform(0, 2 * KEEP_ALIVE))
        async with client.turn(session.id, f"{name} turn {turn}") as events:
            last = [event async for event in events][-1]
        assert (last.type, last.end_reason) == ("session.ended", "completed")


async def test_64_sessions_of_5_turns_three_times_lose_nothing_and_run_nothing_twice(
    start_server: ServerFactory,
) -> None:
    # 64 turns at once from one address, each on its own connection, beside the
    # connections the server is closing: more than the per-address cap (64) for a moment.
    server = await start_server(
        keep_alive=KEEP_ALIVE, max_concurrent_turns=0, max_connections_per_ip=256
    )
    pauses = random.Random(29)
    async with Client(server.url) as client:
        for run in range(RUNS):
            sessions: list[str] = []
            async with trio.open_nursery() as nursery:
                for i in range(SESSIONS):
                    name = f"run {run} session {i}"
                    nursery.start_soon(session_of_turns, client, name, pauses, sessions)
            assert len(sessions) == SESSIONS
            for session_id in sessions:
                turns = await client.list_turns(session_id)
                assert [t.status for t in turns] == ["completed"] * TURNS, turns
