"""The Go reference peer (issue 23): ``agentctl serve`` v0.8 built from agent-controller's
source (``agentctl-peer``, see ``bench/scenarios/go_peer.py`` for how to build it), run on
port 0's equivalent with the bench's C adapter and the bench's spec, compiled by trioserve.

``running(binary, adapter, workdir)`` starts it and stops it (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from bench import BenchError
from bench.peers import free_port, peer_process, wait_ok
from bench.server import SPEC_YAML, trioserve_argv


def _compiled_spec(workdir: Path) -> Path:
    """The bench's spec as a CompiledSpec JSON file (what the peer reads)."""
    yaml_path, json_path = workdir / "spec.yaml", workdir / "spec.json"
    yaml_path.write_text(SPEC_YAML)
    done = subprocess.run(
        [*trioserve_argv(), "compile", str(yaml_path)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise BenchError(f"trioserve compile failed: {done.stderr.decode()[-500:]}")
    json_path.write_bytes(done.stdout)
    return json_path


@contextlib.contextmanager
def running(binary: Path, adapter: str, workdir: Path) -> Iterator[tuple[str, int]]:
    """The peer serving the bench's spec with ``adapter``: (its URL, its pid)."""
    if not binary.exists():
        raise BenchError(
            f"no Go peer at {binary}: build it with the measure kit's build-go-peer.sh"
            " (agent-controller's source at 2d6eaca), then pass --go-peer PATH"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    spec = _compiled_spec(workdir)
    port = free_port()
    argv = [str(binary), "--port", str(port), "--max-concurrent-turns", "1000"]
    argv += ["--max-sessions", "1000000", str(spec)]
    env = dict(os.environ) | {"AGENT_CONTROLLER_RUNTIME": adapter}
    log = workdir / "peer.log"
    with peer_process(argv, env=env, cwd=workdir, log=log) as proc:
        wait_ok("the Go peer", proc, port, "/healthz", log, 30)
        yield f"http://127.0.0.1:{port}", proc.pid
