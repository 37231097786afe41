// A tool call that waits for a person (docs/api.md, "Approvals"): the call's
// tool and arguments, with Approve / Deny buttons that POST the decision.
// The card follows the turn's log: approval.requested makes it, and
// approval.resolved (whoever decided: this page, another client, the expiry)
// says how it was decided and takes the buttons away.

import { ApiError, describe, sendJSON } from "./api.js";
import { el, json } from "./ui.js";

export class ApprovalCard {
  constructor(sessionId, data) {
    this.path = `/v1/sessions/${encodeURIComponent(sessionId)}/approvals/${encodeURIComponent(data.approvalId)}`;
    this.state = el("p", { class: "approval-state", "aria-live": "polite" }, "Waiting for a decision.");
    this.approve = el("button", { type: "button", onclick: () => this.decide("approve") }, "Approve");
    this.deny = el("button", { type: "button", onclick: () => this.decide("deny") }, "Deny");
    this.buttons = el("div", { class: "row" }, this.approve, this.deny);
    this.node = el(
      "section",
      { class: "approval", "data-approval": data.approvalId, "data-state": "pending", "aria-label": `Approval of ${data.tool}` },
      el("p", {}, "The agent asks to call ", el("code", { class: "approval-tool" }, String(data.tool ?? "")), ":"),
      el("pre", { class: "wrap approval-arguments" }, json(data.arguments ?? null)),
      this.buttons,
      this.state,
    );
  }

  async decide(decision) {
    this.approve.disabled = this.deny.disabled = true;
    this.state.textContent = decision === "approve" ? "Approving…" : "Denying…";
    try {
      await sendJSON("POST", this.path, { decision });
    } catch (error) {
      this.state.textContent = error instanceof ApiError && error.reason === "approval_decided"
        ? "It was decided already (elsewhere)."
        : describe(error);
      this.approve.disabled = this.deny.disabled = false;
    }
  }

  // approval.resolved's data: how it was decided, and by whom.
  resolved(data) {
    const approved = data.decision === "approve";
    const why = data.reason ? ` (${data.reason})` : "";
    const who = data.decidedBy ? ` by ${data.decidedBy}` : "";
    this.buttons.remove();
    this.node.dataset.state = approved ? "approved" : "denied";
    this.state.textContent = `${approved ? "Approved" : "Denied"}${why}${who}.`;
  }
}
