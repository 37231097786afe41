// The server panel: /readyz (ready or draining, turns running against the cap,
// warm adapters) and /healthz.
// Both are open routes: no key needed.

import { $ } from "./ui.js";

const EVERY_MS = 5000;

export class ServerPanel {
  start() {
    this.refresh();
    setInterval(() => this.refresh(), EVERY_MS);
  }

  async refresh() {
    const status = $("server-status");
    const detail = $("server-detail");
    try {
      const health = await fetch("/healthz", { cache: "no-store" });
      const ready = await fetch("/readyz", { cache: "no-store", headers: { Accept: "application/json" } });
      const body = await ready.json();
      status.textContent = health.ok ? body.status : "unhealthy";
      status.dataset.status = body.status;
      const warm = body.warmAdapters;
      const parts = [];
      if (body.turns) {
        const cap = body.turns.max ? ` of ${body.turns.max}` : "";
        parts.push(`turns running ${body.turns.running}${cap}`);
      }
      if (warm.target) {
        parts.push(`warm adapters ${warm.ready}/${warm.target} ready`);
        if (warm.loading) parts.push(`${warm.loading} loading`);
        if (warm.paused) parts.push(`${warm.paused} paused`);
        if (warm.loadMs !== null) parts.push(`loads in ${warm.loadMs} ms`);
      } else {
        parts.push("no warm adapters");
      }
      detail.textContent = parts.join(", ");
    } catch {
      status.textContent = "unreachable";
      status.dataset.status = "unreachable";
      detail.textContent = "";
    }
  }
}
