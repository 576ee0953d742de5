// The daemon's web page (docs/web.md): reads /api/v1/* and redraws when
// /api/v1/events says a status commit was made or read. Read only: what to
// do is shown as the command that commits it.
"use strict";

// What a person can do about a hold, by reason: the verbs, in order.
const ACTIONS = {
  operator_paused: ["resume"],
  pause_after_batch: ["resume", "abort"],
  health_failed: ["resume", "skip", "abort"],
  health_unknown: ["resume", "skip", "abort"],
  retry_exhausted: ["resume", "skip", "abort"],
  stopped: ["resume", "abort"],
  rollback_pending: ["abort"],
  rolled_back: ["resume", "abort"],
  rollback_failed: ["backups", "resume", "abort"],
  rollback_unavailable: ["resume", "skip", "abort"],
  dispatch_refused: ["resume", "skip", "abort"],
  failure_budget_exceeded: ["resume", "abort"],
};

function command(verb, name, hold) {
  const nodes = (hold.nodes || []).join(" ");
  switch (verb) {
    case "resume":
      return {
        text: `reconciler resume ${name} --push`,
        why: hold.reason === "operator_paused"
          ? "lift the pause (spec.paused: false)"
          : "answer the hold with a new resumeRequest",
      };
    case "skip":
      return { text: `reconciler skip ${name} ${nodes} --push`, why: "give up on the held nodes" };
    case "abort":
      return { text: `reconciler abort ${name} --push`, why: "end the rollout for good" };
    case "backups":
      return {
        text: `reconciler backups ${(hold.nodes || ["NODE"])[0]}`,
        why: "list the node's backups first",
      };
  }
  return null;
}

const $ = (id) => document.getElementById(id);
let selected = null; // the rollout shown in full, from location.hash

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) {
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
  }
  return node;
}

function cell(label, ...children) {
  return el("td", { "data-label": label }, ...children);
}

function badge(kind, value) {
  return el("span", { class: `${kind} ${kind}-${value}`, text: value });
}

function progressOf(progress) {
  const total = Object.values(progress || {}).reduce((a, b) => a + b, 0);
  const parts = Object.entries(progress || {}).filter(([, n]) => n > 0);
  const words = parts.map(([state, n]) => `${n} ${state.replace("_", " ")}`).join(", ");
  const bar = el("div", { class: "bar", "aria-hidden": "true" });
  for (const [state, n] of parts) {
    if (state === "pending") continue;
    const span = el("span", { class: `fill-${state}` });
    span.style.width = `${(100 * n) / total}%`;
    bar.append(span);
  }
  const done = (progress && progress.succeeded) || 0;
  return el("div", {}, el("span", { text: `${done} of ${total} succeeded` }),
    el("span", { class: "visually-hidden", text: words ? ` (${words})` : "" }), bar);
}

function when(text) {
  return text ? text.replace("T", " ").replace("Z", " UTC") : "—";
}

function target(t) {
  return t ? `${t.runtime}: ${t.provider}/${t.model}/${t.profile}` : "—";
}

async function getJson(url) {
  const answer = await fetch(url, { cache: "no-store", headers: { Accept: "application/json" } });
  if (!answer.ok) {
    const error = new Error(`${url}: ${answer.status}`);
    error.status = answer.status;
    throw error;
  }
  return { data: await answer.json(), commit: answer.headers.get("X-Status-Commit"),
    nodes: answer.headers.get("X-Node-Count") };
}

// -- the table of rollouts ------------------------------------------------------

function drawRollouts(rollouts) {
  const body = $("rollout-table").tBodies[0];
  const rows = rollouts.map((r) => {
    const link = el("a", { href: `#rollout=${encodeURIComponent(r.name)}`, text: r.name });
    const hold = r.hold ? el("span", {}, badge("state", r.hold.reason), " ",
      el("span", { class: "visually-hidden", text: r.hold.message })) : "—";
    const waiting = r.waiting ? `${r.waiting.reason}${r.waiting.until ? " until " + when(r.waiting.until) : ""}` : "—";
    return el("tr", { "data-rollout": r.name },
      cell("Rollout", link), cell("Phase", badge("phase", r.phase)),
      cell("Progress", progressOf(r.progress)), cell("Hold", hold), cell("Waiting", waiting),
      cell("Target", target(r.target)), cell("Updated", when(r.updatedAt)));
  });
  body.replaceChildren(...rows);
  $("no-rollouts").hidden = rollouts.length > 0;
}

// -- one rollout ----------------------------------------------------------------

function drawHold(status) {
  const hold = status.hold;
  $("hold").hidden = !hold;
  if (!hold) return;
  $("hold-message").replaceChildren(badge("state", hold.reason), " ", hold.message);
  const verbs = ACTIONS[hold.reason] || ["resume", "abort"];
  const items = verbs.map((verb) => command(verb, status.metadata.name, hold)).filter(Boolean)
    .map((c) => el("li", {}, el("code", { text: c.text }), ` — ${c.why}`));
  $("hold-actions").replaceChildren(...items);
}

function checkList(checks) {
  if (!checks || !checks.length) return "—";
  return el("ul", { class: "checks" }, ...checks.map((c) => {
    const extra = [];
    if (c.canary) extra.push(`canary ${JSON.stringify(c.canary)}`);
    if (c.baseline) extra.push(`baseline ${JSON.stringify(c.baseline)}`);
    if (c.change !== undefined) extra.push(`change ${c.change}`);
    if (c.pValue !== undefined) extra.push(`p ${c.pValue}`);
    return el("li", { class: c.ok ? "check-ok" : "check-failed" },
      `${c.name}: ${c.ok ? "ok" : "failed"}`, c.detail ? ` — ${c.detail}` : "",
      extra.length ? ` (${extra.join("; ")})` : "");
  }));
}

function evidence(node) {
  if (node.evidence) return el("span", { class: "mark mark-signed", text: "signed" });
  if (node.verdict) return el("span", { class: "mark mark-unsigned", text: "unsigned" });
  return "—";
}

function drawDetail(status, total) {
  const name = status.metadata.name;
  $("detail-title").textContent = `Rollout ${name}`;
  const facts = [["Phase", badge("phase", status.phase)], ["Why", status.message || status.reason || "—"],
    ["Target", target(status.frozen && status.frozen.target)],
    ["Mode", status.frozen ? (status.frozen.live ? "live" : "dry-run") : "—"],
    ["On failure", status.frozen ? status.frozen.onFailure : "—"],
    ["Spec commit", el("code", { text: (status.specCommit || "—").slice(0, 12) })],
    ["Started", when(status.startedAt)], ["Finished", when(status.finishedAt)]];
  if (status.waiting) facts.push(["Waiting", `${status.waiting.reason} until ${when(status.waiting.until)}`]);
  $("facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", {}, v)]));
  drawHold(status);
  $("batches").replaceChildren(...(status.batches.length ? status.batches.map((b) =>
    el("li", { class: `batch-${b.state}` }, `batch ${b.index}: ${b.state}`)) :
    [el("li", { text: "no batches yet" })]));
  const held = new Set((status.hold && status.hold.nodes) || []);
  const rows = (status.nodes || []).map((n) => el("tr", { "data-node": n.name },
    cell("Node", n.name, held.has(n.name) ? " (held)" : ""), cell("Batch", String(n.batch)),
    cell("State", badge("state", n.state)), cell("Attempt", String(n.attempt)),
    cell("Error", n.error || "—"), cell("Checks", checkList(n.checks)),
    cell("Evidence", evidence(n)),
    cell("Out of service", n.outOfService !== undefined && n.outOfService !== null ? `${n.outOfService} s` : "—"),
    cell("Signed by", n.signature ? `${n.signature.signer} (signature ${n.signature.sha256.slice(0, 12)})` : "—")));
  $("node-table").tBodies[0].replaceChildren(...rows);
  const shown = (status.nodes || []).length;
  $("more-nodes").hidden = !(total && Number(total) > shown);
  $("more-nodes").textContent = `Showing the first ${shown} of ${total} nodes (the API pages them: ?offset=&limit=).`;
}

// -- the fleet ------------------------------------------------------------------

function drawFleet(fleet) {
  const table = $("fleet-table");
  if (!fleet || !fleet.nodes) {
    $("fleet-counts").textContent = "No fleet status yet (the daemon writes it after its first sweep).";
    table.hidden = true;
    return;
  }
  const counts = fleet.counts || {};
  $("fleet-counts").textContent = Object.entries(counts).map(([s, n]) => `${n} ${s}`).join(", ");
  const bad = fleet.nodes.filter((n) => n.state !== "ok");
  const rows = bad.map((n) => {
    const runs = n.runtimes.map((r) => `${r.type}: ${r.provider ? `${r.provider}/${r.model}/${r.profile}` : "(not reported)"}`).join("; ");
    const should = n.runtimes.map((r) => r.desired ? `${r.type}: ${r.desired.provider}/${r.desired.model}/${r.desired.profile} (${r.desired.rollout})` : `${r.type}: —`).join("; ");
    return el("tr", { "data-node": n.name }, cell("Node", n.name), cell("State", badge("state", n.state)),
      cell("Since", when(n.since)), cell("Runs", runs || "—"), cell("Should run", should || "—"));
  });
  table.tBodies[0].replaceChildren(...rows);
  table.hidden = rows.length === 0;
}

// -- reading and redrawing ------------------------------------------------------

async function refresh() {
  try {
    const list = await getJson("/api/v1/rollouts");
    drawRollouts(list.data);
    $("commit").textContent = `Status commit: ${list.commit || "none yet"}`;
    const fleet = await getJson("/api/v1/fleet");
    drawFleet(fleet.data);
    if (selected) {
      try {
        const one = await getJson(`/api/v1/rollouts/${encodeURIComponent(selected)}`);
        drawDetail(one.data, one.nodes);
        $("detail").hidden = false;
      } catch (error) {
        if (error.status !== 404) throw error;
        $("detail").hidden = true;
      }
    } else {
      $("detail").hidden = true;
    }
  } catch (error) {
    if (error.status === 503) setTimeout(refresh, 1000); // the daemon's first read is coming
  }
}

let pending = null;
function soon() {
  if (pending === null) pending = setTimeout(() => { pending = null; refresh(); }, 50);
}

function choose() {
  const match = /^#rollout=(.+)$/.exec(location.hash);
  selected = match ? decodeURIComponent(match[1]) : null;
  refresh().then(() => { if (selected) $("detail").focus(); });
}

function listen() {
  const events = new EventSource("/api/v1/events");
  const live = $("live");
  events.onopen = () => { live.textContent = "Live: updates as status commits arrive."; live.className = "live"; soon(); };
  events.onerror = () => { live.textContent = "Disconnected: reconnecting…"; live.className = "down"; };
  for (const kind of ["commit", "transition", "fleet"]) events.addEventListener(kind, soon);
}

window.addEventListener("hashchange", choose);
document.addEventListener("DOMContentLoaded", () => { choose(); listen(); });
