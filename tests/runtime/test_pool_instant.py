"""The warm pool stands down for an adapter that loads at once (``_pool_policy``,
"Standing down"), and only for one: over real processes.

The window for "at once" is widened to half a second here (``INSTANT`` is 10 ms),
so that a busy machine cannot make a shell's start late; the slower adapter sleeps
longer than the window.
"""

from __future__ import annotations

import logging
import sys

import pytest
import trio

from tests.helpers import ServerFactory
from tests.runtime.test_pool_cores import release, running_pool
from trioserve.runtime._pool import WarmPool
from trioserve.runtime._pool_policy import INSTANT_LOADS

#: Reads its stdin with the shell's own ``read`` (the shell is the process the pool
#: watches), then speaks the wire protocol: a compiled program's start, in a
#: millisecond or two.
AT_ONCE = [
    "sh",
    "-c",
    "read -r spec; "
    """printf '%s\\n' '{"v":1,"type":"session.started","data":{}}' """
    """'{"v":1,"type":"session.ended","data":{"reason":"completed"}}'""",
]
#: Reads its stdin only after the window.
SLOWER = [sys.executable, "-c", "import sys, time; time.sleep(0.6); sys.stdin.read()"]
WINDOW = 0.5
#: Turns enough for INSTANT_LOADS loads at once in a row.
TRIES = 10


@pytest.fixture(autouse=True)
def _window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("trioserve.runtime._pool.INSTANT", WINDOW)


async def test_the_pool_stands_down_for_an_adapter_that_loads_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="trioserve.pool")
    pool = WarmPool(AT_ONCE, 1, max_size=1, stop_grace=1.0)
    async with running_pool(pool):
        with trio.fail_after(60):
            for _ in range(TRIES):
                if pool.standing_down:
                    break
                await pool.wait_ready()
                if not pool.standing_down:
                    await release(await pool.take())
            assert pool.standing_down, "never stood down"
            while pool.pids():  # its processes are stopped and reaped
                await trio.sleep(0.01)
        assert await pool.take() is None  # every turn starts its own from now on
        stats = pool.stats()
        assert (stats.standing_down, stats.target, stats.ready, stats.loading) == (
            True,
            0,
            0,
            0,
        )
    (line,) = [r.getMessage() for r in caplog.records if "stands down" in r.getMessage()]
    assert f"({INSTANT_LOADS} times)" in line


async def test_the_pool_keeps_an_adapter_that_loads_slower() -> None:
    pool = WarmPool(SLOWER, 1, max_size=1, stop_grace=1.0)
    async with running_pool(pool):
        with trio.fail_after(60):
            for _ in range(INSTANT_LOADS + 1):
                await pool.wait_ready()
                await release(await pool.take())
            await pool.wait_ready()
        assert not pool.standing_down
        assert pool.stats().target == 1 and len(pool.pids()) == 1


async def test_a_server_whose_pool_stood_down_starts_each_adapter_itself(
    start_server: ServerFactory,
) -> None:
    server = await start_server(command=AT_ONCE, warm_adapters=1)
    sid = (await server.create())["id"]
    with trio.fail_after(60):
        for _ in range(TRIES):
            frames = await server.turn(sid, "hi")
            assert frames[-1].data["data"]["reason"] == "completed", frames
            ready = await server.client.get("/readyz", headers={"Accept": "application/json"})
            if ready.json()["warmAdapters"]["standingDown"]:
                break
    warm = ready.json()["warmAdapters"]
    assert (warm["standingDown"], warm["target"], warm["ready"]) == (True, 0, 0)
    assert ready.headers["trioserve-warm-adapters"] == "0/0"
    frames = await server.turn(sid, "and now?")  # cold, as with the pool off
    assert frames[-1].data["data"]["reason"] == "completed", frames
