"""The programs the floor scenario (``bench/scenarios/floor.py``) runs as subprocesses.

    python bench/floor_servers.py bare asgi|quart      # a bare app on an ephemeral port
    python bench/floor_servers.py bare turns ADAPTER...  # create + turn, nothing more
    python bench/floor_servers.py profiled DIR ARGV... # trioserve ARGV under cProfile

A script, run by its path: it imports nothing from ``bench``.  ``bare`` serves until
SIGTERM and prints ``floor: serving KIND on URL`` to stderr when it listens:

- ``asgi``: a bare ASGI callable under ``hypercorn.trio.serve`` (hypercorn's defaults,
  no access log): ``GET /healthz``.
- ``quart``: a bare ``QuartTrio`` app: ``GET /healthz``, and ``POST /echo`` (reads a
  JSON body, answers ``201`` with JSON), the shape of a create.
- ``turns``: the ``quart`` app, and the least a quart-trio server does for v0.8's create
  + turn: ``POST /v1/sessions`` answers ``201`` with a new id, ``POST
  /v1/sessions/{id}/turns`` spawns ``ADAPTER`` (``trio.lowlevel.open_process``), writes
  the request to its stdin, and streams each line it prints as an SSE frame named by the
  line's ``type`` (one ``json.loads`` a line); a client that goes away has its adapter
  killed.  No store, no numbering, no checks, no limits: the floor under the go-peer
  scenario's create + turn, 64 x 5 and RSS with 500 streams.

``profiled`` runs trioserve with a CPU-time cProfile switched by signals: SIGUSR1
starts a profile, SIGUSR2 writes it to ``DIR/N.prof`` (N counts from 0).
"""

from __future__ import annotations

import cProfile
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any


def profiled_server(out: Path, argv: list[str]) -> None:
    """Run ``trioserve ARGV`` with a CPU-time cProfile switched by signals: SIGUSR1
    starts a profile, SIGUSR2 writes it to ``out/N.prof`` (N counts from 0)."""
    import runpy

    state: dict[str, Any] = {"n": 0, "prof": None}

    def start(*_: Any) -> None:
        state["prof"] = cProfile.Profile(time.process_time)
        state["prof"].enable()

    def stop(*_: Any) -> None:
        prof, state["prof"] = state["prof"], None
        if prof is not None:
            prof.disable()
            tmp = out / f"{state['n']}.tmp"
            prof.dump_stats(str(tmp))
            tmp.rename(out / f"{state['n']}.prof")
            state["n"] += 1

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    sys.argv = ["trioserve", *argv]
    runpy.run_module("trioserve", run_name="__main__", alter_sys=True)


# -- the bare servers ------------------------------------------------------------


async def _bare_asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b"ok\n"
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", b"3"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _bare_quart() -> Any:
    from quart import Response, request
    from quart_trio import QuartTrio

    app = QuartTrio("floor")

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response("ok\n", content_type="text/plain; charset=utf-8")

    @app.post("/echo")
    async def echo() -> Response:
        body = json.loads(await request.get_data())
        text = json.dumps({"id": "s_x", "inputs": body}, separators=(",", ":")) + "\n"
        return Response(text, status=201, content_type="application/json")

    return app


def _bare_turns(adapter: list[str]) -> Any:
    import itertools
    import subprocess
    from collections.abc import AsyncIterator

    import trio
    from quart import Response, request
    from quart_trio import QuartTrio

    app: QuartTrio = _bare_quart()
    ids = itertools.count()

    @app.post("/v1/sessions")
    async def create() -> Response:
        json.loads(await request.get_data())
        text = json.dumps({"id": f"s_{next(ids)}", "status": "idle"}) + "\n"
        return Response(text, status=201, content_type="application/json")

    @app.post("/v1/sessions/<sid>/turns")
    async def turn(sid: str) -> Response:
        body = await request.get_data(True, False, False)
        json.loads(body)
        proc = await trio.lowlevel.open_process(
            adapter, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert proc.stdin is not None and proc.stdout is not None
        await proc.stdin.send_all(body)
        await proc.stdin.aclose()
        stdout = proc.stdout

        async def frames() -> AsyncIterator[bytes]:
            ended = False
            try:
                rest = b""
                while chunk := await stdout.receive_some(1 << 16):
                    *lines, rest = (rest + chunk).split(b"\n")
                    yield b"".join(
                        b"event: %s\ndata: %s\n\n" % (json.loads(x)["type"].encode(), x)
                        for x in lines
                        if x
                    )
                ended = True
            finally:
                if not ended:  # the client went away: as any server must, stop its adapter
                    proc.kill()
                with trio.CancelScope(shield=True):
                    await proc.wait()

        return Response(frames(), content_type="text/event-stream")

    return app


def serve(kind: str, args: list[str]) -> None:
    """Serve the bare ``kind`` app on an ephemeral port until SIGTERM."""
    import logging

    import trio
    from hypercorn.config import Config
    from hypercorn.trio import serve as hypercorn_serve

    apps: dict[str, Any] = {
        "asgi": lambda: _bare_asgi,
        "quart": _bare_quart,
        "turns": lambda: _bare_turns(args),
    }
    app = apps[kind]()
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = 1.0

    async def main() -> None:
        stop = trio.Event()
        async with trio.open_nursery() as nursery:

            async def signals() -> None:
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as got:
                    async for _ in got:
                        stop.set()
                        return

            nursery.start_soon(signals)
            binds = await nursery.start(
                lambda task_status: hypercorn_serve(
                    app,
                    config,
                    shutdown_trigger=stop.wait,
                    task_status=task_status,
                )
            )
            print(f"floor: serving {kind} on {binds[0]} ", file=sys.stderr, flush=True)
            await stop.wait()
            nursery.cancel_scope.cancel()

    trio.run(main)


if __name__ == "__main__":
    if sys.argv[1:2] == ["bare"]:
        serve(sys.argv[2], sys.argv[3:])
    elif sys.argv[1:2] == ["profiled"]:
        profiled_server(Path(sys.argv[2]), sys.argv[3:])
    else:
        sys.exit(__doc__)
