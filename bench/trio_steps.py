"""Trips to the scheduler a create + turn takes, by task and by where each one waited.

    python -m bench.trio_steps [TURNS] [-- MORE RUN FLAGS]

Starts ``trioserve run --in-memory --warm-adapters 0`` with the bench's C adapter
(``tinyadapter 1``) in a child process whose Trio run has an instrument that counts
task steps (a step: a task runs from being scheduled until it waits again, one pass of
the scheduler at least), drives 20 create + turn pairs, then TURNS more (default 300)
over one keep-alive connection (scenario a's loop), and prints the steps of those per
create + turn: for each task (by its function's name) and the place it waited (its
three innermost frames, trio's own left out; blank for a task's first step).  A step
costs the scheduler a pass (an ``epoll_wait``, its run queue, the task's switch in
and out): the fewer a request takes, the less CPU it costs.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

WARMUP = 20
_TRIO_OWN = ("/trio/_core/", "/trio/_util.py", "/trio/_traps.py")
STEPS: Counter[tuple[str, str]] = Counter()


def _frames(coro: Any) -> list[str]:
    """Where ``coro`` waits: its await chain, outermost first, as ``file:line:function``."""
    import gc

    found = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            path = frame.f_code.co_filename
            if not path.endswith(_TRIO_OWN) and "/trio/_core/" not in path:
                found.append(f"{Path(path).name}:{frame.f_lineno}:{frame.f_code.co_name}")
        nested = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        if nested is not None and type(nested).__name__ == "coroutine_wrapper":
            # ``await obj`` where ``obj.__await__`` returns a coroutine's: look through it.
            nested = next((r for r in gc.get_referents(nested) if hasattr(r, "cr_frame")), None)
        coro = nested
    return found


def _install() -> None:
    import trio

    class Steps(trio.abc.Instrument):
        def after_task_step(self, task: trio.lowlevel.Task) -> None:
            where = " < ".join(reversed(_frames(task.coro)[-3:]))
            STEPS[(task.name.rsplit(".", 1)[-1], where)] += 1

    run = trio.run

    def instrumented(*args: Any, **kwargs: Any) -> Any:
        kwargs["instruments"] = [*kwargs.get("instruments", ()), Steps()]
        return run(*args, **kwargs)

    trio.run = instrumented  # type: ignore[assignment]
    signal.signal(signal.SIGUSR1, lambda *_: STEPS.clear())


def _report(pairs: int) -> None:
    total = sum(STEPS.values())
    print(f"{total / pairs:.1f} task steps a create + turn ({pairs} pairs after {WARMUP}):")
    for (task, where), n in STEPS.most_common():
        if n / pairs >= 0.05:
            print(f"  {n / pairs:5.2f}  {task:18} {where}")


def serve(pairs: int, argv: list[str]) -> None:
    """``trioserve ARGV`` with the instrument; the report on SIGINT's way out."""
    import atexit

    _install()
    atexit.register(_report, pairs)
    from trioserve.cli import main

    sys.argv = ["trioserve", *argv]
    main()


def measure(pairs: int, flags: list[str]) -> None:
    import trio

    from bench.probed import run_probed
    from bench.scenarios.turn_latency import raw_create_turns

    def drive(url: str, proc: subprocess.Popen[bytes]) -> None:
        trio.run(raw_create_turns, url, 0, WARMUP)
        proc.send_signal(signal.SIGUSR1)  # the counts start now
        trio.run(raw_create_turns, url, 0, pairs)

    print(run_probed(__file__, [str(pairs)], flags, drive), end="")


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(int(sys.argv[2]), sys.argv[3:])
    else:
        from bench.probed import pairs_and_flags

        measure(*pairs_and_flags(sys.argv[1:], 300))
