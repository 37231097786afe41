"""The server under test: ``trioserve run`` in a subprocess, its log, its descriptors and
children, and the checks that end every batch."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from fuzz import Findings

_URL = re.compile(r" on (http://127\.0\.0\.1:(\d+)) ")
SPEC = """\
apiVersion: agent-controller.dev/v1alpha1
kind: Agent
metadata: {name: fuzz}
spec:
  model: {provider: anthropic, name: fuzz-model}
  task: fuzz
  tools: []
  runtime: {type: echo}
"""


@dataclass
class Server:
    """One ``trioserve run`` on 127.0.0.1, port 0."""

    workdir: Path
    flags: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0
    url: str = ""
    _log_seen: int = 0

    @property
    def log_path(self) -> Path:
        return self.workdir / "server.log"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        spec = self.workdir / "fuzz.yaml"
        spec.write_text(SPEC)
        env = {**os.environ, "XDG_DATA_HOME": str(self.workdir / "xdg")}
        env["TRIOSERVE_ECHO_STATE_DIR"] = str(self.workdir / "echo-state")
        argv = [sys.executable, "-m", "trioserve", "run", str(spec), "--port", "0"]
        argv += ["--store", f"sqlite:{self.workdir / 'sessions.db'}", *self.flags]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stderr=log, env=env, cwd=self.workdir
            )
        deadline = time.monotonic() + 60
        while not (match := _URL.search(self.log())):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start:\n{self.log()}")
            time.sleep(0.05)
        self.url, self.port = match.group(1), int(match.group(2))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def new_log(self) -> str:
        """The log written since the last call."""
        text = self.log()
        new, self._log_seen = text[self._log_seen :], len(text)
        return new

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def children(self) -> set[int]:
        """The pids of the server's child processes (the reaper; adapters while turns run)."""
        found: set[int] = set()
        for task in os.listdir(f"/proc/{self.pid}/task"):
            path = f"/proc/{self.pid}/task/{task}/children"
            try:
                found |= {int(pid) for pid in Path(path).read_text().split()}
            except OSError:
                continue
        return found

    def healthz(self) -> str | None:
        """``None`` when ``GET /healthz`` answers ``200 ok``; else what it did."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=30) as sock:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                data = b""
                while chunk := sock.recv(65536):
                    data += chunk
        except OSError as exc:
            return f"GET /healthz: {exc}"
        head, _, body = data.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200 ") or body != b"ok\n":
            return f"GET /healthz: {data[:300]!r}"
        return None

    def check(self, findings: Findings, batch: str) -> None:
        """After a batch: healthy, and no traceback in the log."""
        problem = self.healthz()
        if problem is not None:
            findings.add("unhealthy", batch=batch, detail=problem)
        new = self.new_log()
        if "Traceback" in new:
            start = new.index("Traceback")
            findings.add("traceback", batch=batch, log=new[max(0, start - 300) : start + 3000])

    def stop(self, findings: Findings) -> None:
        """Drain with SIGTERM; a finding unless it exits 0 within 60 s."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
            findings.add("stop", detail="the server did not exit within 60 s of SIGTERM")
            return
        if code != 0:
            findings.add("stop", detail=f"exit status {code}", log=self.log()[-3000:])
        if "Traceback" in self.new_log():
            findings.add("traceback", batch="shutdown", log=self.log()[-3000:])
