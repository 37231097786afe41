"""The web console in a real Chromium, against ``trioserve run`` subprocesses.

What a user sees: a session created from the form, a turn's reply growing
in as it streams, its record in the event log, a cancel, a reload mid-turn,
a second tab's 409, the key prompt, and an adapter's markup shown as text.
One browser for the module; each test gets its own page (a fresh context:
its own sessionStorage).  Every test checks that nothing went wrong on the
browser's console.  Turns are the fake adapter's scripts, held at gates
(files the test creates) so that "before the end" is a state, not a time.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.helpers.browser import (
    CuttableProxy,
    RunningServer,
    Watched,
    chromium,
    chromium_or_skip,
    console_spec,
    served,
    watch,
)
from tests.helpers.keys import KEY_A, KEY_B, key_line
from tests.helpers.specs import script

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Dialog, Page

# Playwright's blocking API runs its own loop: these are plain tests, not Trio ones.
pytestmark = pytest.mark.timeout(120)

MESSAGE = re.compile(r"^Message")
#: A third tenant's key (gamma), for the test of its turn cap.
KEY_C = "ts_key-of-tenant-c"


#: Playwright's waits (expect, actions): a safety net, not a measurement. Its default (5 s)
#: is shorter than a turn's adapter start on a machine at load 20.
WAIT_MS = 30_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    chromium_or_skip()
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    with chromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("console")


@pytest.fixture(scope="module")
def server(browser: Browser, workdir: Path) -> Iterator[RunningServer]:
    with served(workdir / "open", console_spec(workdir)) as running:
        yield running


@pytest.fixture
def pages(browser: Browser) -> Iterator[list[Watched]]:
    """The test's pages (``open_page``), checked for console errors and closed at the end."""
    opened: list[Watched] = []
    yield opened
    for watched in opened:
        watched.page.context.close()
    for watched in opened:
        watched.check()


def open_page(browser: Browser, pages: list[Watched], url: str) -> Watched:
    from playwright.sync_api import expect

    context = browser.new_context()
    context.set_default_timeout(WAIT_MS)
    watched = watch(context.new_page())
    pages.append(watched)
    response = watched.page.goto(url)
    assert response is not None and response.status == 200
    expect(watched.page.locator("#server-status")).to_have_text("ready")
    return watched


def create_session(page: Page, name: str = "Ada") -> str:
    from playwright.sync_api import expect

    title = page.locator("#session-title")
    # The session shown before, if any: the new one must have replaced it.
    before = title.inner_text() if page.locator("#session-view").is_visible() else None
    page.get_by_label("name", exact=True).fill(name)
    page.get_by_role("button", name="Create session").click()
    expect(page.locator("#session-view")).to_be_visible()
    if before is not None:
        expect(title).not_to_have_text(before)
    expect(page.locator("#session-status")).to_have_text("active")
    return page.locator("#session-title").inner_text().removeprefix("Session ")


def say(text: str) -> dict[str, Any]:
    """A step of a script: a piece of the assistant's text."""
    return {"event": "message", "data": {"role": "assistant", "text": text, "delta": True}}


def send(page: Page, text: str) -> None:
    box = page.get_by_role("textbox", name=MESSAGE)
    box.fill(text)
    box.press("Enter")


def test_a_turn_streams_in_and_its_record_is_in_the_log(
    browser: Browser, server: RunningServer, workdir: Path, pages: list[Watched]
) -> None:
    from playwright.sync_api import expect

    page = open_page(browser, pages, server.url).page
    response = page.request.get(server.url)  # the page's own headers
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    expect(page.get_by_role("heading", name="console-agent")).to_be_visible()
    create_session(page)
    gate = workdir / "stream-gate"
    send(page, script(say("Hello"), {"wait": str(gate)}, say(", Ada!"), {"end": "completed"}))
    turn = page.locator("article.turn")
    reply = turn.locator(".assistant")
    # The first piece is on the page while the turn still runs...
    expect(reply).to_have_text("Hello")
    expect(turn).to_have_attribute("data-status", "running")
    expect(page.get_by_role("button", name="Cancel turn")).to_be_visible()
    gate.touch()
    # ...and the rest joins it, then the turn's record says how it ended.
    expect(reply).to_have_text("Hello, Ada!")
    expect(turn).to_have_attribute("data-status", "completed")
    expect(page.get_by_role("button", name="Cancel turn")).to_be_hidden()
    expect(page.get_by_role("textbox", name=MESSAGE)).to_have_value("")

    page.get_by_role("tab", name="Event log").click()
    records = page.locator("#turn-records tbody tr")
    expect(records).to_have_count(1)
    expect(records.locator("td").nth(1)).to_have_text("completed")
    expect(records.locator("td").nth(4)).to_have_text("4")  # started, two pieces, ended
    rows = page.locator("#log-table tbody tr")
    expect(rows).to_have_count(4)
    expect(rows.nth(0).locator("td").nth(2)).to_have_text("session.started")
    page.get_by_label("Type").select_option("message")
    expect(rows).to_have_count(2)
    page.get_by_label("raw JSON").check()
    expect(rows.nth(0).locator("pre")).to_contain_text('"seq": 2')
    with page.expect_download() as download:
        page.get_by_role("button", name="Download JSONL").click()
    lines = Path(download.value.path()).read_text().splitlines()
    types = [json.loads(line)["type"] for line in lines]
    assert types == ["session.started", "message", "message", "session.ended"]


def test_cancel_ends_a_long_turn(
    browser: Browser, server: RunningServer, pages: list[Watched]
) -> None:
    from playwright.sync_api import expect

    page = open_page(browser, pages, server.url).page
    create_session(page)
    send(page, script(say("Working"), {"hang": True}))
    turn = page.locator("article.turn")
    expect(turn.locator(".assistant")).to_have_text("Working")
    page.get_by_role("button", name="Cancel turn").click()
    expect(turn).to_have_attribute("data-status", "cancelled")
    expect(page.get_by_role("button", name="Cancel turn")).to_be_hidden()
    # End the session: the list's status filter finds it among the ended ones only.
    session = page.locator("#session-title").inner_text().removeprefix("Session ")
    page.get_by_role("button", name="End session").click()
    expect(page.locator("#session-status")).to_have_text("ended")
    expect(page.get_by_role("button", name="Send")).to_be_disabled()
    item = page.locator(f'#session-list [data-session="{session}"]')
    page.get_by_label("Status", exact=True).select_option("active")
    expect(item).to_have_count(0)
    page.get_by_label("Status", exact=True).select_option("ended")
    expect(item).to_contain_text("ended")


def test_a_reload_mid_turn_shows_the_rest_once(
    browser: Browser, server: RunningServer, workdir: Path, pages: list[Watched]
) -> None:
    from playwright.sync_api import expect

    page = open_page(browser, pages, server.url).page
    create_session(page)
    gate = workdir / "reload-gate"
    send(page, script(say("one"), {"wait": str(gate)}, say(" two"), {"end": "completed"}))
    reply = page.locator("article.turn .assistant")
    expect(reply).to_have_text("one")
    page.reload()
    turn = page.locator("article.turn")
    expect(turn).to_have_attribute("data-status", "running")
    expect(reply).to_have_text("one")
    gate.touch()
    expect(turn).to_have_attribute("data-status", "completed")
    expect(reply).to_have_text("one two")


def test_a_second_tab_on_a_busy_session_is_told_so(
    browser: Browser, server: RunningServer, workdir: Path, pages: list[Watched]
) -> None:
    from playwright.sync_api import expect

    first = open_page(browser, pages, server.url).page
    session = create_session(first)
    gate = workdir / "busy-gate"
    send(first, script(say("busy"), {"wait": str(gate)}, {"end": "completed"}))
    expect(first.locator("article.turn .assistant")).to_have_text("busy")
    second = open_page(browser, pages, f"{server.url}/#{session}")
    second.expect_error("409")  # the browser logs the refused request
    expect(second.page.locator("article.turn .assistant")).to_have_text("busy")
    send(second.page, "me too")
    expect(second.page.get_by_role("alert")).to_contain_text("This session is busy")
    gate.touch()
    for page in (first, second.page):
        expect(page.locator("article.turn")).to_have_attribute("data-status", "completed")


def test_by_keyboard_alone_adapter_markup_is_shown_as_text(
    browser: Browser, server: RunningServer, pages: list[Watched]
) -> None:
    from playwright.sync_api import expect

    watched = open_page(browser, pages, server.url)
    page = watched.page
    dialogs: list[str] = []

    def on_dialog(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    # Tab to the form's field, type, Enter: the session opens and the message box has
    # the focus; type, Enter: the turn runs.
    for _ in range(20):
        if page.evaluate("document.activeElement.dataset.input === 'name'"):
            break
        page.keyboard.press("Tab")
    page.keyboard.type("Ada")
    page.keyboard.press("Enter")
    expect(page.locator("#session-status")).to_have_text("active")
    expect(page.get_by_role("textbox", name=MESSAGE)).to_be_focused()
    markup = "<img src=x onerror=alert(1)>"
    warning = {"event": "warning", "data": {"message": markup}}
    page.keyboard.type(script(say(markup), warning, {"end": "completed"}))
    page.keyboard.press("Enter")
    turn = page.locator("article.turn")
    expect(turn.locator(".assistant")).to_have_text(markup)
    expect(turn.locator("details.event-card summary")).to_have_text(f"warning: {markup}")
    expect(turn).to_have_attribute("data-status", "completed")
    assert page.locator("#transcript img").count() == 0
    assert dialogs == []
    # Readable on a phone: at 375 px nothing is wider than the screen.
    page.set_viewport_size({"width": 375, "height": 700})
    assert page.evaluate("document.documentElement.scrollWidth") <= 375


@pytest.fixture(scope="module")
def keyed(browser: Browser, workdir: Path) -> Iterator[RunningServer]:
    keys = workdir / "keys.txt"
    lines = [key_line(KEY_A, "alpha"), key_line(KEY_B, "beta"), key_line(KEY_C, "gamma")]
    keys.write_text("\n".join(lines) + "\n")
    # One turn at a time per tenant: the 429 test's tenant (gamma) is its own.
    flags = ["--api-keys", str(keys), "--max-turns-per-tenant", "1"]
    with served(workdir / "keyed", console_spec(workdir), *flags) as running:
        yield running


def enter_key(page: Page, key: str) -> None:
    from playwright.sync_api import expect

    dialog = page.get_by_role("dialog", name="API key")
    expect(dialog).to_be_visible()
    dialog.get_by_label("Key", exact=True).fill(key)
    dialog.get_by_role("button", name="Use this key").click()


def test_keys_are_asked_for_and_tenants_see_their_own(
    browser: Browser, keyed: RunningServer, pages: list[Watched]
) -> None:
    from playwright.sync_api import expect

    alpha = open_page(browser, pages, keyed.url)
    alpha.expect_error("401")
    page = alpha.page
    expect(page.get_by_role("dialog", name="API key")).to_contain_text("needs an API key")
    enter_key(page, "ts_wrong-key")
    expect(page.get_by_role("dialog", name="API key")).to_contain_text("The key was refused")
    enter_key(page, KEY_A)
    expect(page.get_by_role("dialog", name="API key")).to_be_hidden()
    session = create_session(page)
    send(page, "hello")
    expect(page.locator("article.turn")).to_have_attribute("data-status", "completed")
    # The key is this tab's: in sessionStorage, never in the URL or a cookie.
    assert page.evaluate("sessionStorage.getItem('trioserve.apiKey')") == KEY_A
    assert KEY_A not in page.url and page.context.cookies() == []

    beta = open_page(browser, pages, f"{keyed.url}/#{session}")
    beta.expect_error("401")
    beta.expect_error("404")
    enter_key(beta.page, KEY_B)
    expect(beta.page.get_by_role("alert")).to_contain_text("Not found")
    expect(beta.page.locator("#session-list")).to_have_text("No sessions.")
    expect(page.locator(f'[data-session="{session}"]')).to_be_visible()


def test_a_turn_over_the_cap_is_told_with_its_countdown(
    browser: Browser, keyed: RunningServer, workdir: Path, pages: list[Watched]
) -> None:
    """``--max-turns-per-tenant 1``: a second session's turn gets 429 and its Retry-After."""
    from playwright.sync_api import expect

    watched = open_page(browser, pages, keyed.url)
    watched.expect_error("401")
    watched.expect_error("429")
    page = watched.page
    enter_key(page, KEY_C)
    first = create_session(page)
    gate = workdir / "cap-gate"
    send(page, script(say("first"), {"wait": str(gate)}, {"end": "completed"}))
    expect(page.locator("article.turn .assistant")).to_have_text("first")
    create_session(page, "Bob")
    # Every text the message takes, however fast the countdown runs on a loaded machine.
    page.evaluate(
        """() => {
          window.notices = [];
          const text = document.getElementById("notice-text");
          new MutationObserver(() => window.notices.push(text.textContent))
            .observe(text, { childList: true, characterData: true, subtree: true });
        }"""
    )
    try:
        send(page, "second")
        notice = page.get_by_role("alert")
        expect(notice).to_contain_text("Too many requests")
        expect(notice).to_contain_text("You can try again now.")
        notices = page.evaluate("window.notices")
        assert any(n.endswith("Try again in 1 s.") for n in notices), notices
    finally:
        gate.touch()
    page.goto(f"{keyed.url}/#{first}")
    expect(page.locator("article.turn")).to_have_attribute("data-status", "completed")


def test_a_dropped_connection_reopens_from_the_last_seq(
    browser: Browser, server: RunningServer, workdir: Path, pages: list[Watched]
) -> None:
    from playwright.sync_api import expect

    proxy = CuttableProxy(server.url)
    try:
        watched = open_page(browser, pages, proxy.url)
        watched.expect_error("net::ERR_")  # the cut, as the browser logs it
        page = watched.page
        create_session(page)
        gate = workdir / "drop-gate"
        send(page, script(say("before"), {"wait": str(gate)}, say(" after"), {"end": "completed"}))
        reply = page.locator("article.turn .assistant")
        expect(reply).to_have_text("before")
        assert proxy.cut() > 0
        turn = page.locator("article.turn")
        expect(turn).to_have_attribute("data-reconnects", "1")  # the page saw the drop
        gate.touch()
        expect(turn).to_have_attribute("data-status", "completed")
        expect(reply).to_have_text("before after")
        expect(page.locator("#turn-state")).to_have_text("")
    finally:
        proxy.close()


APPROVAL_ADAPTER = Path(__file__).parents[1] / "helpers" / "approval_adapter.py"


def approval_spec(directory: Path) -> Path:
    """An agent whose one tool, ``deploy``, needs an approval (``helpers/approval_adapter``:
    the wire protocol's approvals extension); each turn deploys its input."""
    directory.mkdir(parents=True, exist_ok=True)
    command = json.dumps([sys.executable, str(APPROVAL_ADAPTER)])
    path = directory / "deployer.yaml"
    path.write_text(
        "apiVersion: agent-controller.dev/v1alpha1\nkind: Agent\n"
        "metadata:\n  name: deployer\n"
        "spec:\n  model:\n    provider: anthropic\n    name: none\n"
        "  task: Deploy for ${inputs.name}.\n  tools: []\n"
        f"  runtime:\n    type: exec\n    command: {command}\n"
        '    options: {requireApproval: "deploy"}\n'
    )
    return path


def test_a_waiting_tool_call_is_approved_or_denied_from_the_page(
    browser: Browser, workdir: Path, pages: list[Watched]
) -> None:
    from playwright.sync_api import expect

    directory = workdir / "approvals"
    with served(directory, approval_spec(directory)) as running:
        page = open_page(browser, pages, running.url).page
        session_id = create_session(page)
        send(page, "prod")
        turn = page.locator("article.turn").nth(0)
        card = turn.locator("section.approval")
        expect(card.locator(".approval-tool")).to_have_text("deploy")
        expect(card.locator(".approval-arguments")).to_contain_text('"target": "prod"')
        expect(card).to_have_attribute("data-state", "pending")
        expect(page.get_by_role("button", name="Cancel turn")).to_be_visible()
        card.get_by_role("button", name="Approve").click()
        expect(card).to_have_attribute("data-state", "approved")
        expect(card.get_by_role("button", name="Approve")).to_have_count(0)
        expect(turn.locator(".assistant")).to_have_text("deployed prod")
        expect(turn).to_have_attribute("data-status", "completed")

        send(page, "qa")
        second = page.locator("article.turn").nth(1)
        denied = second.locator("section.approval")
        expect(denied.locator(".approval-arguments")).to_contain_text('"target": "qa"')
        denied.get_by_role("button", name="Deny").click()
        expect(denied).to_have_attribute("data-state", "denied")
        expect(second.locator(".assistant")).to_contain_text("not deployed: denied")
        expect(second).to_have_attribute("data-status", "completed")

        listed = page.request.get(f"{running.url}/v1/sessions/{session_id}/approvals").json()
        assert [(a["tool"], a["status"]) for a in listed] == [
            ("deploy", "approved"),
            ("deploy", "denied"),
        ]
