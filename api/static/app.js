// The inferq status page: polls GET /v1/status, draws small SVG charts, and submits playground jobs
// through the public API (POST /v1/models/{model}/jobs), following them over SSE (GET /v1/jobs/{id}/events).
// Plain JavaScript, no build step and nothing loaded from elsewhere.
"use strict";

const POLL_MS = 2000;
const DEPTH_POINTS = 150; // client-side queue-depth history: 5 minutes of polls
const TERMINAL = new Set(["finished", "failed", "canceled", "expired"]);
const KEY_STORE = "inferq.apiKey";
const cards = new Map(); // model name -> {root, depth: [], kind}
let apiKey = localStorage.getItem(KEY_STORE) || "";

function headers(extra) {
  const out = Object.assign({}, extra || {});
  if (apiKey) out["Authorization"] = "Bearer " + apiKey;
  return out;
}

function $(root, selector) { return root.querySelector(selector); }

function notice(text) {
  const el = document.getElementById("notice");
  el.textContent = text || "";
  el.hidden = !text;
}

function seconds(value) {
  if (value === null || value === undefined) return "–";
  if (value === 0) return "0 s";
  if (value < 0.001) return (value * 1e6).toFixed(0) + " µs";
  if (value < 1) return (value * 1000).toFixed(value < 0.01 ? 2 : 1) + " ms";
  return value.toFixed(2) + " s";
}

function pair(q) { return seconds(q.p50) + " / " + seconds(q.p95); }

// A line chart of one or more series (arrays of numbers or nulls) in a 240x60 SVG.
function chart(svg, series, classes) {
  const W = 240, H = 60, PAD = 4;
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const values = series.flat().filter((v) => v !== null && v !== undefined && isFinite(v));
  const max = values.length ? Math.max(...values) : 0;
  const ns = "http://www.w3.org/2000/svg";
  const label = document.createElementNS(ns, "text");
  label.setAttribute("x", "3");
  label.setAttribute("y", "9");
  label.textContent = values.length ? "max " + (max < 10 ? max.toPrecision(3) : Math.round(max)) : "no data yet";
  svg.appendChild(label);
  series.forEach((points, i) => {
    const n = points.length;
    if (n < 2) return;
    let d = "";
    points.forEach((v, j) => {
      if (v === null || v === undefined || !isFinite(v)) return;
      const x = PAD + (j * (W - 2 * PAD)) / (n - 1);
      const y = H - PAD - (max > 0 ? (v / max) * (H - 2 * PAD - 8) : 0);
      d += (d ? " L" : "M") + x.toFixed(1) + " " + y.toFixed(1);
    });
    if (!d) return;
    const path = document.createElementNS(ns, "path");
    path.setAttribute("d", d);
    path.setAttribute("fill", "none");
    path.setAttribute("stroke", classes[i] === "b" ? "#d9822b" : "#2f6fde");
    path.setAttribute("stroke-width", "1.5");
    svg.appendChild(path);
  });
}

function card(model) {
  let entry = cards.get(model.name);
  if (entry) return entry;
  const root = document.getElementById("model-card").content.firstElementChild.cloneNode(true);
  root.dataset.model = model.name;
  $(root, ".name").textContent = model.name;
  $(root, ".kind").textContent = model.input_kind + " input";
  entry = { root, depth: [], kind: model.input_kind, example: model.input_example };
  playground(entry, model.name);
  document.getElementById("models").appendChild(root);
  cards.set(model.name, entry);
  return entry;
}

function render(status) {
  const seen = new Set();
  for (const model of status.models) {
    seen.add(model.name);
    const entry = card(model);
    const root = entry.root;
    $(root, ".depth-interactive").textContent = model.queue_depth.interactive || 0;
    $(root, ".depth-bulk").textContent = model.queue_depth.bulk || 0;
    $(root, ".oldest").textContent = seconds(Math.max(...Object.values(model.oldest_age_s), 0));
    $(root, ".workers").textContent = (model.workers.busy || 0) + " / " + (model.workers.idle || 0);
    $(root, ".throughput").textContent = model.throughput_per_s.toFixed(model.throughput_per_s < 10 ? 2 : 0);
    $(root, ".batch").textContent = model.mean_batch_size === null ? "–" : model.mean_batch_size.toFixed(1);
    $(root, ".queued").textContent = pair(model.queued_s);
    $(root, ".inference").textContent = pair(model.inference_s);
    entry.depth.push((model.queue_depth.interactive || 0) + (model.queue_depth.bulk || 0));
    if (entry.depth.length > DEPTH_POINTS) entry.depth.shift();
    const s = model.series;
    chart($(root, ".chart-throughput"), [s.map((p) => p.throughput_per_s)], ["a"]);
    chart($(root, ".chart-latency"), [s.map((p) => p.queued_p95_s), s.map((p) => p.inference_p95_s)], ["a", "b"]);
    chart($(root, ".chart-batch"), [s.map((p) => p.mean_batch_size)], ["a"]);
    chart($(root, ".chart-depth"), [entry.depth], ["a"]);
    const list = $(root, ".failures");
    list.textContent = "";
    for (const failure of model.failures) {
      const li = document.createElement("li");
      const reason = document.createElement("b");
      reason.textContent = failure.reason;
      li.append(new Date(failure.at * 1000).toLocaleTimeString() + " ", reason, " " + failure.error);
      list.appendChild(li);
    }
    $(root, ".failure-count").textContent = model.failures.length;
    const rolled = $(root, ".rolled-back");
    rolled.hidden = !model.rolled_back;
    rolled.textContent = model.rolled_back ? "rolled back: " + model.rolled_back : "";
    const draining = $(root, ".draining");
    draining.hidden = !model.draining;
    draining.textContent = model.draining ? "draining: removed from the repository, it serves its queued jobs, then stops" : "";
  }
  for (const [name, entry] of cards) {
    if (!seen.has(name)) { entry.root.remove(); cards.delete(name); }
  }
  renderTenants(status.tenants || []);
  const workers = status.models.reduce((n, m) => n + (m.workers.busy || 0) + (m.workers.idle || 0), 0);
  document.getElementById("summary").textContent =
    status.models.length + " model(s) · " + workers + " worker slot(s) · durability " + status.durability +
    " · updated " + new Date(status.generated_at * 1000).toLocaleTimeString();
}

function quotaText(use) {
  const parts = [];
  if (use.jobs_per_minute) parts.push("jobs/min " + use.jobs_per_minute.used + " of " + use.jobs_per_minute.limit);
  if (use.in_flight) parts.push("in flight " + use.in_flight.used + " of " + use.in_flight.limit);
  if (use.bulk_lines) parts.push("bulk lines " + use.bulk_lines.used + " of " + use.bulk_lines.limit);
  return parts.join(" · ") || "none set";
}

function renderTenants(tenants) {
  const box = document.getElementById("tenants");
  box.hidden = tenants.length === 0;
  const body = box.querySelector("tbody");
  body.textContent = "";
  for (const tenant of tenants) {
    const row = document.createElement("tr");
    const cells = [
      tenant.name,
      String(tenant.weight),
      tenant.share === null ? "–" : (100 * tenant.share).toFixed(1) + " %",
      tenant.throughput_per_s.toFixed(tenant.throughput_per_s < 10 ? 2 : 0),
      (tenant.ended_total.finished || 0) + " / " + (tenant.ended_total.failed || 0),
      String(Math.round(tenant.in_flight)),
      quotaText(tenant.use),
    ];
    for (const text of cells) {
      const cell = document.createElement("td");
      cell.textContent = text;
      row.appendChild(cell);
    }
    body.appendChild(row);
  }
}

function clearModels() {
  for (const entry of cards.values()) entry.root.remove();
  cards.clear();
}

async function poll() {
  try {
    const answer = await fetch("/v1/status", { headers: headers() });
    if (answer.status === 401) {
      clearModels();
      document.getElementById("summary").textContent = "locked";
      notice("This API needs a key (INFERQ_API_KEYS): enter one above to see the status and use the playground.");
      return;
    }
    if (!answer.ok) throw new Error("GET /v1/status answered " + answer.status);
    notice("");
    render(await answer.json());
  } catch (err) {
    notice("Cannot read the status: " + err.message);
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

// -- the playground --------------------------------------------------------------------------
function playground(entry, model) {
  const form = $(entry.root, ".playground");
  const area = $(form, ".input-area");
  if (entry.kind === "image") {
    const input = document.createElement("input");
    input.type = "file";
    input.accept = "image/*";
    input.name = "file";
    area.appendChild(input);
  } else {
    const text = document.createElement("textarea");
    text.name = "inputs";
    // The model's own example (its input kind builds it: zeros of a tensor's shape, an object a json schema takes).
    const example = entry.example === null || entry.example === undefined ? "" : ", e.g. " + JSON.stringify(entry.example);
    text.placeholder = entry.kind === "text" ? "Type a text" : "JSON for \"inputs\"" + example;
    area.appendChild(text);
  }
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    submit(entry, model, form).catch((err) => step(form, "error", err.message));
  });
}

function step(form, status, detail) {
  const timeline = $(form, ".timeline");
  const last = timeline.lastElementChild;
  if (last && last.dataset.status === status) return;
  const li = document.createElement("li");
  li.dataset.status = status;
  li.className = status;
  li.textContent = status;
  if (detail) li.title = detail;
  timeline.appendChild(li);
  if (status === "error") showOutput(form, { error: detail });
}

async function submit(entry, model, form) {
  $(form, ".timeline").textContent = "";
  $(form, ".job-output").textContent = "";
  let init;
  if (entry.kind === "image") {
    const file = $(form, "input[type=file]").files[0];
    if (!file) throw new Error("choose an image first");
    const body = new FormData();
    body.append("file", file);
    init = { method: "POST", headers: headers(), body };
  } else {
    const raw = $(form, "textarea").value;
    let inputs = raw;
    if (entry.kind !== "text") {
      try { inputs = JSON.parse(raw); } catch (err) { throw new Error("not valid JSON: " + err.message); }
    }
    init = { method: "POST", headers: headers({ "Content-Type": "application/json" }), body: JSON.stringify({ inputs }) };
  }
  const answer = await fetch("/v1/models/" + encodeURIComponent(model) + "/jobs", init);
  const job = await answer.json();
  if (!answer.ok) throw new Error((job.error && job.error.message) || "submit answered " + answer.status);
  step(form, job.status);
  await follow(form, job.id);
}

// SSE over fetch (EventSource cannot send the Authorization header); polling if the stream breaks.
async function follow(form, id) {
  const url = "/v1/jobs/" + encodeURIComponent(id);
  try {
    const answer = await fetch(url + "/events", { headers: headers({ Accept: "text/event-stream" }) });
    if (!answer.ok || !answer.body) throw new Error("events answered " + answer.status);
    const reader = answer.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5)).join("\n");
        if (!data) continue;
        const view = JSON.parse(data);
        step(form, view.status);
        if (TERMINAL.has(view.status)) { showOutput(form, view); reader.cancel(); return; }
      }
    }
  } catch (err) {
    // fall through to polling
  }
  for (;;) {
    const answer = await fetch(url + "?wait=10", { headers: headers() });
    const view = await answer.json();
    if (!answer.ok) throw new Error((view.error && view.error.message) || "GET answered " + answer.status);
    step(form, view.status);
    if (TERMINAL.has(view.status)) { showOutput(form, view); return; }
  }
}

function showOutput(form, view) {
  const out = $(form, ".job-output");
  out.textContent = "";
  if (view.result && view.result.label !== undefined) {
    const label = document.createElement("div");
    label.className = "job-result-label";
    label.textContent = view.result.label;
    out.appendChild(label);
  }
  if (view.batch_size) {
    const meta = document.createElement("div");
    meta.className = "muted";
    const t = view.timings_ms || {};
    meta.textContent = "batch of " + view.batch_size + " · queued " + (t.queue_ms || 0).toFixed(1) +
      " ms · inference " + (t.inference_ms || 0).toFixed(1) + " ms";
    out.appendChild(meta);
  }
  const pre = document.createElement("pre");
  pre.textContent = JSON.stringify(view.result !== undefined && view.result !== null ? view.result : view.error || view, null, 2);
  out.appendChild(pre);
}

// -- the key -----------------------------------------------------------------------------------
document.getElementById("api-key").value = apiKey;
document.getElementById("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  apiKey = document.getElementById("api-key").value.trim();
  if (apiKey) localStorage.setItem(KEY_STORE, apiKey); else localStorage.removeItem(KEY_STORE);
  clearModels();
});
document.getElementById("key-forget").addEventListener("click", () => {
  apiKey = "";
  localStorage.removeItem(KEY_STORE);
  document.getElementById("api-key").value = "";
  clearModels();
});
poll();
