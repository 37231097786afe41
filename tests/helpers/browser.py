"""A real Chromium for the web console's tests (Playwright), and the servers it opens.

Playwright drives the system's Chromium (``executable_path``: its own browser
download is not used): ``$TRIOSERVE_TEST_CHROMIUM``, else ``chromium`` or
``chromium-browser`` on ``PATH``.  Without one (or without the ``playwright``
package) the browser tests skip, saying why; under ``CI=true`` they fail
(``.ci/run`` installs Chromium).  The tests are plain functions, not Trio
ones: Playwright's blocking API runs its own loop, and the servers are
``trioserve run`` subprocesses whose log goes to a file (nothing to pump).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.helpers.cli import STARTUP_URL, cli_env
from tests.helpers.specs import FAKE_ADAPTER

if TYPE_CHECKING:
    from playwright.sync_api import Browser, ConsoleMessage, Page

#: The command of the servers (``served``).
TRIOSERVE_RUN = (sys.executable, "-m", "trioserve", "run")
#: What the tests' servers run with: a fresh store, no warm adapter (turns start their own).
SERVED_FLAGS = ("--in-memory", "--warm-adapters", "0")
#: Where a test may name its Chromium.
CHROMIUM_ENV = "TRIOSERVE_TEST_CHROMIUM"


def find_chromium() -> str | None:
    """The Chromium the tests drive, or ``None``."""
    named = os.environ.get(CHROMIUM_ENV)
    if named:
        return named if os.access(named, os.X_OK) else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


def chromium_or_skip() -> str:
    """The Chromium's path; without one (or Playwright) skip, or fail under ``CI=true``."""
    problem = None
    path = find_chromium()
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        problem = "the playwright package is not installed (pip install -e '.[test]')"
    if path is None:
        problem = (
            f"no Chromium found (apt-get install chromium, or set {CHROMIUM_ENV}"
            " to a Chromium binary)"
        )
    if problem is None:
        assert path is not None
        return path
    if os.environ.get("CI") == "true":
        pytest.fail(f"browser tests cannot run under CI=true: {problem}", pytrace=False)
    pytest.skip(f"browser tests skipped: {problem}")


@contextmanager
def chromium() -> Iterator[Browser]:
    """A headless Chromium, closed at the end."""
    from playwright.sync_api import sync_playwright

    path = chromium_or_skip()
    # As root (CI), Chromium refuses to start in its sandbox.
    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, args=args)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class Watched:
    """A page, and what went wrong on it: console errors and uncaught exceptions."""

    page: Page
    problems: list[str] = field(default_factory=list)
    #: Console errors the test provoked on purpose (a refused request is logged by the
    #: browser as "Failed to load resource: … 409"), by a part of their text.
    expected: list[str] = field(default_factory=list)

    def expect_error(self, text: str) -> None:
        self.expected.append(text)

    def check(self) -> None:
        """No error the test did not provoke was shown on the page's console."""
        unexpected = [p for p in self.problems if not any(e in p for e in self.expected)]
        assert unexpected == [], f"errors on the browser console: {unexpected}"


def watch(page: Page) -> Watched:
    """Record ``page``'s console errors and uncaught exceptions."""
    watched = Watched(page)

    def console(message: ConsoleMessage) -> None:
        if message.type in ("error", "warning"):
            watched.problems.append(f"console {message.type}: {message.text}")

    page.on("console", console)
    page.on("pageerror", lambda error: watched.problems.append(f"page error: {error}"))
    return watched


def console_spec(directory: Path) -> Path:
    """An agent whose turns are the fake adapter's scripts; its task takes ``${inputs.name}``."""
    command = ", ".join(f'"{part}"' for part in FAKE_ADAPTER)
    path = directory / "console-agent.yaml"
    path.write_text(
        "apiVersion: agent-controller.dev/v1alpha1\n"
        "kind: Agent\n"
        "metadata:\n  name: console-agent\n  description: The fake adapter, for the console.\n"
        "spec:\n"
        "  model:\n    provider: anthropic\n    name: claude-sonnet-4-20250514\n"
        "  task: Say hello to ${inputs.name}.\n"
        "  tools: []\n"
        f"  runtime:\n    type: exec\n    command: [{command}]\n"
    )
    return path


@dataclass
class RunningServer:
    """A ``trioserve run`` subprocess; its log is the file ``log``."""

    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self) -> None:
        """Drain and stop it (SIGTERM twice: a turn a test left running is not waited for)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextmanager
def served(directory: Path, spec: Path, *args: str) -> Iterator[RunningServer]:
    """``trioserve run SPEC --port 0 --in-memory ARGS`` until the block ends."""
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "server.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [
                *TRIOSERVE_RUN,
                str(spec),
                "--port",
                "0",
                "--in-memory",
                "--warm-adapters",
                "0",
                *args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=sink,
            env=cli_env(directory),
            cwd=directory,
        )
    server = None
    try:
        deadline = time.monotonic() + 30  # a safety net: the startup line, or the exit
        while server is None:
            if match := re.search(STARTUP_URL, log.read_text(errors="replace")):
                server = RunningServer(proc, match.group(1), log)
            elif proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the server did not start:\n{log.read_text()}")
            else:
                time.sleep(0.02)
        yield server
    finally:
        if server is not None:
            server.stop()
        elif proc.poll() is None:
            proc.kill()
            proc.wait()


class CuttableProxy:
    """A TCP proxy on 127.0.0.1 in threads, whose open connections ``cut`` closes:
    a dropped line between the browser and the server (``url`` is the proxy's)."""

    def __init__(self, target: str) -> None:
        host, port = target.removeprefix("http://").rsplit(":", 1)
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(self._target)
            with self._lock:
                self._open |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            self._close(source, sink)

    def _close(self, *sockets: socket.socket) -> None:
        """``shutdown``, then ``close``: the shutdown sends the FIN at once and wakes the
        pump blocked in ``recv`` on the socket (a ``close`` alone would wait for it)."""
        for s in sockets:
            with self._lock:
                self._open.discard(s)
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def cut(self) -> int:
        """Close every open connection mid-stream (a dropped line); how many there were."""
        with self._lock:
            opened = list(self._open)
        self._close(*opened)
        return len(opened)

    def close(self) -> None:
        self._listener.close()
        self.cut()
