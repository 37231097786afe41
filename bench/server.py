"""The server launcher: ``Server`` (one ``trioserve run`` subprocess on port 0) and the
run's ``Context``, whose ``server`` starts one for a scenario and records how it ended."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench import BenchError
from bench.profiling import Profiler

_URL = re.compile(r" on (http://\S+) ")
SPEC_YAML = """\
apiVersion: agent-controller.dev/v1alpha1
kind: Agent
metadata: {name: bench}
spec:
  model: {provider: anthropic, name: bench-model}
  task: bench
  tools: []
  runtime: {type: echo}
"""


def trioserve_argv() -> list[str]:
    script = Path(sys.executable).with_name("trioserve")
    return [str(script)] if script.exists() else [sys.executable, "-m", "trioserve"]


@dataclass
class Server:
    """One ``trioserve run`` subprocess; its stderr goes to ``server.log`` in its workdir."""

    name: str
    workdir: Path
    runtime_command: str
    flags: list[str]
    prefix: list[str] | None = None  # e.g. ``python -m cProfile -o X -m trioserve``
    nofile: int | None = None  # RLIMIT_NOFILE soft limit for the server, if set
    spec_yaml: str = SPEC_YAML  # the agent it serves
    env: dict[str, str] = field(default_factory=dict)  # added to the environment
    proc: subprocess.Popen[bytes] | None = None
    url: str = ""
    exit_code: int | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def port(self) -> int:
        port = urlsplit(self.url).port
        assert port is not None
        return port

    def start(self, timeout: float = 60.0) -> None:
        """Start it, its log to ``server.log`` in its workdir (not a pipe: a thread of the
        bench reading every line would take the interpreter lock from the client each
        time, a cost the Go peer, which logs to a file too, does not pay); return once
        the log has its URL."""
        spec = self.workdir / "spec.yaml"
        spec.write_text(self.spec_yaml)
        argv = [*(self.prefix or trioserve_argv()), "run", str(spec), "--port", "0"]
        # Every client of a scenario is on 127.0.0.1: one address, hundreds of connections.
        argv += ["--max-connections-per-ip", "0"]
        if self.runtime_command:  # "": the spec's runtime, as trioserve resolves it
            argv += ["--runtime-command", self.runtime_command]
        argv += self.flags
        env = dict(os.environ) | self.env
        env.pop("TRIOSERVE_RUNTIME_COMMAND", None)
        env["XDG_DATA_HOME"] = str(self.workdir / "xdg")
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                cwd=self.workdir,
                env=env,
                preexec_fn=self._limit_fds if self.nofile else None,
            )
        deadline = time.monotonic() + timeout
        while not self.url and time.monotonic() < deadline and self.proc.poll() is None:
            if match := _URL.search(self.log_path.read_text(errors="replace")):
                self.url = match.group(1)
            else:
                time.sleep(0.02)
        if not self.url:
            self.proc.kill()
            self.proc.wait(10)
            tail = "".join(self.log[-20:]).strip()
            raise BenchError(f"server {self.name!r} did not start:\n{tail}")

    @property
    def log_path(self) -> Path:
        return self.workdir / "server.log"

    @property
    def log(self) -> list[str]:
        """Its log's lines so far."""
        if not self.log_path.exists():
            return []
        return self.log_path.read_text(errors="replace").splitlines(keepends=True)

    def _limit_fds(self) -> None:
        assert self.nofile is not None
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, hard))

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (drain), then wait; SIGKILL if it does not exit in ``timeout``."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.exit_code = self.proc.returncode
        return self.exit_code

    def log_mentions(self, *needles: str) -> list[str]:
        return [line.strip() for line in self.log if any(n in line for n in needles)]


@dataclass
class Context:
    """What a scenario runs with: the run's size (``quick``), the command line's options,
    the profiler, a temporary directory; ``servers`` records how each server ended."""

    quick: bool
    options: argparse.Namespace
    profiler: Profiler
    tmp: Path
    servers: dict[str, dict[str, Any]] = field(default_factory=dict)

    @contextlib.contextmanager
    def server(
        self,
        name: str,
        runtime_command: str,
        flags: list[str],
        nofile: int | None = None,
        *,
        spec_yaml: str = SPEC_YAML,
        env: dict[str, str] | None = None,
    ) -> Iterator[Server]:
        workdir = self.tmp / name
        workdir.mkdir(parents=True, exist_ok=True)
        prefix = self.profiler.prefix(name)
        srv = Server(
            name,
            workdir,
            runtime_command,
            flags,
            prefix=prefix,
            nofile=nofile,
            spec_yaml=spec_yaml,
            env=env or {},
        )
        srv.start()
        try:
            self.profiler.attach(name, srv.pid)
            yield srv
        finally:
            self.profiler.detach(name)
            code = srv.stop()
            self.profiler.after_exit(name)
            errors = srv.log_mentions("ERROR", "Traceback", "Too many open files", "EMFILE")
            self.servers[name] = {
                "flags": flags,
                "nofile": nofile,
                "runtime_command": runtime_command,
                "exit_code": code,
                "log_errors": errors[:20],
            }
