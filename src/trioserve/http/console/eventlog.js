// The event log of a session: every event (seq, time, type, turn), a type
// filter, raw JSON, a JSONL download (the export, GET …/events?format=json),
// and the turn records.

import { getJSON } from "./api.js";
import { $, clear, duration, el, json, time } from "./ui.js";

// At most this many rows are drawn (the newest); the download has them all.
const MAX_ROWS = 2000;

export class EventLog {
  constructor() {
    this.events = [];
    this.turns = [];
    this.sessionId = null;
    $("log-type").addEventListener("change", () => this.draw());
    $("log-raw").addEventListener("change", () => this.draw());
  }

  async load(sessionId) {
    this.sessionId = sessionId;
    const base = `/v1/sessions/${encodeURIComponent(sessionId)}`;
    const [turns, events] = await Promise.all([
      getJSON(`${base}/turns`),
      getJSON(`${base}/events?format=json`),
    ]);
    if (this.sessionId !== sessionId) return;
    this.turns = turns;
    this.events = events;
    this.drawTypes();
    this.drawTurns();
    this.draw();
  }

  turnOf(seq) {
    for (const turn of this.turns) {
      if (turn.firstSeq !== null && seq >= turn.firstSeq && (turn.lastSeq === null || seq <= turn.lastSeq)) {
        return turn.id;
      }
    }
    return "";
  }

  drawTypes() {
    const select = $("log-type");
    const chosen = select.value;
    const types = [...new Set(this.events.map((e) => e.type))].sort();
    select.replaceChildren(el("option", { value: "" }, "all types"), ...types.map((t) => el("option", { value: t }, t)));
    select.value = types.includes(chosen) ? chosen : "";
  }

  drawTurns() {
    const body = $("turn-records").tBodies[0];
    clear(body);
    for (const turn of this.turns) {
      const count = turn.firstSeq === null ? 0 : (turn.lastSeq ?? turn.firstSeq) - turn.firstSeq + 1;
      body.append(
        el(
          "tr",
          { "data-turn": turn.id },
          el("td", {}, el("code", {}, turn.id)),
          el("td", {}, turn.status),
          el("td", {}, turn.reason ?? ""),
          el("td", {}, duration(turn.startedAt, turn.endedAt)),
          el("td", {}, String(count)),
          el("td", {}, turn.input),
        ),
      );
    }
  }

  draw() {
    const type = $("log-type").value;
    const raw = $("log-raw").checked;
    const shown = this.events.filter((e) => !type || e.type === type);
    const rows = shown.slice(-MAX_ROWS).map((event) =>
      el(
        "tr",
        { "data-seq": event.seq, "data-type": event.type },
        el("td", {}, String(event.seq)),
        el("td", {}, time(event.ts)),
        el("td", {}, event.type),
        el("td", {}, el("code", {}, this.turnOf(event.seq))),
        el("td", {}, el("pre", { class: raw ? "wrap" : "line" }, raw ? json(event) : JSON.stringify(event.data ?? {}))),
      ),
    );
    $("log-table").tBodies[0].replaceChildren(...rows);
    const hidden = shown.length - rows.length;
    $("log-count").textContent = `${shown.length} of ${this.events.length} events${hidden ? ` (the newest ${rows.length} shown)` : ""}`;
  }

  // The whole log as JSON Lines, saved by the browser.
  download() {
    const lines = this.events.map((e) => JSON.stringify(e)).join("\n");
    const blob = new Blob([lines ? `${lines}\n` : ""], { type: "application/x-ndjson" });
    const url = URL.createObjectURL(blob);
    const link = el("a", { href: url, download: `${this.sessionId}.jsonl` });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  }
}
