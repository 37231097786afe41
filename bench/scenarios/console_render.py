"""Scenario console-render: a turn of 10,000 events in the web console, in a real Chromium,
from Enter to its last character on the page, and the longest frame meanwhile."""

from __future__ import annotations

import os
import shutil
import statistics
from dataclasses import dataclass
from typing import Any

import httpx

from bench import BenchError
from bench.adapter import adapter_command
from bench.client import create
from bench.results import Result
from bench.scenarios import scenario
from bench.server import Context

#: Set in the page: when Enter went down in the message box, each frame's gap, when the
#: reply's last character was there (``performance.now()`` milliseconds).
_WATCH = """(n) => {
  const box = document.getElementById("message");
  const state = { start: null, done: null, gaps: [] };
  window.__bench = state;
  const enter = (e) => { if (e.key === "Enter") state.start = performance.now(); };
  box.addEventListener("keydown", enter, { capture: true, once: true });
  let last = performance.now();
  const frame = (now) => {
    if (state.start !== null) state.gaps.push(now - last);
    last = now;
    const reply = document.querySelector("article.turn .assistant");
    if (reply && reply.textContent.length >= n) { state.done = performance.now(); return; }
    requestAnimationFrame(frame);
  };
  requestAnimationFrame(frame);
}"""


@dataclass(frozen=True)
class Sizes:
    events: int = 10_000  # message events in the turn
    runs: int = 3  # after one that warms up


def _chromium() -> str:
    path = os.environ.get("TRIOSERVE_TEST_CHROMIUM") or (
        shutil.which("chromium") or shutil.which("chromium-browser")
    )
    if not path:
        raise BenchError("no Chromium found (apt-get install chromium, or TRIOSERVE_TEST_CHROMIUM)")
    return path


def _expected(n: int) -> str:
    """The reply: tinyadapter N's messages (``chunk 0``, ``chunk 1``, …), joined."""
    return "".join(f"chunk {i}" for i in range(n))


def _one_turn(page: Any, url: str, client: httpx.Client, n: int) -> dict[str, float]:
    sid = create(client)
    page.goto(f"{url}/#{sid}")
    page.wait_for_selector("#session-view:not([hidden])")
    page.wait_for_function("document.getElementById('session-status').textContent === 'active'")
    expected = _expected(n)
    page.evaluate(_WATCH, len(expected))
    page.get_by_role("textbox", name="Message").press("Enter")
    page.wait_for_function("window.__bench.done !== null", timeout=120_000)
    state = page.evaluate("window.__bench")
    shown = page.locator("article.turn .assistant").text_content()
    if shown != expected:
        raise BenchError(f"the reply on the page differs: {len(shown or '')} of {len(expected)}")
    page.wait_for_selector('article.turn[data-status="completed"]')
    gaps = state["gaps"] or [0.0]
    return {
        "to_last_char_ms": round(state["done"] - state["start"], 1),
        "longest_frame_ms": round(max(gaps), 1),
        "frames": len(gaps),
    }


@scenario(
    "console-render",
    "console-render",
    full=Sizes(),
    quick=Sizes(events=2_000, runs=1),
)
def console_render(ctx: Context, p: Sizes) -> Result:
    """a 10,000-event turn in the web console (Chromium): Enter to last character
    [<= 2 s; longest frame <= 250 ms]

    tinyadapter N prints N assistant messages; the console follows the turn from the
    event log and joins their text once per animation frame.  Measured in the page
    (performance.now()): from the Enter keydown to the frame that shows the whole reply,
    and the longest gap between two frames meanwhile (a frozen page shows as one long
    frame).  Needs Chromium and the playwright package (the test extra).
    """
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise BenchError("the playwright package is not installed (the test extra)") from None
    n = p.events
    res = Result("console-render", f"a {n:,}-event turn in the web console, Chromium")
    runs: list[dict[str, float]] = []
    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    with (
        ctx.server("console-render", adapter_command(str(n)), ["--in-memory"]) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as client,
        sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(executable_path=_chromium(), args=args)
        try:
            # Playwright's waits evaluate strings, which the console's CSP forbids.
            context = browser.new_context(bypass_csp=True)
            for i in range(1 + p.runs):  # the first run warms up
                page = context.new_page()
                run = _one_turn(page, srv.url, client, n)
                page.close()
                if i:
                    runs.append(run)
        finally:
            browser.close()
    res.details = {"events": n, "runs": runs}
    last = statistics.median(r["to_last_char_ms"] for r in runs)
    frame = max(r["longest_frame_ms"] for r in runs)
    res.add("Enter to last character (median)", last, "ms", "<= 2000 ms", last <= 2000)
    res.add("longest frame (max)", frame, "ms", "<= 250 ms", frame <= 250)
    return res
