// The operator dashboard: polls /v1/dashboard (admin key) every 2 s and
// draws the fleet: live workers with their slots and warm sandboxes, the
// queue depth, recent jobs, and two small plots the server samples from the
// figures its /metrics shows.

import "./style.css";
import { KeyForm, api, show } from "./common.js";

const REFRESH_MS = 2000;
const $ = (id) => document.getElementById(id);
const ui = {
  board: $("board"),
  error: $("error"),
  updated: $("updated"),
};
let timer = null;

const keys = new KeyForm({
  slot: "code-runner.admin-key",
  setText: "Admin key set for this tab.",
  missingText: "Enter an API key that has the admin scope.",
  showError: (text) => show(ui.error, text),
  onSaved: () => refresh(),
});

function askForKey(message) {
  clearTimeout(timer);
  ui.board.hidden = true;
  keys.ask(message);
  document.body.dataset.ready = "true";
}

/** A cell with text (never HTML: every value comes from the server). */
function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  row.append(td);
  return td;
}

function ago(iso, now) {
  if (!iso) return "—";
  const seconds = Math.max(0, Math.round((now - Date.parse(iso)) / 1000));
  if (seconds < 60) return `${seconds} s ago`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
  return `${Math.floor(seconds / 3600)} h ago`;
}

function took(job, now) {
  if (!job.started_at) return "—";
  const end = job.finished_at ? Date.parse(job.finished_at) : now;
  const ms = Math.max(0, end - Date.parse(job.started_at));
  return job.finished_at ? `${ms} ms` : `${(ms / 1000).toFixed(0)} s so far`;
}

function warmText(warm, memoryHeld) {
  if (!warm || typeof warm !== "object" || Object.keys(warm).length === 0) return "—";
  const pools = Object.entries(warm)
    .map(([language, pool]) => `${language} ${pool?.ready ?? "?"}/${pool?.target ?? "?"}`)
    .join(", ");
  return memoryHeld === true ? `${pools} · waiting for memory` : pools;
}

function warmReady(workers) {
  let total = 0;
  let any = false;
  for (const worker of workers) {
    for (const pool of Object.values(worker.warm || {})) {
      if (typeof pool?.ready === "number") {
        total += pool.ready;
        any = true;
      }
    }
  }
  return any ? String(total) : "—";
}

/** A sparkline of `values` (nulls are gaps) into an SVG of 300×90; returns
 * the top of its scale. */
function plot(svg, values) {
  const points = values.map((v, i) => [i, v]).filter(([, v]) => typeof v === "number");
  const max = Math.max(1, ...points.map(([, v]) => v));
  const n = Math.max(values.length - 1, 1);
  const x = (i) => (i / n) * 300;
  const y = (v) => 86 - (v / max) * 80;
  const line = points.map(([i, v]) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
  svg.innerHTML = "";
  const ns = "http://www.w3.org/2000/svg";
  const grid = document.createElementNS(ns, "line");
  Object.entries({ x1: 0, x2: 300, y1: 86, y2: 86, stroke: "#d9dee5", "stroke-width": 1 }).forEach(([k, v]) => grid.setAttribute(k, v));
  svg.append(grid);
  if (points.length > 1) {
    const path = document.createElementNS(ns, "polyline");
    Object.entries({ points: line, fill: "none", stroke: "#2457c5", "stroke-width": 2, "vector-effect": "non-scaling-stroke" }).forEach(([k, v]) => path.setAttribute(k, v));
    svg.append(path);
  } else if (points.length === 1) {
    // One sample so far: a mark where the line will start.
    const [[i, v]] = points;
    const dot = document.createElementNS(ns, "rect");
    Object.entries({ x: x(i) - 2, y: y(v) - 2, width: 4, height: 4, fill: "#2457c5" }).forEach(([k, a]) => dot.setAttribute(k, a));
    svg.append(dot);
  }
  return Number.isInteger(max) ? String(max) : max.toFixed(2);
}

function render(data) {
  const now = Date.parse(data.generated_at) || Date.now();
  ui.updated.textContent = `updated ${new Date(now).toLocaleTimeString()}`;
  $("t-queue").textContent = String(data.queue_depth);
  $("t-workers").textContent = String(data.workers.length);
  const used = data.workers.reduce((s, w) => s + (w.slots_used || 0), 0);
  const max = data.workers.reduce((s, w) => s + (w.slots_max || 0), 0);
  $("t-slots").textContent = `${used} / ${max}`;
  $("t-warm").textContent = warmReady(data.workers);

  const workers = $("workers").tBodies[0];
  workers.textContent = "";
  for (const worker of data.workers) {
    const row = workers.insertRow();
    row.dataset.worker = worker.id;
    cell(row, worker.id).classList.add("mono");
    const slots = cell(row, "", "num");
    const bar = document.createElement("span");
    bar.className = "slots";
    const fill = document.createElement("span");
    fill.style.width = `${worker.slots_max ? Math.min(100, (100 * worker.slots_used) / worker.slots_max) : 0}%`;
    bar.append(fill);
    slots.append(bar, document.createTextNode(`${worker.slots_used ?? "?"} / ${worker.slots_max ?? "?"}`));
    const warm = cell(row, warmText(worker.warm, worker.warm_memory_held));
    if (worker.warm_memory_held === true) {
      warm.classList.add("held");
      warm.title = "The worker starts no warm sandbox: its machine has less memory available than CODE_RUNNER_WARM_MEMORY_RESERVE_MB.";
    }
    cell(row, worker.version || "—");
    cell(row, ago(worker.started_at, now));
  }
  if (!data.workers.length) {
    const row = workers.insertRow();
    cell(row, "no live worker: jobs wait in the queue until one starts").colSpan = 5;
  }

  $("t-tenants").textContent = `${data.tenants_waiting} key${data.tenants_waiting === 1 ? "" : "s"} taking turns`;
  const waiting = $("waiting").tBodies[0];
  waiting.textContent = "";
  for (const tenant of data.waiting) {
    const row = waiting.insertRow();
    cell(row, tenant.api_key);
    cell(row, tenant.user ?? "(anonymous)").classList.add("mono");
    cell(row, String(tenant.queued), "num");
  }
  if (!data.waiting.length) {
    cell(waiting.insertRow(), "nothing waits").colSpan = 3;
  }

  const jobs = $("jobs").tBodies[0];
  jobs.textContent = "";
  for (const job of data.recent_jobs) {
    const row = jobs.insertRow();
    row.dataset.job = job.id;
    const id = cell(row, "");
    const code = document.createElement("code");
    code.textContent = job.id;
    id.append(code);
    const status = cell(row, "");
    const badge = document.createElement("span");
    badge.className = "status-badge";
    badge.dataset.status = job.status;
    badge.textContent = job.status.replace("_", " ");
    status.append(badge);
    cell(row, job.language);
    cell(row, job.api_key);
    cell(row, job.worker || "—");
    cell(row, ago(job.created_at, now));
    cell(row, took(job, now), "num");
  }
  if (!data.recent_jobs.length) {
    const row = jobs.insertRow();
    cell(row, "no jobs yet").colSpan = 7;
  }

  const history = data.history;
  const span = Math.round(((history.samples.length - 1) * history.interval_ms) / 60000);
  const spanText = history.samples.length > 1 ? `${span < 1 ? "<1" : span} min ago` : "sampling started";
  const queueTop = plot($("p-queue"), history.samples.map((s) => s.queue_depth));
  $("p-queue-span").textContent = `${spanText} · top of scale ${queueTop}`;
  $("p-queue-now").textContent = `now ${data.queue_depth}`;
  if (history.jobs_counted) {
    const rates = history.samples.map((s) => s.jobs_per_s);
    const rateTop = plot($("p-rate"), rates);
    $("p-rate-span").textContent = `${spanText} · top of scale ${rateTop}`;
    const last = rates.filter((r) => typeof r === "number").pop();
    $("p-rate-now").textContent = last === undefined ? "" : `now ${last.toFixed(2)}`;
    $("p-rate-scope").textContent = "now (this server's worker)";
  } else {
    plot($("p-rate"), []);
    $("p-rate-now").textContent = "";
    $("p-rate-scope").textContent = "no worker in this process: see each worker's /metrics";
    $("p-rate-span").textContent = spanText;
  }
  ui.board.hidden = false;
  document.body.dataset.ready = "true";
}

async function refresh() {
  clearTimeout(timer);
  const key = keys.get();
  if (!key) {
    askForKey("");
    return;
  }
  try {
    render(await api("/v1/dashboard", { key }));
    show(ui.error, "");
  } catch (error) {
    if (error.code === "unauthorized") {
      askForKey(error.message);
      return;
    }
    if (error.code === "forbidden") {
      askForKey("This key has no admin scope: the dashboard needs a key configured as name:key:admin.");
      return;
    }
    show(ui.error, `The dashboard cannot be updated: ${error.message}`);
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

keys.render();
refresh();
