// The console: the agent, its sessions, a session's turns live and its event
// log, over the public API (api.js) with the key the user typed.

import { ApiError, call, describe, getJSON, keys, sendJSON, whenUnauthorized } from "./api.js";
import { EventLog } from "./eventlog.js";
import { ServerPanel } from "./server.js";
import { TurnView, follow } from "./turns.js";
import { $, clear, dateTime, el } from "./ui.js";

const PAGE = 20;
const log = new EventLog();
const state = {
  agent: null,
  sessionId: null,
  views: new Map(), // turn id -> TurnView of the open session
  abort: null, // aborts the open session's streams
  running: null, // the TurnView of the turn running in the open session
  nextPage: null, // the sessions list's next page token
};

// --- messages -------------------------------------------------------------

let countdown = null;

function notify(text) {
  clearInterval(countdown);
  $("notice-text").textContent = text;
  $("notice").hidden = !text;
}

function refuse(error) {
  if (error && error.name === "AbortError") return;
  if (error instanceof ApiError && error.status === 401) return; // the key dialog says it
  const text = describe(error);
  notify(text);
  if (error instanceof ApiError && error.status === 429 && error.retryAfter) {
    let left = error.retryAfter;
    const tick = () => {
      $("notice-text").textContent = left > 0 ? `${text} Try again in ${left} s.` : `${text} You can try again now.`;
      left -= 1;
      if (left < 0) clearInterval(countdown);
    };
    tick();
    countdown = setInterval(tick, 1000);
  }
}

// --- the API key ------------------------------------------------------------

function askForKey(error) {
  const dialog = $("key-dialog");
  $("key-reason").textContent = keys.get()
    ? `The key was refused: ${error ? error.message : "not valid"}. Enter another.`
    : "This server needs an API key.";
  $("key-button").hidden = false;
  if (!dialog.open) dialog.showModal();
  $("key-input").focus();
}

whenUnauthorized(askForKey);

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  keys.set($("key-input").value.trim());
  $("key-input").value = "";
  $("key-dialog").close();
  notify("");
  start();
});
$("key-forget").addEventListener("click", () => {
  keys.forget();
  $("key-reason").textContent = "The key is forgotten. Enter a key to go on.";
});
$("key-button").addEventListener("click", () => askForKey(null));

// --- the agent and new sessions --------------------------------------------

function showAgent(agent) {
  state.agent = agent;
  $("agent-name").textContent = agent.name;
  $("agent-description").textContent = agent.description || "";
  const facts = [
    ["Runtime", agent.runtimeType],
    ["Model", `${agent.model.provider} / ${agent.model.name}`],
    ["Inputs", agent.inputs.length ? agent.inputs.join(", ") : "none"],
  ];
  $("agent-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  $("agent-task").textContent = agent.task;
  const fields = agent.inputs.map((name, i) =>
    el(
      "div",
      { class: "field" },
      el("label", { for: `input-${i}` }, name),
      el("input", { id: `input-${i}`, name, "data-input": name, autocomplete: "off" }),
    ),
  );
  $("create-inputs").replaceChildren(...fields);
  document.title = `${agent.name} · trioserve console`;
}

$("create-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const inputs = {};
  for (const input of $("create-inputs").querySelectorAll("input[data-input]")) {
    inputs[input.dataset.input] = input.value;
  }
  try {
    const session = await sendJSON("POST", "/v1/sessions", { inputs });
    notify("");
    await loadSessions();
    await openSession(session.id);
    $("message").focus();
  } catch (error) {
    refuse(error);
  }
});

// --- the sessions list ------------------------------------------------------

async function loadSessions(more = false) {
  const params = new URLSearchParams({ limit: String(PAGE) });
  const status = $("status-filter").value;
  if (status) params.set("status", status);
  if (more && state.nextPage) params.set("before", state.nextPage);
  const response = await call("GET", `/v1/sessions?${params}`);
  const sessions = await response.json();
  state.nextPage = response.headers.get("Trioserve-Next-Page");
  const list = $("session-list");
  if (!more) clear(list);
  for (const session of sessions) {
    list.append(
      el(
        "li",
        {},
        el(
          "button",
          {
            type: "button",
            class: "session-item",
            "data-session": session.id,
            "aria-current": session.id === state.sessionId ? "true" : null,
            onclick: () => openSession(session.id).catch(refuse),
          },
          el("code", {}, session.id),
          " ",
          el("span", { class: "badge", "data-status": session.status }, session.status),
          el("span", { class: "muted small" }, ` last active ${dateTime(session.lastActiveAt)}`),
        ),
      ),
    );
  }
  if (!more && !sessions.length) list.append(el("li", { class: "muted" }, "No sessions."));
  $("more-sessions").hidden = !state.nextPage;
}

$("status-filter").addEventListener("change", () => loadSessions().catch(refuse));
$("refresh-sessions").addEventListener("click", () => loadSessions().catch(refuse));
$("more-sessions").addEventListener("click", () => loadSessions(true).catch(refuse));

// --- a session --------------------------------------------------------------

function sessionPath(suffix = "") {
  return `/v1/sessions/${encodeURIComponent(state.sessionId)}${suffix}`;
}

function showSession(session) {
  $("session-title").textContent = `Session ${session.id}`;
  $("session-status").textContent = session.status;
  $("session-status").dataset.status = session.status;
  $("session-active").textContent = `last active ${dateTime(session.lastActiveAt)}`;
  const active = session.status === "active";
  $("send").disabled = !active;
  $("end-session").disabled = !active;
}

async function openSession(id) {
  if (state.abort) state.abort.abort();
  state.abort = new AbortController();
  state.sessionId = id;
  state.views = new Map();
  state.running = null;
  history.replaceState(null, "", `#${id}`);
  for (const item of document.querySelectorAll(".session-item")) {
    item.toggleAttribute("aria-current", item.dataset.session === id);
  }
  $("empty").hidden = true;
  $("session-view").hidden = false;
  clear($("transcript"));
  setRunning(null);
  let session, turns, events;
  try {
    [session, turns, events] = await Promise.all([
      getJSON(sessionPath()),
      getJSON(sessionPath("/turns")),
      getJSON(sessionPath("/events?format=json")),
    ]);
  } catch (error) {
    if (state.sessionId === id) closeSession();
    throw error;
  }
  if (state.sessionId !== id) return;
  showSession(session);
  for (const record of turns) addTurn(record);
  for (const event of events) {
    const view = turns.find((t) => t.firstSeq !== null && event.seq >= t.firstSeq && (t.lastSeq === null || event.seq <= t.lastSeq));
    if (view) state.views.get(view.id).push(event);
  }
  const running = turns.find((t) => t.status === "running" || t.status === "waiting");
  if (running) attach(state.views.get(running.id));
  if (!$("log-panel").hidden) log.load(id).catch(refuse);
}

function closeSession() {
  if (state.abort) state.abort.abort();
  state.sessionId = null;
  history.replaceState(null, "", location.pathname);
  $("session-view").hidden = true;
  $("empty").hidden = false;
}

function addTurn(record) {
  const view = new TurnView(record);
  state.views.set(record.id, view);
  $("transcript").append(view.node);
  return view;
}

function setRunning(view) {
  state.running = view;
  $("cancel").hidden = !view;
  $("turn-state").textContent = view ? "The turn is running…" : "";
}

// Follow a running turn to its end, then show its record.
async function attach(view) {
  setRunning(view);
  const sessionId = state.sessionId;
  const signal = state.abort.signal;
  try {
    await follow(view, sessionId, signal, (problem) => {
      $("turn-state").textContent = problem || "The turn is running…";
    });
  } catch (error) {
    refuse(error);
  }
  if (signal.aborted) return;
  try {
    view.update(await getJSON(`/v1/sessions/${encodeURIComponent(sessionId)}/turns/${encodeURIComponent(view.record.id)}`));
    showSession(await getJSON(`/v1/sessions/${encodeURIComponent(sessionId)}`));
  } catch (error) {
    refuse(error);
  }
  if (state.running === view) setRunning(null);
  if (!$("log-panel").hidden) log.load(sessionId).catch(refuse);
}

async function send() {
  if (!state.sessionId) return;
  const input = $("message").value;
  try {
    // detached: the turn runs on if this page goes away, and is followed from the event log
    const record = await sendJSON("POST", sessionPath("/turns"), { input, detach: true });
    notify("");
    $("message").value = "";
    attach(addTurn(record));
  } catch (error) {
    refuse(error);
    if (error instanceof ApiError && error.status === 409) {
      adoptRunningTurn().catch(() => {});
    }
  }
}

// A turn another tab or client started: show it and follow it.
async function adoptRunningTurn() {
  const turns = await getJSON(sessionPath("/turns"));
  const running = turns.find((t) => t.status === "running" || t.status === "waiting");
  if (!running || state.views.has(running.id) || state.running) return;
  attach(addTurn(running));
}

$("turn-form").addEventListener("submit", (event) => {
  event.preventDefault();
  send();
});
$("message").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    send();
  }
});
$("cancel").addEventListener("click", async () => {
  try {
    await call("DELETE", sessionPath("/turns/current"));
    $("turn-state").textContent = "Cancelling…";
  } catch (error) {
    refuse(error);
  }
});
$("end-session").addEventListener("click", async () => {
  try {
    await call("DELETE", sessionPath());
    showSession(await getJSON(sessionPath()));
    await loadSessions();
  } catch (error) {
    refuse(error);
  }
});

// --- tabs and the event log ---------------------------------------------------

function showTab(name) {
  const onLog = name === "log";
  $("tab-turns").setAttribute("aria-selected", String(!onLog));
  $("tab-log").setAttribute("aria-selected", String(onLog));
  $("turns-panel").hidden = onLog;
  $("log-panel").hidden = !onLog;
  if (onLog && state.sessionId) log.load(state.sessionId).catch(refuse);
}

$("tab-turns").addEventListener("click", () => showTab("turns"));
$("tab-log").addEventListener("click", () => showTab("log"));
$("log-refresh").addEventListener("click", () => log.load(state.sessionId).catch(refuse));
$("log-download").addEventListener("click", () => log.download());
$("notice-close").addEventListener("click", () => notify(""));

// --- start ------------------------------------------------------------------

async function start() {
  try {
    showAgent(await getJSON("/v1/agent"));
    await loadSessions();
    const wanted = location.hash.slice(1);
    if (wanted && wanted !== state.sessionId) await openSession(wanted);
  } catch (error) {
    refuse(error);
  }
}

// A session's address (/#s_…) typed, or back and forward: open it.
window.addEventListener("hashchange", () => {
  const wanted = location.hash.slice(1);
  if (wanted && wanted !== state.sessionId) openSession(wanted).catch(refuse);
});

new ServerPanel().start();
start();
