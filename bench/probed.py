"""A ``trioserve run`` child with probes in it, driven by create + turn pairs: the common
part of ``bench.turn_timeline`` and ``bench.trio_steps``.

Each of those modules is also the child: ``python MODULE_FILE serve ARGS... RUN_ARGV``
installs its probes and runs trioserve; the report it prints on its way out (SIGINT)
is what ``run_probed`` returns.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path


def run_probed(
    script: str,
    serve_args: list[str],
    flags: list[str],
    drive: Callable[[str, subprocess.Popen[bytes]], None],
) -> str:
    """Start ``python SCRIPT serve SERVE_ARGS`` with ``trioserve run``'s arguments (in
    memory, no warm pool, ``tinyadapter 1``, then ``flags``), call ``drive(url, proc)``
    once it serves, stop it; what it printed."""
    from bench.adapter import adapter_command, build_adapter
    from bench.peers import free_port, wait_ok
    from bench.server import SPEC_YAML

    build_adapter()
    with tempfile.TemporaryDirectory(prefix="probed-") as tmp:
        spec, log = Path(tmp, "spec.yaml"), Path(tmp, "server.log")
        spec.write_text(SPEC_YAML)
        port = free_port()
        argv = ["run", str(spec), "--port", str(port), "--in-memory", "--max-sessions", "0"]
        argv += ["--warm-adapters", "0", "--runtime-command", adapter_command("1"), *flags]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, script, "serve", *serve_args, *argv],
                stdout=subprocess.PIPE,
                stderr=out,
            )
        try:
            wait_ok("the server", proc, port, "/healthz", log, 60)
            drive(f"http://127.0.0.1:{port}", proc)
        finally:
            proc.send_signal(signal.SIGINT)
            report, _ = proc.communicate(timeout=30)
    return report.decode()


def pairs_and_flags(args: list[str], default: int) -> tuple[int, list[str]]:
    """``[N] [-- MORE RUN FLAGS]``: the number of pairs and the flags."""
    more = args[args.index("--") + 1 :] if "--" in args else []
    args = args[: args.index("--")] if "--" in args else args
    return (int(args[0]) if args else default), more
