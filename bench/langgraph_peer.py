"""LangGraph's own server as a peer (issue 30): ``langgraph dev`` (the in-memory
runtime) serving a one-node echo graph, installed on first use into a venv of its own
under ``bench/.build/langgraph`` (its dependencies never meet trioserve's).

``LANGGRAPH_REQUIREMENT`` says what is installed; ``running(port)`` starts the server
with ``--n-jobs-per-worker 64`` (64 runs at once, as the issue compared) and stops it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from bench import BenchError
from bench.adapter import BUILD
from bench.peers import free_port, peer_process, wait_ok

LANGGRAPH_REQUIREMENT = "langgraph-cli[inmem]"
VENV = BUILD / "langgraph"
JOBS = 64

GRAPH = """\
from typing import TypedDict

from langgraph.graph import END, START, StateGraph


class State(TypedDict, total=False):
    input: str
    output: str


def echo(state: State) -> State:
    return {"output": "echo: " + state.get("input", "")}


builder = StateGraph(State)
builder.add_node("echo", echo)
builder.add_edge(START, "echo")
builder.add_edge("echo", END)
graph = builder.compile()
"""


def install() -> Path:
    """The venv's ``langgraph`` command, installing it first if it is not there."""
    command = VENV / "bin" / "langgraph"
    if command.exists():
        return command
    BUILD.mkdir(exist_ok=True)
    steps = [
        [sys.executable, "-m", "venv", str(VENV)],
        [str(VENV / "bin" / "pip"), "install", "-q", LANGGRAPH_REQUIREMENT],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            raise BenchError(f"installing LangGraph failed: {done.stderr.strip()[-2000:]}")
    return command


def versions() -> dict[str, str]:
    """The installed versions of LangGraph's packages (for the report)."""
    names = ["langgraph", "langgraph-api", "langgraph-cli", "langgraph-runtime-inmem"]
    code = (
        "import importlib.metadata as m, json, sys\n"
        "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"
    )
    out = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", code, *names],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found: dict[str, str] = json.loads(out.stdout)
    return found


@contextlib.contextmanager
def running(workdir: Path) -> Iterator[tuple[str, int]]:
    """``langgraph dev`` serving the echo graph as assistant ``echo``: (its URL, its pid)."""
    command = install()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "graph.py").write_text(GRAPH)
    config = {"dependencies": ["."], "graphs": {"echo": "./graph.py:graph"}}
    (workdir / "langgraph.json").write_text(json.dumps(config))
    port = free_port()
    argv = [str(command), "dev", "--no-browser", "--no-reload", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--n-jobs-per-worker", str(JOBS)]
    env = dict(os.environ) | {"LANGGRAPH_CLI_NO_ANALYTICS": "1", "LANGSMITH_TRACING": "false"}
    log = workdir / "langgraph.log"
    with peer_process(argv, env=env, cwd=workdir, log=log, stop=signal.SIGINT) as proc:
        wait_ok("langgraph dev", proc, port, "/ok", log, 120)
        yield f"http://127.0.0.1:{port}", proc.pid
