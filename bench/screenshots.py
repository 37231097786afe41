"""Screenshots of the web console's main views, for docs/console.md and the README.

    python -m bench.screenshots [DIR]     (default: docs/images)

Runs ``trioserve run examples/echo.yaml`` (and a second one with API keys) on free
ports with the same Chromium as the browser tests (``chromium`` on ``PATH``, or
``$TRIOSERVE_TEST_CHROMIUM``), makes a session with two turns, and saves:
``console-conversation.png``, ``console-event-log.png``, ``console-key-prompt.png``
and ``console-phone-dark.png`` (375 px wide, dark scheme).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.server import trioserve_argv

ROOT = Path(__file__).resolve().parent.parent
_URL = re.compile(r" on (http://\S+) ")
#: The key of the keyed server (made up: the server keeps its digest only).
DEMO_KEY = "ts_demo-key-for-screenshots"


@contextmanager
def served(workdir: Path, *flags: str) -> Iterator[str]:
    """``trioserve run examples/echo.yaml`` until the block ends; yields its URL."""
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "server.log"
    env = dict(os.environ, XDG_DATA_HOME=str(workdir / "xdg"))
    argv = [*trioserve_argv(), "run", str(ROOT / "examples" / "echo.yaml"), "--port", "0"]
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [*argv, "--in-memory", *flags],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=sink,
            env=env,
        )
    try:
        deadline = time.monotonic() + 60
        while not (match := _URL.search(log.read_text(errors="replace"))):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not start:\n{log.read_text()}")
            time.sleep(0.05)
        yield match.group(1)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def _turn(page: Any, text: str, number: int) -> None:
    box = page.get_by_role("textbox", name=re.compile("^Message"))
    box.fill(text)
    box.press("Enter")
    turns = page.locator('article.turn[data-status="completed"]')
    turns.nth(number - 1).wait_for()


def take(out: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    chromium = os.environ.get("TRIOSERVE_TEST_CHROMIUM") or shutil.which("chromium")
    if not chromium:
        raise SystemExit("no Chromium: apt-get install chromium, or set TRIOSERVE_TEST_CHROMIUM")
    out.mkdir(parents=True, exist_ok=True)
    saved: list[Path] = []
    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    with (
        tempfile.TemporaryDirectory() as tmp,
        served(Path(tmp) / "open") as url,
        sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(executable_path=chromium, args=args)
        page = browser.new_page(viewport={"width": 1200, "height": 760})
        page.goto(url)
        page.get_by_label("name", exact=True).fill("Ada")
        page.get_by_role("button", name="Create session").click()
        page.locator("#session-view:not([hidden])").wait_for()
        _turn(page, "", 1)
        _turn(page, "How are you?", 2)
        page.get_by_role("textbox", name=re.compile("^Message")).fill("And tomorrow?")
        saved.append(out / "console-conversation.png")
        page.screenshot(path=saved[-1])
        page.get_by_role("tab", name="Event log").click()
        page.locator("#log-table tbody tr").first.wait_for()
        saved.append(out / "console-event-log.png")
        page.screenshot(path=saved[-1])
        phone = browser.new_page(
            viewport={"width": 375, "height": 760}, color_scheme="dark", device_scale_factor=1
        )
        phone.goto(page.url)
        phone.locator('article.turn[data-status="completed"]').nth(1).wait_for()
        phone.locator("#turns-panel").scroll_into_view_if_needed()
        saved.append(out / "console-phone-dark.png")
        phone.screenshot(path=saved[-1])
        browser.close()
    with tempfile.TemporaryDirectory() as tmp:
        keys = Path(tmp) / "keys.txt"
        keys.write_text(f"sha256:{hashlib.sha256(DEMO_KEY.encode()).hexdigest()} demo\n")
        with served(Path(tmp) / "keyed", "--api-keys", str(keys)) as url, sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=args)
            page = browser.new_page(viewport={"width": 1200, "height": 560})
            page.goto(url)
            page.get_by_role("dialog", name="API key").wait_for()
            page.get_by_label("Key", exact=True).fill("not-the-key")
            page.get_by_role("button", name="Use this key").click()
            page.get_by_text("The key was refused").wait_for()
            saved.append(out / "console-key-prompt.png")
            page.screenshot(path=saved[-1])
            browser.close()
    return saved


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else ROOT / "docs" / "images"
    for path in take(out):
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
