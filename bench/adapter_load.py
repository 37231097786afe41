"""How long a built-in adapter takes to load: start to its stdin read (issue 25).

Each run starts the adapter with an empty stdin: it loads what a turn needs,
reads its stdin (EOF at once), prints a ``spec_invalid`` error and exits, so
the run's wall time is the load time plus a few milliseconds.  Prints the
median, the fastest and the slowest of ``--runs`` runs per adapter, and the
load average beside them.

    python bench/adapter_load.py [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ADAPTERS = {
    "echo": ["-m", "trioserve.runtime.echo_adapter"],
    "openai": ["-m", "trioserve.runtime.openai_adapter"],
    "openai --preload-mcp": ["-m", "trioserve.runtime.openai_adapter", "--preload-mcp"],
}


def once(args: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, *args], stdin=subprocess.DEVNULL, capture_output=True, check=False
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    runs = parser.parse_args().runs
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    for name, args in ADAPTERS.items():
        once(args)  # warm the page cache
        times = sorted(once(args) for _ in range(runs))
        print(
            f"{name:22s} median {statistics.median(times) * 1000:5.0f} ms"
            f"  min {times[0] * 1000:5.0f} ms  max {times[-1] * 1000:5.0f} ms"
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
