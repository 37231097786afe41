// A turn on the page: the user's input, the assistant's reply as it streams
// (data.text deltas joined), tool calls, warnings and errors as compact
// cards that expand to their JSON.  Events are queued as they arrive and
// applied once per animation frame, so a turn of 10,000 events does not
// freeze the page.  An event whose seq was already shown is dropped: a
// re-opened stream never doubles text.

import { call } from "./api.js";
import { ApprovalCard } from "./approvals.js";
import { sseEvents } from "./sse.js";
import { duration, el, json } from "./ui.js";

const dirty = new Set();
let scheduled = false;

function schedule(view) {
  dirty.add(view);
  if (scheduled) return;
  scheduled = true;
  requestAnimationFrame(flushAll);
  setTimeout(flushAll, 250); // a hidden tab gets no animation frames
}

function flushAll() {
  if (!scheduled) return;
  scheduled = false;
  const views = [...dirty];
  dirty.clear();
  for (const view of views) view.flush();
}

// What a card says before it is opened.
function summary(event) {
  const data = event.data || {};
  const name = data.toolName || data.name || data.tool || "";
  switch (event.type) {
    case "tool.call":
    case "tool.started":
      return `tool call ${name}`;
    case "tool.result":
    case "tool.completed":
      return `tool result ${name}${data.isError ? " (error)" : ""}`;
    case "tool.failed":
      return `tool failed ${name}`;
    case "warning":
      return `warning: ${data.message || data.reason || ""}`;
    case "error":
      return `error: ${data.message || data.reason || ""}`;
    case "model.request":
      return `model request${data.model ? ` (${data.model})` : ""}`;
    case "model.response":
      return "model response";
    default:
      return event.type;
  }
}

export class TurnView {
  constructor(record) {
    this.record = record;
    this.lastSeq = 0;
    this.queue = [];
    this.streamed = false; // deltas shown since the last whole message
    this.ended = null; // session.ended's reason
    this.text = null; // the text node the reply grows in
    this.approvals = new Map(); // approvalId -> its ApprovalCard
    this.statusNode = el("span", { class: "badge" });
    this.timeNode = el("span", { class: "muted" });
    this.reply = el("div", { class: "reply" });
    this.node = el(
      "article",
      { class: "turn", "data-turn": record.id, "aria-label": `Turn ${record.id}` },
      el("header", { class: "row" }, el("code", {}, record.id), this.statusNode, this.timeNode),
      el("p", { class: "user" }, record.input === "" ? "(the task)" : record.input),
      this.reply,
    );
    this.update(record);
  }

  get running() {
    return this.record.status === "running" || this.record.status === "waiting";
  }

  update(record) {
    this.record = record;
    this.statusNode.textContent = record.reason && record.reason !== record.status
      ? `${record.status}: ${record.reason}`
      : record.status;
    this.statusNode.dataset.status = record.status;
    this.timeNode.textContent = duration(record.startedAt, record.endedAt);
    this.node.dataset.status = record.status;
  }

  push(event) {
    if (event.seq <= this.lastSeq) return;
    this.lastSeq = event.seq;
    this.queue.push(event);
    schedule(this);
  }

  // The queued events, in one DOM update.
  flush() {
    const out = document.createDocumentFragment();
    let text = "";
    const addText = () => {
      if (!text) return;
      if (!this.text) {
        this.text = document.createTextNode("");
        out.append(el("p", { class: "assistant" }, this.text));
      }
      this.text.appendData(text);
      text = "";
    };
    const addCard = (event) => {
      addText();
      this.text = null; // text after a card starts a new paragraph
      out.append(card(event));
    };
    for (const event of this.queue) {
      const data = event.data || {};
      if (event.type === "message") {
        if (data.role !== "assistant") continue; // other roles' messages are in the log
        const piece = typeof data.text === "string" ? data.text : "";
        if (data.delta === true) {
          text += piece;
          this.streamed = true;
        } else if (data.final === true && this.streamed) {
          this.streamed = false; // the whole of the pieces already shown
        } else {
          text += piece;
        }
      } else if (event.type === "approval.requested") {
        addText();
        this.text = null;
        const approval = new ApprovalCard(this.record.sessionId, data);
        this.approvals.set(data.approvalId, approval);
        out.append(approval.node);
      } else if (event.type === "approval.resolved" && this.approvals.has(data.approvalId)) {
        this.approvals.get(data.approvalId).resolved(data);
      } else if (event.type === "session.ended") {
        this.ended = data.reason || "ended";
        if (data.message && this.ended !== "completed") addCard(event);
      } else if (event.type !== "session.started") {
        addCard(event);
      }
    }
    addText();
    this.reply.append(out);
    this.queue = [];
  }
}

function card(event) {
  const kind = event.type.split(".")[0];
  return el(
    "details",
    { class: `event-card ${kind}`, "data-type": event.type },
    el("summary", {}, summary(event)),
    el("pre", { class: "wrap" }, json(event.data ?? {})),
  );
}

// Follow a running turn from the event log until it ends: events after the
// last one shown (Last-Event-ID), again after a dropped connection.
// It returns when the stream ends (the turn is over) or signal aborts;
// onProblem(text) says a connection dropped (null: it is back).
export async function follow(view, sessionId, signal, onProblem) {
  const path = `/v1/sessions/${encodeURIComponent(sessionId)}/events?turn=${encodeURIComponent(view.record.id)}`;
  let delay = 500;
  while (!signal.aborted) {
    const headers = view.lastSeq > 0 ? { "Last-Event-ID": String(view.lastSeq) } : {};
    try {
      const response = await call("GET", path, { headers, signal });
      onProblem(null);
      for await (const frame of sseEvents(response)) {
        view.push(JSON.parse(frame.data));
        delay = 500;
      }
      return; // the turn is over: the log's stream ended
    } catch (error) {
      if (signal.aborted || error.name === "AbortError") return;
      if (error.status && error.status !== 503) throw error; // refused: not a dropped line
      view.node.dataset.reconnects = String(Number(view.node.dataset.reconnects || 0) + 1);
      onProblem(`The connection dropped; re-opening from event ${view.lastSeq}…`);
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, 5000);
    }
  }
}
